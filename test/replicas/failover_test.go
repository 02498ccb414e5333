package replicas_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/poll"
	"github.com/ssegate/ssegate/internal/redistest"
	"github.com/ssegate/ssegate/sse"
)

// TestClusterFailover: two replicas on a cluster of 3 primaries with one
// Redis replica each; 60 keyed streams (about 2 s each) are in flight when
// one primary is SIGKILLed and its replica takes over, at once (CLUSTER
// FAILOVER FORCE) or by the cluster's own failure detection
// (--cluster-node-timeout 2000). Then every key is retried on the other
// replica and replayed on the first. It logs how the keys ended and
// asserts what must hold through a failover: at most one commit per key;
// every client stream contiguous, from one generation, ending whole or
// with stream_aborted; a whole stream identical to the stored result,
// unless the failover lost its commit and a retry regenerated it (the
// documented Limit, counted).
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("a primary's failover takes seconds; skipped with -short")
	}
	for _, mode := range []string{"forced", "automatic"} {
		t.Run(mode, func(t *testing.T) { failover(t, mode == "forced") })
	}
}

func failover(t *testing.T, forced bool) {
	const n = 60
	setup := time.Now()
	e := newClusterEnv(t, mockllm.Config{Tokens: 40, Delay: 50 * time.Millisecond}, 1)
	t.Logf("cluster of 3 primaries and 3 replicas started in %v", time.Since(setup).Round(time.Millisecond))
	gates := []*gatetest.Process{e.start("A"), e.start("B")}
	start := time.Now()

	first := make([]*stream, n)
	firstErr := make([]error, n)
	key := func(i int) string { return fmt.Sprintf("fo-%d", i) }
	var wg sync.WaitGroup
	for i := range n {
		g := gates[i%2]
		wg.Go(func() {
			s, err := tryOpen(http.MethodPost, g.URL+"/v1/chat/completions", key(i), "")
			if err == nil {
				s.readAll()
			}
			first[i], firstErr[i] = s, err
		})
	}
	// Every stream has begun (none ends for two seconds).
	poll.For(t, 10*time.Second, "every stream reaches the upstream", func() bool { return e.mock.Calls() >= n })

	victim := e.cluster.Nodes[0]
	promoted := e.cluster.ReplicasOf(victim)[0]
	killed := time.Now()
	victim.Stop()
	if forced {
		if _, err := redistest.Command(promoted.Addr, time.Second, "CLUSTER", "FAILOVER", "FORCE"); err != nil {
			t.Fatalf("CLUSTER FAILOVER FORCE: %v", err)
		}
	}
	poll.For(t, 15*time.Second, "the replica takes over", func() bool {
		info, err := redistest.Command(promoted.Addr, time.Second, "INFO", "replication")
		return err == nil && strings.Contains(info, "role:master")
	})
	tookOver := time.Since(killed)
	poll.For(t, 15*time.Second, "the cluster is ok again", func() bool {
		return clusterOK(promoted, e.cluster.Nodes[1], e.cluster.Nodes[2])
	})
	clusterOK := time.Since(killed)
	wg.Wait()
	firstDone := time.Since(start)

	// KEYS and the commit counts now run on the primaries that are left.
	e.nodes = nil
	for _, s := range []*redistest.Server{promoted, e.cluster.Nodes[1], e.cluster.Nodes[2]} {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			t.Fatalf("redis client %s: %v", s.Addr, err)
		}
		t.Cleanup(c.Close)
		e.nodes = append(e.nodes, c)
	}

	// Every key retried on the other replica: a replay of what was
	// committed, or a new generation.
	retried := time.Now()
	retry := make([]*stream, n)
	for i := range n {
		g := gates[(i+1)%2]
		wg.Go(func() {
			poll.Until(10*time.Second, func() bool {
				s, err := tryOpen(http.MethodPost, g.URL+"/v1/chat/completions", key(i), "")
				if err != nil || s.readAll().status != 200 {
					return false
				}
				retry[i] = s
				return true
			})
		})
	}
	wg.Wait()
	for i := range n {
		if retry[i] == nil {
			t.Fatalf("key %s: no retry answered 200 within 10s", key(i))
		}
	}

	var whole, aborted, regenerated, lostCommit, replayedWhole int
	codes := map[string]int{}
	for i := range n {
		k := key(i)
		f, r := first[i], retry[i]
		if firstErr[i] != nil || f.status != 200 {
			t.Errorf("key %s: first request: err %v, status %v; want a 200 stream", k, firstErr[i], f)
			continue
		}
		gen := contiguous(t, f, sse.ID{})
		rgen := contiguous(t, r, sse.ID{})
		if !r.clean() {
			t.Errorf("key %s: the retry did not end whole (aborted %q)", k, r.aborted())
		}
		replayed := r.header.Get("Idempotent-Replayed") == "true"
		if replayed != (rgen == gen) {
			t.Errorf("key %s: retry replayed %v, generation %d after %d", k, replayed, rgen, gen)
		}
		switch code := f.aborted(); {
		case f.clean():
			whole++
			if replayed {
				replayedWhole++
				if !bytes.Equal(f.raw, r.raw) {
					t.Errorf("key %s: a whole stream differs from the stored result it replays", k)
				}
			} else {
				lostCommit++ // the failover lost its commit: the Limit
			}
		case code != "":
			aborted++
			codes[code]++
			if replayed {
				t.Errorf("key %s: the first stream aborted (%s) but its generation replays", k, code)
			}
		default:
			t.Errorf("key %s: the first stream neither ended whole nor with stream_aborted (err %v, %d events)", k, f.err, len(f.events))
		}
		if !replayed {
			regenerated++
		}
	}

	retryTook := time.Since(retried)
	// The stored result replays on the first replica, as the retry got it.
	for i := range n {
		s := post(t, gates[i%2], key(i)).readAll()
		if s.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(s.raw, retry[i].raw) {
			t.Errorf("key %s: replay %q on the first replica differs from the retry's stream", key(i), s.header.Get("Idempotent-Replayed"))
		}
	}

	if got := e.atMostOneCommit(); got != n {
		t.Errorf("commits: %d; want %d (one per key)", got, n)
	}
	// One generation per key's first request, and one per retry that did
	// not replay: no retry or replay paid for another.
	if got := e.mock.Calls(); got != int64(n+regenerated) {
		t.Errorf("upstream calls: got %d; want %d (%d keys, %d retries regenerated)", got, n+regenerated, n, regenerated)
	}
	onPromoted := 0
	if ks, err := e.nodes[0].Do(context.Background(), e.nodes[0].B().Keys().Pattern("ssg:{*}:st").Build()).AsStrSlice(); err == nil {
		onPromoted = len(ks)
	}
	logs := gates[0].Logs() + gates[1].Logs()
	count := func(msg string) int { return strings.Count(logs, msg) }
	var cs []string
	for c, k := range codes {
		cs = append(cs, fmt.Sprintf("%s %d", c, k))
	}
	sort.Strings(cs)
	mode := "automatic failover"
	if forced {
		mode = "CLUSTER FAILOVER FORCE"
	}
	t.Logf("%s: replica primary %v after the SIGKILL, cluster ok after %v; first streams done after %v; retries took %v; total %v", mode, tookOver.Round(time.Millisecond), clusterOK.Round(time.Millisecond), firstDone.Round(time.Millisecond), retryTook.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	t.Logf("%d keys (%d on the failed-over slots): %d whole (%d replayed identical, %d lost commit regenerated), %d aborted [%s]; %d retries regenerated; %d upstream calls",
		n, onPromoted, whole, replayedWhole, lostCommit, aborted, strings.Join(cs, ", "), regenerated, e.mock.Calls())
	t.Logf("replica logs: %d journal tails re-appended, %d generations reaped, %d owned generations fenced, %d commits refused",
		count("re-appending"), count("reaped a generation"), count("owned generation fenced"), count("commit refused"))
}

