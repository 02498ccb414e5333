package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"github.com/ssegate/ssegate/internal/redistest"
)

// plugPipe holds r's script pipe as if its every pipeline were in
// flight, so that the claims and commits made meanwhile queue;
// unplugPipe sends what queued, as the pipeline ahead's end would.
func plugPipe(r *Store) {
	r.pipe.mu.Lock()
	defer r.pipe.mu.Unlock()
	r.pipe.calls = maxPipeCalls
}

func unplugPipe(r *Store) {
	r.pipe.mu.Lock()
	defer r.pipe.mu.Unlock()
	r.pipe.calls = 1
	r.wg.Go(r.sendPiped)
}

// waitQueued waits until n calls queue in r's plugged pipe.
func waitQueued(tb testing.TB, r *Store, n int) {
	tb.Helper()
	eventually(tb, 5*time.Second, func() error {
		r.pipe.mu.Lock()
		defer r.pipe.mu.Unlock()
		if len(r.pipe.queue) != n {
			return fmt.Errorf("%d calls queued; want %d", len(r.pipe.queue), n)
		}
		return nil
	})
}

// pipedBegins begins scs at once on r, their first claims through one
// pipeline, and returns their answers, in order. On a standalone Redis a
// claim is one script call; on a Cluster a new key's claim is two, with
// its count between (claimScript), and the second ones may go in other
// pipelines.
func pipedBegins(t *testing.T, r *Store, scs []cache.Scope) ([]cache.Begun, []error) {
	t.Helper()
	bs, errs := make([]cache.Begun, len(scs)), make([]error, len(scs))
	plugPipe(r)
	var wg sync.WaitGroup
	for i, sc := range scs {
		wg.Go(func() { bs[i], errs[i] = r.Begin(sc, "fp") })
	}
	waitQueued(t, r, len(scs))
	before := r.pipelines.Load()
	unplugPipe(r)
	wg.Wait()
	if n := r.pipelines.Load() - before; n < 1 || (n > 1 && r.sharedKeys()) {
		t.Fatalf("the %d claims went in %d pipelines; want 1", len(scs), n)
	}
	return bs, errs
}

// pipedCommits commits fs at once on r, their first finishes through one
// pipeline, and returns whether each was kept. A generation a follower
// asked for finishes twice (the first answer has its owner mirror the
// journal first: finishScript), the second ones in other pipelines
// unless exact.
func pipedCommits(t *testing.T, r *Store, fs []*cache.Flight, exact bool) []bool {
	t.Helper()
	kept := make([]bool, len(fs))
	plugPipe(r)
	var wg sync.WaitGroup
	for i, f := range fs {
		wg.Go(func() { kept[i] = f.Commit(nil) })
	}
	waitQueued(t, r, len(fs))
	before := r.pipelines.Load()
	unplugPipe(r)
	wg.Wait()
	if n := r.pipelines.Load() - before; n < 1 || (n > 1 && exact) {
		t.Fatalf("the %d commits went in %d pipelines; want 1", len(fs), n)
	}
	return kept
}

// TestRedisPipeClaims: claims that queue behind one in flight go in one
// pipeline, each still decided on its own: a key whose tenant is at its
// bound is refused in the middle of the pipeline, uncounted and
// unclaimed, while the keys around it are claimed and counted.
func TestRedisPipeClaims(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Shared(t), redistest.Prefix(t)
	mod := func(c *Config) { c.MaxKeysPerTenant = 1 }
	r, other := newRedis(t, addr, prefix, mod), newRedis(t, addr, prefix, mod)
	storetest.StartStream(t, rbegin(t, r, cache.Scope{Tenant: "full", Key: "a"}, "fp").Flight)

	scs := []cache.Scope{{Tenant: "t1", Key: "x"}, {Tenant: "full", Key: "b"}, {Tenant: "t2", Key: "y"}, {Tenant: "t3", Key: "z"}}
	bs, errs := pipedBegins(t, r, scs)
	for i, sc := range scs {
		if sc.Tenant == "full" {
			if !errors.Is(errs[i], cache.ErrTenantFull) {
				t.Fatalf("%v: got %v, %v; want ErrTenantFull", sc, bs[i].Decision, errs[i])
			}
			if _, ok := other.Info(sc); ok {
				t.Fatalf("%v: refused, yet known on another replica", sc)
			}
			continue
		}
		if errs[i] != nil || bs[i].Decision != cache.Miss {
			t.Fatalf("%v: got %v, %v; want a miss", sc, bs[i].Decision, errs[i])
		}
		storetest.StartStream(t, bs[i].Flight)
		if j := rbegin(t, other, sc, "fp"); j.Decision != cache.Join || j.Flight.Gen != bs[i].Flight.Gen {
			t.Fatalf("%v on another replica: got %v; want a join of generation %d", sc, j.Decision, bs[i].Flight.Gen)
		}
		n, err := r.c.Do(context.Background(), r.c.B().Zcard().Key(r.tenantKey(sc)).Build()).AsInt64()
		if err != nil || n != 1 {
			t.Fatalf("%v: its tenant counts %d keys (%v); want 1", sc, n, err)
		}
	}
	n, err := r.c.Do(context.Background(), r.c.B().Zcard().Key(r.tenantKey(scs[1])).Build()).AsInt64()
	if err != nil || n != 1 {
		t.Fatalf("tenant full counts %d keys (%v); want 1, its first", n, err)
	}
}

