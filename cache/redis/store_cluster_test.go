package redis

import (
	"bytes"
	"fmt"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/redistest"
)

// TestRedisCluster: two stores on a 3-primary Redis Cluster, given every
// primary as a seed, claim, join and replay keys whose records land on
// different primaries, and a store renews the leases of keys on every
// primary; a URL with a database other than 0 is refused at start rather
// than retried forever.
//
// Neither cluster test is parallel: starting processes would slow the
// timing tests running beside them.
func TestRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	url := c.URL()
	rs := []*Store{
		newRedis(t, "", "ssg", func(cfg *Config) { cfg.URL = url }),
		newRedis(t, "", "ssg", func(cfg *Config) { cfg.URL = url }),
	}
	for i := range 20 {
		sc := cache.Scope{Tenant: "t", Key: fmt.Sprintf("cluster-%d", i)}
		b := rbegin(t, rs[0], sc, "fp")
		if b.Decision != cache.Miss {
			t.Fatalf("%s: got %v; want miss", sc.Key, b.Decision)
		}
		owner := b.Flight
		storetest.StartStream(t, owner)
		want := storetest.AppendN(t, owner, 1, 3)
		j := rbegin(t, rs[1], sc, "fp")
		if j.Decision != cache.Join || j.Flight.Gen != owner.Gen {
			t.Fatalf("%s on the other store: got %v; want a join of generation %d", sc.Key, j.Decision, owner.Gen)
		}
		owner.Commit(nil)
		if state := waitDone(t, j.Flight, 2*time.Second); state != cache.StateCommitted {
			t.Fatalf("%s: follower %v; want committed", sc.Key, state)
		}
		if b := rbegin(t, rs[1], sc, "fp"); b.Decision != cache.Hit || !bytes.Equal(b.Result.Data, want) {
			t.Fatalf("%s after the commit: got %v; want a hit with the owner's bytes", sc.Key, b.Decision)
		}
		if n := commits(t, rs[1], sc); n != 1 {
			t.Fatalf("%s: %d commits; want 1", sc.Key, n)
		}
	}
	// Renewals: a call each, the scopes being in different slots.
	r := newRedis(t, "", "renew", func(cfg *Config) { cfg.URL, cfg.Lease = url, renewLease })
	var fs []*cache.Flight
	for i := range 12 {
		sc := cache.Scope{Tenant: "t", Key: fmt.Sprintf("renew-%d", i)}
		fs = append(fs, rbegin(t, r, sc, "fp").Flight)
		storetest.StartStream(t, fs[i])
		shortenLease(t, r, sc)
	}
	r.renewAll()
	if n := r.Stats().Unavailable; n != 0 {
		t.Fatalf("renewals on a cluster: %d failed; want none", n)
	}
	for i, f := range fs {
		if left := leaseLeft(t, r, cache.Scope{Tenant: "t", Key: fmt.Sprintf("renew-%d", i)}); left < renewLease/2 {
			t.Fatalf("owner %d on a cluster: lease %v left after the renewal; want about %v", i, left, renewLease)
		}
		f.Fail(cache.StateFailedRetryable, "test over", nil)
	}
	_, err := New(Config{URL: "redis://" + c.Nodes[0].Addr + "/1", Timeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "database 0") {
		t.Fatalf("New with /1 on a cluster: got %v; want an error saying a cluster has database 0 only", err)
	}
}

// TestRedisClusterSeedDownAtStart: a store started while its one seed is
// down begins with a single-node client; once the node is back it must
// switch to a cluster client, or the keys of the other primaries' slots
// would get MOVED forever.
func TestRedisClusterSeedDownAtStart(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	c.Nodes[0].Stop()
	r := newRedis(t, c.Nodes[0].Addr, "ssg", func(cfg *Config) { cfg.Timeout = 500 * time.Millisecond })
	c.Nodes[0].Restart()
	eventually(t, 15*time.Second, func() error {
		for i := range 30 {
			if _, err := r.Begin(cache.Scope{Tenant: "t", Key: fmt.Sprintf("seed-%d", i)}, "fp"); err != nil {
				return fmt.Errorf("Begin after the seed came back: %w", err)
			}
		}
		return nil
	})
}

// TestRedisClusterBounds: on a Redis Cluster, where a key's count is in
// other slots than its records and is kept by scripts of its own rather
// than inside the claim and the finish, the bounds hold as on a
// standalone Redis: per tenant, on strangers' keys, on all keys, per
// account (each account's set in a slot of its own), and a denied key
// leaves them at once.
func TestRedisClusterBounds(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	store := func(prefix string, mod func(*Config)) *Store {
		return newRedis(t, "", prefix, func(cfg *Config) {
			cfg.URL = c.URL()
			if mod != nil {
				mod(cfg)
			}
		})
	}
	t.Run("per-tenant", func(t *testing.T) {
		maxKeysPerTenant(t, func(mod func(*Config)) *Store { return store("tenant", mod) })
	})
	for _, c := range storetest.Contracts {
		if c.Name == "LiveShares" {
			continue // this replica's own bytes: no slot holds them
		}
		t.Run(c.Name, func(t *testing.T) {
			c.Run(t, store(c.Name, func(cfg *Config) { cfg.MaxKeys, cfg.Limits = c.MaxKeys, c.Limits }))
		})
	}
	if r := store("mode", nil); r.sharedKeys() {
		t.Fatal("a cluster client's store: sharedKeys got true; want false")
	}
}