// TestClusterMinReplicasToWrite measures what min-replicas-to-write 1 on
// every node (CONFIG SET) costs: 60 short keyed streams through two
// replicas without it and with it, then, with it, 60 new keys after a
// primary is SIGKILLed and its replica forced to take over (the promoted
// primary has no replica of its own left, so it refuses writes with
// NOREPLICAS). It asserts the happy path still commits every key once and
// that after the failover a key is whole or refused with 503, never a
// stream cut short, and logs the durations and the statuses.
func TestClusterMinReplicasToWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster with replicas; skipped with -short")
	}
	e := newClusterEnv(t, mockllm.Config{Tokens: 20, Delay: time.Millisecond}, 1)
	gates := []*gatetest.Process{e.start("A"), e.start("B")}
	batch := func(prefix string) (time.Duration, map[int]int) {
		start := time.Now()
		var mu sync.Mutex
		statuses := map[int]int{}
		keys := make(chan int)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for i := range keys {
					s, err := tryOpen(http.MethodPost, gates[i%2].URL+"/v1/chat/completions", fmt.Sprintf("%s-%d", prefix, i), "")
					st := 0
					if err == nil {
						s.readAll()
						st = s.status
						if st == 200 && !s.clean() {
							st = -1 // a 200 that did not end whole
						}
					}
					mu.Lock()
					statuses[st]++
					mu.Unlock()
				}
			})
		}
		for i := range 60 {
			keys <- i
		}
		close(keys)
		wg.Wait()
		return time.Since(start), statuses
	}
	batch("warm")
	without, st := batch("without")
	if st[200] != 60 {
		t.Fatalf("without min-replicas-to-write: statuses %v; want 60 × 200", st)
	}
	for _, s := range append(append([]*redistest.Server{}, e.cluster.Nodes...), e.cluster.Replicas...) {
		if _, err := redistest.Command(s.Addr, time.Second, "CONFIG", "SET", "min-replicas-to-write", "1"); err != nil {
			t.Fatalf("CONFIG SET min-replicas-to-write 1 on %s: %v", s.Addr, err)
		}
	}
	with, st := batch("with")
	if st[200] != 60 {
		t.Fatalf("with min-replicas-to-write 1: statuses %v; want 60 × 200", st)
	}
	if got := e.atMostOneCommit(); got != 180 {
		t.Fatalf("commits: %d; want 180", got)
	}
	victim := e.cluster.Nodes[0]
	promoted := e.cluster.ReplicasOf(victim)[0]
	victim.Stop()
	if _, err := redistest.Command(promoted.Addr, time.Second, "CLUSTER", "FAILOVER", "FORCE"); err != nil {
		t.Fatalf("CLUSTER FAILOVER FORCE: %v", err)
	}
	poll.For(t, 15*time.Second, "the replica takes over", func() bool {
		info, err := redistest.Command(promoted.Addr, time.Second, "INFO", "replication")
		return err == nil && strings.Contains(info, "role:master")
	})
	poll.For(t, 15*time.Second, "the cluster is ok again", func() bool {
		return clusterOK(promoted, e.cluster.Nodes[1], e.cluster.Nodes[2])
	})
	after, st := batch("after")
	t.Logf("60 keyed streams: %v without min-replicas-to-write, %v with it (1 on every node); after a failover with it set: %v, statuses %v (-1: a 200 that aborted)",
		without.Round(time.Millisecond), with.Round(time.Millisecond), after.Round(time.Millisecond), st)
	if st[-1] != 0 || st[200]+st[503] != 60 {
		t.Fatalf("after the failover: statuses %v; want each key whole (200) or refused (503 store_unavailable)", st)
	}
	if n := strings.Count(gates[0].Logs()+gates[1].Logs(), "NOREPLICAS"); n > 0 {
		t.Logf("the replicas logged %d NOREPLICAS refusals", n)
	}
}
