package redis

import (
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/redistest"
)

// TestRedisWaitReplicasMoved: with WaitReplicas on a Redis Cluster, a
// claim whose slot moved to another primary after the store learned the
// slots is sent, with its WAIT, on a connection to the old primary, which
// answers MOVED. A dedicated connection does not follow a redirect: the
// claim goes again through the client that does, without its wait
// (counted short), and comes back a miss, held on the new primary, which
// a duplicate from another store joins. Not parallel, as the other
// cluster tests: starting processes would slow the timing tests beside
// it.
func TestRedisWaitReplicasMoved(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	url := c.URL()
	mod := func(cfg *Config) { cfg.URL, cfg.WaitReplicas, cfg.WaitTimeout = url, 1, 500*time.Millisecond }
	r := newRedis(t, "", "moved", mod)
	other := newRedis(t, "", "moved", mod)
	// The store learns the slots, each primary's replica in step.
	warm := rbegin(t, r, cache.Scope{Tenant: "t", Key: "warm"}, "fp")
	if warm.Decision != cache.Miss {
		t.Fatalf("warm: got %v; want a miss", warm.Decision)
	}
	warm.Flight.Fail(cache.StateFailedRetryable, "test", nil)

	sc := cache.Scope{Tenant: "t", Key: "moved"}
	to := moveSlot(t, c, r.keys(sc).st)
	before := r.Stats()
	b := rbegin(t, r, sc, "fp")
	if b.Decision != cache.Miss || b.Flight == nil {
		t.Fatalf("a claim of a moved slot: got %v; want a miss", b.Decision)
	}
	if got, err := redistest.Command(to.Addr, time.Second, "EXISTS", r.keys(sc).st); err != nil || got != "1" {
		t.Fatalf("the new primary's record of the claim: EXISTS %q %v; want 1", got, err)
	}
	if short := r.Stats().WaitsShort - before.WaitsShort; short < 1 {
		t.Fatalf("short waits: %d more; want the redirected claim's", short)
	}
	if j := rbegin(t, other, sc, "fp"); j.Decision != cache.Join || j.Flight.Gen != b.Flight.Gen {
		t.Fatalf("duplicate: got %v; want a join of the claim's generation", j.Decision)
	}
	b.Flight.Fail(cache.StateFailedRetryable, "test", nil)
}

// moveSlot moves the slot of key, which holds no key yet, from the
// primary that holds it to another, as redis-cli --cluster reshard does
// (IMPORTING, MIGRATING, then NODE on every primary), and returns the
// new one, once the old one answers MOVED for key.
func moveSlot(t *testing.T, c *redistest.Cluster, key string) *redistest.Server {
	t.Helper()
	var from, to *redistest.Server
	slot, err := redistest.Command(c.Nodes[0].Addr, time.Second, "CLUSTER", "KEYSLOT", key)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[*redistest.Server]string{}
	for _, n := range c.Nodes {
		if ids[n], err = redistest.Command(n.Addr, time.Second, "CLUSTER", "MYID"); err != nil {
			t.Fatal(err)
		}
		// Every primary but the slot's own redirects key.
		if _, err := redistest.Command(n.Addr, time.Second, "EXISTS", key); err == nil {
			from = n
		} else if to == nil {
			to = n
		}
	}
	if from == nil || to == nil {
		t.Fatalf("slot %s of %s: no primary holds it", slot, key)
	}
	if got, err := redistest.Command(from.Addr, time.Second, "CLUSTER", "COUNTKEYSINSLOT", slot); err != nil || got != "0" {
		t.Fatalf("slot %s holds %q keys (%v); want an empty slot", slot, got, err)
	}
	setslot := func(at *redistest.Server, args ...string) {
		t.Helper()
		args = append([]string{"CLUSTER", "SETSLOT", slot}, args...)
		if got, err := redistest.Command(at.Addr, time.Second, args...); err != nil || got != "OK" {
			t.Fatalf("%v on %s: %q %v", args, at.Addr, got, err)
		}
	}
	setslot(to, "IMPORTING", ids[from])
	setslot(from, "MIGRATING", ids[to])
	setslot(to, "NODE", ids[to])
	setslot(from, "NODE", ids[to])
	for _, n := range c.Nodes {
		if n != from && n != to {
			setslot(n, "NODE", ids[to])
		}
	}
	if _, err := redistest.Command(from.Addr, time.Second, "EXISTS", key); err == nil || !strings.Contains(err.Error(), "MOVED") {
		t.Fatalf("the old primary of slot %s answers %v for %s; want MOVED", slot, err, key)
	}
	return to
}
