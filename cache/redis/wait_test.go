package redis

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"github.com/ssegate/ssegate/cache/internal/wiretest"
	"github.com/ssegate/ssegate/internal/redistest"
)

// replicated starts a primary and a replica of it, and waits until the
// replica is in step.
func replicated(t *testing.T) (primary, replica *redistest.Server) {
	t.Helper()
	primary, replica = redistest.Start(t), redistest.Start(t)
	host, port, _ := strings.Cut(primary.Addr, ":")
	if _, err := redistest.Command(replica.Addr, time.Second, "REPLICAOF", host, port); err != nil {
		t.Fatalf("REPLICAOF: %v", err)
	}
	eventually(t, 10*time.Second, func() error {
		info, err := redistest.Command(primary.Addr, time.Second, "INFO", "replication")
		if err != nil {
			return err
		}
		if !strings.Contains(info, "connected_slaves:1") || !strings.Contains(info, "state=online") {
			return fmt.Errorf("replica not in step: %s", info)
		}
		return nil
	})
	return primary, replica
}

// committedStream claims sc on r, streams two events and commits them,
// and returns how long the claim and the commit took.
func committedStream(t *testing.T, r *Store, sc cache.Scope) (claim, commit time.Duration) {
	t.Helper()
	t0 := time.Now()
	f := rbegin(t, r, sc, "fp").Flight
	claim = time.Since(t0)
	if f == nil {
		t.Fatalf("%v: not a miss", sc)
	}
	storetest.StartStream(t, f)
	for range 2 {
		if _, err := f.Append("", wiretest.ChatChunk); err != nil {
			t.Fatal(err)
		}
	}
	t0 = time.Now()
	if !f.Commit(nil) {
		t.Fatal("Commit: got false")
	}
	return claim, time.Since(t0)
}

// TestRedisWaitReplicas: with WaitReplicas, a claim and a commit are on
// the server's replica when the store acts on them (the replica holds
// the committed result the moment Commit returns), and a replica that
// stops answering delays each by the wait's timeout at most, counted
// short, without failing them. The replica in step is given a wait long
// enough for a loaded machine (a wait that times out is no proof of
// anything); the paused one a short wait, which is timed.
func TestRedisWaitReplicas(t *testing.T) {
	t.Parallel()
	primary, replica := replicated(t)
	r := newRedis(t, primary.Addr, "wait", func(c *Config) { c.WaitReplicas, c.WaitTimeout, c.Timeout = 1, 3*time.Second, 5*time.Second })
	sc := cache.Scope{Tenant: "t", Key: "in-step"}
	committedStream(t, r, sc)
	if got, err := redistest.Command(replica.Addr, time.Second, "EXISTS", r.keys(sc).res); err != nil || got != "1" {
		t.Fatalf("the replica's copy of the result when Commit returned: EXISTS %q %v; want 1", got, err)
	}
	st := r.Stats()
	if st.Waits < 2 || st.WaitsShort != 0 {
		t.Fatalf("waits %d, short %d; want a wait each for the claim and the commit, none short", st.Waits, st.WaitsShort)
	}
	if b := rbegin(t, r, sc, "fp"); b.Decision != cache.Hit {
		t.Fatalf("the key again: %v; want a hit", b.Decision)
	}

	const timeout = 300 * time.Millisecond
	paused := newRedis(t, primary.Addr, "wait", func(c *Config) { c.WaitReplicas, c.WaitTimeout = 1, timeout })
	replica.Pause()
	defer replica.Resume()
	claim, commit := committedStream(t, paused, cache.Scope{Tenant: "t", Key: "replica-paused"})
	for what, d := range map[string]time.Duration{"claim": claim, "commit": commit} {
		if d < timeout || d > timeout+time.Second {
			t.Errorf("%s with the replica paused took %v; want the wait's timeout (%v) and little more", what, d, timeout)
		}
	}
	if short := paused.Stats().WaitsShort; short < 2 {
		t.Fatalf("%d short waits with the replica paused; want one each for the claim and the commit", short)
	}
}

// TestRedisWaitReplicasBounds: New refuses a negative count and a wait
// no shorter than an operation's timeout.
func TestRedisWaitReplicasBounds(t *testing.T) {
	for _, cfg := range []Config{
		{URL: "redis://127.0.0.1:1", WaitReplicas: -1},
		{URL: "redis://127.0.0.1:1", WaitReplicas: 1, WaitTimeout: time.Second, Timeout: time.Second},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(WaitReplicas %d, WaitTimeout %v, Timeout %v): no error; want one", cfg.WaitReplicas, cfg.WaitTimeout, cfg.Timeout)
		}
	}
}

// TestRedisWaitReplicasScriptsGone: a server that lost the scripts (Redis
// does not copy SCRIPT LOAD to its replicas, so a promoted one has none),
// with no replica to acknowledge, under a burst of claims that queue
// into pipelines: each claim still gets its answer within the timeout of
// an operation. The calls a pipeline sends again after NOSCRIPT go
// together, not one after another behind their waits.
func TestRedisWaitReplicasScriptsGone(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "gone", func(c *Config) { c.WaitReplicas, c.WaitTimeout = 1, 50*time.Millisecond })
	rbegin(t, r, cache.Scope{Tenant: "t", Key: "warm"}, "fp")
	if _, err := redistest.Command(srv.Addr, time.Second, "SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 300 {
		wg.Go(func() {
			if _, err := r.Begin(cache.Scope{Tenant: "t", Key: "k" + strconv.Itoa(i)}, "fp"); err != nil {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of 300 claims failed after the scripts were flushed; want none", n)
	}
}

// TestRedisWaitReplicasClaimCut: with WaitReplicas, a claim sent with its
// WAIT on a connection of its own that is cut before its answer (the
// claim ran on the server) goes once more, on another connection, and
// comes back the claim's own miss: one generation in Redis, which a
// duplicate joins, and the wait of the claim that went again counted.
func TestRedisWaitReplicasClaimCut(t *testing.T) {
	t.Parallel()
	primary, _ := replicated(t)
	relay := redistest.NewRelay(t, primary.Addr)
	prefix := redistest.Prefix(t)
	// A wait long enough for a loaded machine: this one is to be met.
	mod := func(c *Config) { c.WaitReplicas, c.WaitTimeout, c.Timeout = 1, 3*time.Second, 5*time.Second }
	a := newRedis(t, relay.Addr, prefix, mod)
	b := newRedis(t, primary.Addr, prefix, mod)
	got := claimReplyCut(t, relay, a, b, cache.Scope{Tenant: "t", Key: "cut"})
	if st := a.Stats(); st.Waits < 1 || st.WaitsShort != 0 {
		t.Fatalf("waits %d, short %d; want the claim sent again waited, not short", st.Waits, st.WaitsShort)
	}
	got.Flight.Fail(cache.StateFailedRetryable, "test", nil)
}
