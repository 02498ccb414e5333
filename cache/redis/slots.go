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

// current is the client that serves calls now: the one a swapClient
// holds, or c itself.
func current(c rueidis.Client) rueidis.Client {
	if s, ok := c.(*swapClient); ok {
		return s.get()
	}
	return c
}

// exec runs s with keys and args as Lua.Exec does, on the client that
// serves now, unless that is a cluster client and keys are in more than
// one slot (errClientChanged).
func exec(ctx context.Context, c rueidis.Client, s *rueidis.Lua, keys, args []string) rueidis.RedisResult {
	c = current(c)
	if !fitsClient(c, keys) {
		return rueidis.NewErrorResult(errClientChanged)
	}
	return s.Exec(ctx, c, keys, args)
}

// fitsClient reports whether a command with keys can be built for c: any
// keys on a standalone client, keys of one slot on a cluster client.
func fitsClient(c rueidis.Client, keys []string) bool {
	if c.Mode() != rueidis.ClientModeCluster || len(keys) < 2 {
		return true
	}
	s := keySlot(keys[0])
	for _, k := range keys[1:] {
		if keySlot(k) != s {
			return false
		}
	}
	return true
}

// keySlot is a key's Redis Cluster hash slot: CRC16 (XMODEM) of its hash
// tag, the part between the first "{" and the next "}" when that is not
// empty, or else of the whole key, modulo 16384.
func keySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}
