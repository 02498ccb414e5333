package redis

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/rueidis"
)

// A store that started while Redis was unreachable has a single-node
// client until Redis answers, then the client rueidis picks from the
// server (swapClient): a cluster client on a Redis Cluster. An operation
// that chose its keys for a standalone Redis (sharedKeys: a tenant's
// count beside the key's records, in other slots) may build its command
// after that swap, and rueidis's cluster builder panics on a command
// whose keys are in different slots. exec builds and sends on one client
// and refuses such a call with errClientChanged instead: the operation
// fails as one Redis did not answer does, and its caller's next one
// chooses its keys for the Cluster.

// errClientChanged answers a call whose keys were chosen for a standalone
// Redis and found a Cluster's client.
var errClientChanged = errors.New("redis: the client became a Redis Cluster's while the call was made; not sent")

// current is the client that serves calls now, and whether it may
// differ from the one the keys were chosen for: only a swapClient's can.
func current(c rueidis.Client) (now rueidis.Client, swapped bool) {
	if s, ok := c.(*swapClient); ok {
		return s.get(), true
	}
	return c, false
}

// exec runs s with keys and args as Lua.Exec does, on the client that
// serves now, unless that is a cluster client that replaced the one keys
// were chosen for and keys are in more than one slot (errClientChanged).
func exec(ctx context.Context, c rueidis.Client, s *rueidis.Lua, keys, args []string) rueidis.RedisResult {
	c, swapped := current(c)
	if swapped && !fitsClient(c, keys) {
		return rueidis.NewErrorResult(errClientChanged)
	}
	return s.Exec(ctx, c, keys, args)
}

// fitsClient reports whether a command with keys can be built for c: any
// keys on a standalone client, keys of one slot on a cluster client.
// Keys with the same hash tag (a scope's, a journal's) are compared as
// strings; the slots are computed only for keys whose tags differ.
func fitsClient(c rueidis.Client, keys []string) bool {
	if c.Mode() != rueidis.ClientModeCluster || len(keys) < 2 {
		return true
	}
	t := hashTag(keys[0])
	for _, k := range keys[1:] {
		if u := hashTag(k); u != t && keySlot(u) != keySlot(t) {
			return false
		}
	}
	return true
}

// hashTag is what a key's Redis Cluster slot is computed from: the part
// between its first "{" and the next "}" when that is not empty, or else
// the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// keySlot is a key's Redis Cluster hash slot: CRC16 (XMODEM) of its hash
// tag, modulo 16384.
func keySlot(key string) uint16 {
	var crc uint16
	for _, b := range []byte(hashTag(key)) {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^b]
	}
	return crc & 16383
}

// crc16Table is CRC16-XMODEM's (polynomial 0x1021) for a byte at a time.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
