package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/redistest"
)

// TestKeySlot: keySlot agrees with the Redis Cluster specification's
// examples (hash tags included) and, on a real Cluster, with CLUSTER
// KEYSLOT for the store's own key names; exec refuses, with
// errClientChanged and without a panic, a script call whose keys were
// chosen for a standalone Redis when its client is a Cluster's (the
// moment a store that started without Redis swaps its client), and runs
// one whose keys share a slot.
func TestKeySlot(t *testing.T) {
	for key, want := range map[string]uint16{
		"123456789":            12739, // the specification's CRC16 check value, 0x31C3
		"foo":                  12182,
		"{user1000}.following": keySlot("user1000"),
		"foo{}{bar}":           keySlot("foo{}{bar}"), // an empty tag: the whole key
		"foo{bar}{zap}":        keySlot("bar"),
		"foo{{bar}}zap":        keySlot("{bar"),
	} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d; want %d", key, got, want)
		}
	}
	if keySlot("foo{}{bar}") == keySlot("bar") {
		t.Error(`keySlot("foo{}{bar}") hashed "bar"; an empty first tag hashes the whole key`)
	}

	c := redistest.StartCluster(t, 3)
	r := newRedis(t, "", "slots", func(cfg *Config) { cfg.URL = c.URL() })
	keys := append(r.keys(cache.Scope{Tenant: "t", Key: "k"}).all, r.globalKeys()...)
	for i := range 50 {
		keys = append(keys, "k"+strconv.Itoa(i), fmt.Sprintf("x{tag%d}y", i))
	}
	for _, k := range keys {
		out, err := redistest.Command(c.Addrs()[0], time.Second, "CLUSTER", "KEYSLOT", k)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := strconv.Atoi(strings.TrimSpace(out)); keySlot(k) != uint16(want) {
			t.Errorf("keySlot(%q) = %d; CLUSTER KEYSLOT says %d", k, keySlot(k), want)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cross := []string{"k1", "k2", "k3"} // three slots
	if fitsClient(r.c, cross) {
		t.Fatalf("keys %v fit a cluster client; want them in more than one slot", cross)
	}
	// A store that started without Redis holds its client in a
	// swapClient; this one now holds the Cluster's.
	swapped := newSwapClient(r.c)
	if err := exec(ctx, swapped, unknownScript, cross, nil).Error(); !errors.Is(err, errClientChanged) {
		t.Fatalf("exec across slots on a swapped-in Cluster client: got %v; want errClientChanged", err)
	}
	same := []string{"{t}a", "{t}b", "{t}c"}
	if err := exec(ctx, swapped, unknownScript, same, nil).Error(); err != nil {
		t.Fatalf("exec on one slot: got %v; want it run", err)
	}
}