// TestRedisPipeCommits: commits that queue behind one in flight go in one
// pipeline; one whose generation another replica took over (its record
// holds another token) is refused as lost, alone, and the others commit
// once each.
func TestRedisPipeCommits(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Shared(t), redistest.Prefix(t)
	// A lease long enough that no renewal fences the generation first.
	r := newRedis(t, addr, prefix, func(c *Config) { c.Lease = 30 * time.Second })
	scs := []cache.Scope{{Tenant: "t", Key: "c1"}, {Tenant: "t", Key: "fenced"}, {Tenant: "t", Key: "c3"}, {Tenant: "t", Key: "c4"}}
	var fs []*cache.Flight
	for _, sc := range scs {
		f := rbegin(t, r, sc, "fp").Flight
		storetest.StartStream(t, f)
		storetest.AppendN(t, f, 1, 3)
		fs = append(fs, f)
	}
	if err := r.c.Do(context.Background(), r.c.B().Hset().Key(r.keys(scs[1]).st).FieldValue().FieldValue("tok", "another-replica").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	kept := pipedCommits(t, r, fs, true)
	for i, sc := range scs {
		state, reason, _ := fs[i].Outcome()
		if sc.Key == "fenced" {
			if kept[i] || state != cache.StateCommitUnknown || reason != cache.ReasonGenerationLost || commits(t, r, sc) != 0 {
				t.Fatalf("%v: got kept %v, %v (%s), %d commits; want refused, commit_unknown (generation_lost), none", sc, kept[i], state, reason, commits(t, r, sc))
			}
			continue
		}
		if !kept[i] || state != cache.StateCommitted || commits(t, r, sc) != 1 {
			t.Fatalf("%v: got kept %v, %v, %d commits; want kept, committed, 1", sc, kept[i], state, commits(t, r, sc))
		}
	}
}

// TestRedisPipeCluster: on a Redis Cluster, claims and commits of keys in
// slots on every primary queue into one pipeline, which rueidis splits by
// node; each key is claimed, joined from another replica, and committed
// once.
func TestRedisPipeCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	url := c.URL()
	r := newRedis(t, "", "pipe", func(cfg *Config) { cfg.URL, cfg.Lease = url, 30*time.Second })
	other := newRedis(t, "", "pipe", func(cfg *Config) { cfg.URL = url })
	var scs []cache.Scope
	for i := range 12 {
		scs = append(scs, cache.Scope{Tenant: "t", Key: fmt.Sprintf("pipe-%d", i)})
	}
	slots := map[int64]bool{}
	for _, sc := range scs {
		n, err := r.c.Do(context.Background(), r.c.B().ClusterKeyslot().Key(r.keys(sc).st).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		slots[n] = true
	}
	if len(slots) < 3 {
		t.Fatalf("the keys are in %d slots; want several", len(slots))
	}
	bs, errs := pipedBegins(t, r, scs)
	var fs []*cache.Flight
	for i, sc := range scs {
		if errs[i] != nil || bs[i].Decision != cache.Miss {
			t.Fatalf("%v: got %v, %v; want a miss", sc, bs[i].Decision, errs[i])
		}
		storetest.StartStream(t, bs[i].Flight)
		storetest.AppendN(t, bs[i].Flight, 1, 2)
		if j := rbegin(t, other, sc, "fp"); j.Decision != cache.Join {
			t.Fatalf("%v on another replica: got %v; want a join", sc, j.Decision)
		}
		fs = append(fs, bs[i].Flight)
	}
	for i, ok := range pipedCommits(t, r, fs, false) {
		if !ok || commits(t, other, scs[i]) != 1 {
			t.Fatalf("%v: kept %v, %d commits; want kept, 1", scs[i], ok, commits(t, other, scs[i]))
		}
	}
}
