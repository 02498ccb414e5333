package redis

import (
	"context"
	"strconv"
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
	slot, err := r.c.Do(context.Background(), r.c.B().ClusterKeyslot().Key(r.keys(sc).st).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	from, to := moveSlot(t, c, slot)
	if got, err := redistest.Command(from.Addr, time.Second, "GET", r.keys(sc).st); err == nil || !strings.Contains(err.Error(), "MOVED") {
		t.Fatalf("the old primary of slot %d answers %q, %v; want MOVED", slot, got, err)
	}
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

// moveSlot moves an empty slot from the primary that holds it to another,
// as redis-cli --cluster reshard does (IMPORTING, MIGRATING, then NODE on
// every primary), and returns both.
func moveSlot(t *testing.T, c *redistest.Cluster, slot int64) (from, to *redistest.Server) {
	t.Helper()
	ids := map[*redistest.Server]string{}
	for _, n := range c.Nodes {
		id, err := redistest.Command(n.Addr, time.Second, "CLUSTER", "MYID")
		if err != nil {
			t.Fatal(err)
		}
		ids[n] = id
	}
	for _, n := range c.Nodes {
		if owns(t, n, slot) {
			from = n
		} else if to == nil {
			to = n
		}
	}
	if from == nil || to == nil {
		t.Fatalf("slot %d: no primary holds it", slot)
	}
	s := strconv.FormatInt(slot, 10)
	if got, err := redistest.Command(from.Addr, time.Second, "CLUSTER", "COUNTKEYSINSLOT", s); err != nil || got != "0" {
		t.Fatalf("slot %d holds %q keys (%v); want an empty slot", slot, got, err)
	}
	steps := []struct {
		at   *redistest.Server
		args []string
	}{
		{to, []string{"CLUSTER", "SETSLOT", s, "IMPORTING", ids[from]}},
		{from, []string{"CLUSTER", "SETSLOT", s, "MIGRATING", ids[to]}},
		{to, []string{"CLUSTER", "SETSLOT", s, "NODE", ids[to]}},
		{from, []string{"CLUSTER", "SETSLOT", s, "NODE", ids[to]}},
	}
	for _, n := range c.Nodes {
		if n != from && n != to {
			steps = append(steps, struct {
				at   *redistest.Server
				args []string
			}{n, []string{"CLUSTER", "SETSLOT", s, "NODE", ids[to]}})
		}
	}
	for _, st := range steps {
		if got, err := redistest.Command(st.at.Addr, time.Second, st.args...); err != nil || got != "OK" {
			t.Fatalf("%v on %s: %q %v", st.args, st.at.Addr, got, err)
		}
	}
	return from, to
}

// owns reports whether primary n holds slot, by CLUSTER NODES as n says it.
func owns(t *testing.T, n *redistest.Server, slot int64) bool {
	t.Helper()
	nodes, err := redistest.Command(n.Addr, time.Second, "CLUSTER", "NODES")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(nodes) {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "myself") {
			continue
		}
		for _, r := range f[8:] {
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.ParseInt(lo, 10, 64)
			b, err2 := strconv.ParseInt(hi, 10, 64)
			if err1 == nil && err2 == nil && a <= slot && slot <= b {
				return true
			}
		}
	}
	return false
}
