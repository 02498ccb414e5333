package replicas_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/poll"
	"github.com/ssegate/ssegate/internal/redistest"
	"github.com/ssegate/ssegate/sse"
)

// TestDuplicatesAcrossReplicas: a request starts on A; eight concurrent
// duplicates spread over A and B join it. One upstream generation; every
// client gets the same bytes with the same ids; a later duplicate on
// either replica replays them.
func TestDuplicatesAcrossReplicas(t *testing.T) {
	backends(t, func(t *testing.T, be backend) {
		e := be.newEnv(t, mockllm.Config{Tokens: 40, Delay: 10 * time.Millisecond})
		a, b := e.start("A"), e.start("B")
		first := post(t, a, "dup")
		first.readN(t, 1)
		streams := make([]*stream, 8)
		var wg sync.WaitGroup
		for i := range streams {
			g := a
			if i%2 == 1 {
				g = b
			}
			wg.Go(func() { streams[i] = post(t, g, "dup").readAll() })
		}
		first.readAll()
		wg.Wait()
		if !first.clean() {
			t.Fatalf("first stream: not clean (%d events, last %+v)", len(first.events), first.events[len(first.events)-1])
		}
		contiguous(t, first, sse.ID{})
		for i, s := range streams {
			if s.status != 200 || s.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("duplicate %d: status %d, Idempotent-Replayed %q; want 200, true", i, s.status, s.header.Get("Idempotent-Replayed"))
			}
			if !bytes.Equal(s.raw, first.raw) {
				t.Fatalf("duplicate %d (replica %s): %d bytes differ from the first stream's %d", i, []string{"A", "B"}[i%2], len(s.raw), len(first.raw))
			}
		}
		for _, g := range []*gatetest.Process{a, b} {
			if s := post(t, g, "dup").readAll(); !bytes.Equal(s.raw, first.raw) {
				t.Fatalf("replay on %s: differs from the original", g.Name)
			}
		}
		if n := e.mock.Calls(); n != 1 {
			t.Fatalf("upstream calls: got %d; want 1", n)
		}
		if n := e.atMostOneCommit(); n != 1 {
			t.Fatalf("commits: got %d; want 1", n)
		}
	})
}

// TestResumeOnOtherReplica: a client reads 20 events from A and loses its
// connection; it resumes on B with Last-Event-ID, by POST and by GET,
// while the stream is live and after it was committed: exactly the rest.
func TestResumeOnOtherReplica(t *testing.T) {
	backends(t, func(t *testing.T, be backend) {
		e := be.newEnv(t, mockllm.Config{Tokens: 80, Delay: 10 * time.Millisecond})
		a, b := e.start("A"), e.start("B")
		s := post(t, a, "resume")
		s.readN(t, 20)
		s.close()
		last := s.events[19].id
		after, _ := sse.ParseID(last)
		byPost := open(t, http.MethodPost, b.URL+"/v1/chat/completions", "resume", last)
		byGet := open(t, http.MethodGet, b.URL+"/streams/resume", "", last)
		var wg sync.WaitGroup
		wg.Go(func() { byPost.readAll() })
		wg.Go(func() { byGet.readAll() })
		wg.Wait()
		full := post(t, b, "resume").readAll() // the committed stream, replayed
		for name, r := range map[string]*stream{"POST": byPost, "GET": byGet,
			"GET after commit": open(t, http.MethodGet, b.URL+"/streams/resume", "", last).readAll()} {
			if r.status != 200 || !r.clean() {
				t.Fatalf("resume by %s: status %d, clean %v; want 200 and a clean end", name, r.status, r.clean())
			}
			contiguous(t, r, after)
			if !bytes.Equal(r.raw, full.raw[len(s.raw):]) {
				t.Fatalf("resume by %s: not exactly the events after %s", name, last)
			}
		}
		if !bytes.Equal(full.raw[:len(s.raw)], s.raw) {
			t.Fatal("the replayed stream does not start with what A sent")
		}
		if n := e.mock.Calls(); n != 1 {
			t.Fatalf("upstream calls: got %d; want 1", n)
		}
	})
}

// TestOwnerKilled: the replica that owns a generation is SIGKILLed
// mid-stream. B's joiners get stream_aborted (generation_lost) within the
// lease and the idle bound; the key is free; a retry regenerates; exactly
// one commit.
func TestOwnerKilled(t *testing.T) {
	backends(t, func(t *testing.T, be backend) {
		e := be.newEnv(t, mockllm.Config{Tokens: 300, Delay: 10 * time.Millisecond})
		a, b := e.start("A"), e.start("B")
		s := post(t, a, "kill")
		s.readN(t, 10)
		joiners := make([]*stream, 3)
		for i := range joiners {
			joiners[i] = post(t, b, "kill")
			joiners[i].readN(t, 5)
		}
		killed := time.Now()
		a.Kill()
		bound := lease + min(lease/2, 2*time.Second) + time.Second // + slack for a loaded machine
		for i, j := range joiners {
			j.readAll()
			took := time.Since(killed)
			if code := j.aborted(); code != "generation_lost" {
				t.Fatalf("joiner %d: ended with %+v; want stream_aborted generation_lost", i, j.events[len(j.events)-1])
			}
			if took > bound {
				t.Fatalf("joiner %d: aborted %v after the kill; want within %v", i, took, bound)
			}
			contiguous(t, j, sse.ID{})
		}
		retry := post(t, b, "kill").readAll()
		if retry.status != 200 || !retry.clean() || retry.header.Get("Idempotent-Replayed") == "true" {
			t.Fatalf("retry: status %d clean %v replayed %q; want a fresh, clean 200", retry.status, retry.clean(), retry.header.Get("Idempotent-Replayed"))
		}
		if gen := contiguous(t, retry, sse.ID{}); gen <= s.ids(t)[0].Gen {
			t.Fatalf("retry: generation %d; want newer than the dead one", gen)
		}
		if n := e.mock.Calls(); n != 2 {
			t.Fatalf("upstream calls: got %d; want 2 (the lost generation and the retry)", n)
		}
		if n := e.atMostOneCommit(); n != 1 {
			t.Fatalf("commits: got %d; want 1", n)
		}
	})
}

// TestOwnerKilledBeforeFirstBatch: A owns a generation nobody follows, so
// its journal is not in Redis; B joins it and asks A for the journal
// while A cannot answer (stopped), and A is SIGKILLed while B waits for
// the first batch. B's joiner ends within A's lease and B's idle bound,
// never with a clean stream; the key is free, a retry regenerates, and
// exactly one generation commits.
func TestOwnerKilledBeforeFirstBatch(t *testing.T) {
	backends(t, func(t *testing.T, be backend) {
		e := be.newEnv(t, mockllm.Config{Tokens: 300, Delay: 10 * time.Millisecond})
		// A's lease is long enough that B joins it while A is stopped.
		const aLease = 2 * time.Second
		a, b := e.start("A", "-redis-lease", aLease.String()), e.start("B")
		s := post(t, a, "unasked")
		s.readN(t, 10)
		if n := len(e.keys("ssg:*:j")); n != 0 {
			t.Fatalf("journals in Redis with no follower: got %d; want none", n)
		}
		a.Pause()
		joined := make(chan *stream, 1)
		go func() {
			j, err := tryOpen(http.MethodPost, b.URL+"/v1/chat/completions", "unasked", "")
			if err != nil {
				j = &stream{err: err}
			} else {
				j.readAll()
			}
			joined <- j
		}()
		poll.For(t, aLease/2, "B asks A for the journal", e.wanted)
		killed := time.Now()
		a.Kill()
		j := <-joined
		took := time.Since(killed)
		t.Logf("joiner: status %d, %d events, ended %v after the kill", j.status, len(j.events), took)
		if bound := aLease + min(lease/2, 2*time.Second) + time.Second; took > bound {
			t.Fatalf("joiner: ended %v after the kill; want within %v", took, bound)
		}
		if j.err == nil && j.status == 200 && (j.clean() || j.aborted() != "generation_lost") {
			t.Fatalf("joiner: 200 ending with %+v; want stream_aborted generation_lost", j.events)
		}
		if j.status == 200 && len(j.events) > 1 {
			contiguous(t, j, sse.ID{})
		}
		retry := post(t, b, "unasked").readAll()
		if retry.status != 200 || !retry.clean() || retry.header.Get("Idempotent-Replayed") == "true" {
			t.Fatalf("retry: status %d clean %v replayed %q; want a fresh, clean 200", retry.status, retry.clean(), retry.header.Get("Idempotent-Replayed"))
		}
		if n := e.mock.Calls(); n != 2 {
			t.Fatalf("upstream calls: got %d; want 2 (the lost generation and the retry)", n)
		}
		if n := e.atMostOneCommit(); n != 1 {
			t.Fatalf("commits: got %d; want 1", n)
		}
	})
}

// TestOwnerPaused: A is stopped past its lease; B takes the key over and
// commits; when A continues it is fenced: its own client gets
// stream_aborted, and B's result is what replays everywhere.
func TestOwnerPaused(t *testing.T) {
	backends(t, func(t *testing.T, be backend) {
		e := be.newEnv(t, mockllm.Config{Tokens: 60, Delay: 10 * time.Millisecond})
		a, b := e.start("A"), e.start("B")
		s := post(t, a, "pause")
		s.readN(t, 5)
		a.Pause()
		poll.For(t, 10*lease, "A's lease lapses in Redis", func() bool { return len(e.keys("ssg:*:lease")) == 0 })
		taken := post(t, b, "pause").readAll()
		if !taken.clean() || taken.header.Get("Idempotent-Replayed") == "true" {
			t.Fatalf("B after A's lease: clean %v replayed %q; want a fresh clean stream", taken.clean(), taken.header.Get("Idempotent-Replayed"))
		}
		a.Resume()
		s.readAll()
		// A learns that B took the generation over either before its
		// stream's end (its client's stream is aborted) or at its commit,
		// which Redis refuses: the answer came whole and is not cut, so
		// its client gets it whole, its end as the upstream sent it (it
		// is not stored: the key replays B's).
		if code := s.aborted(); code == "" && !s.clean() {
			t.Fatalf("A's client after A continued: last event %+v; want stream_aborted, or the whole stream", s.events[len(s.events)-1])
		}
		contiguous(t, s, sse.ID{})
		for _, g := range []*gatetest.Process{a, b} {
			r := post(t, g, "pause").readAll()
			if !bytes.Equal(r.raw, taken.raw) {
				t.Fatalf("replay on %s: not B's result", g.Name)
			}
		}
		if n := e.mock.Calls(); n != 2 {
			t.Fatalf("upstream calls: got %d; want 2", n)
		}
		if n := e.atMostOneCommit(); n != 1 {
			t.Fatalf("commits: got %d; want 1", n)
		}
	})
}

// TestRedisOutage: Redis paused, then killed and restarted empty. Keyed
// requests get 503 store_unavailable with Retry-After while it is down,
// unkeyed ones are relayed, a stream in flight ends aborted (never passed
// off as whole), and service resumes without restarting ssegate.
func TestRedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	e := newEnv(t, srv, mockllm.Config{Tokens: 100, Delay: 10 * time.Millisecond})
	a, b := e.start("A"), e.start("B")
	if s := post(t, a, "before").readAll(); !s.clean() {
		t.Fatal("before the outage: stream not clean")
	}
	for _, how := range []string{"paused", "restarted"} {
		fenced := strings.Count(a.Logs(), "owned generation fenced")
		live := post(t, a, "live-"+how)
		live.readN(t, 3)
		if how == "paused" {
			srv.Pause()
		} else {
			srv.Stop()
		}
		for _, g := range []*gatetest.Process{a, b} {
			s := post(t, g, "down-"+how)
			s.readAll()
			if s.status != 503 || s.header.Get("Retry-After") == "" || !bytes.Contains(s.all, []byte("store_unavailable")) {
				t.Fatalf("%s, keyed request on %s: status %d Retry-After %q; want 503 store_unavailable with Retry-After", how, g.Name, s.status, s.header.Get("Retry-After"))
			}
			if u := post(t, g, "").readAll(); u.status != 200 || !u.clean() {
				t.Fatalf("%s, unkeyed request on %s: status %d clean %v; want a relayed stream", how, g.Name, u.status, u.clean())
			}
		}
		// Past the lease, the owner of the live stream fences itself.
		poll.For(t, 10*lease, how+": A fences the live stream", func() bool {
			return strings.Count(a.Logs(), "owned generation fenced") > fenced
		})
		if how == "paused" {
			srv.Resume()
		} else {
			srv.Restart()
		}
		live.readAll()
		if live.clean() || live.aborted() == "" {
			t.Fatalf("%s: the stream in flight ended clean=%v; want stream_aborted", how, live.clean())
		}
		for _, g := range []*gatetest.Process{a, b} {
			poll.For(t, 10*time.Second, how+": keyed requests on "+g.Name+" again", func() bool {
				s, err := tryOpen(http.MethodPost, g.URL+"/v1/chat/completions", "after-"+how+"-"+g.Name, "")
				if err != nil {
					return false
				}
				s.readAll()
				return s.status == 200 && s.clean()
			})
		}
		e.atMostOneCommit()
	}
	if s := post(t, b, "after-restarted-A").readAll(); s.header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("after the restart: a committed key does not replay")
	}
}

// TestRandomFaults: clients hit three replicas with a small set of keys
// while replicas are killed (and restarted) or paused at random, under a
// seed it logs. Invariants: at most one commit per key; every client stream
// is contiguous and from one generation; every stream that ended clean for
// a key carries the same bytes, but for those of a generation whose commit
// the store refused (whole answers given as they came, not stored).
func TestRandomFaults(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 6))
	e := newEnv(t, nil, mockllm.Config{Tokens: 30, Delay: 10 * time.Millisecond})
	gates := []*gatetest.Process{e.start("g0"), e.start("g1"), e.start("g2")}
	var mu sync.Mutex // guards gates (restarts replace them) and results
	type result struct {
		key string
		s   *stream
		err error
	}
	var results []result
	var wg sync.WaitGroup
	pick := func() *gatetest.Process {
		mu.Lock()
		defer mu.Unlock()
		return gates[rng.IntN(len(gates))]
	}
	deadline := time.Now().Add(60 * time.Second)
	for round := 0; round < 50 && time.Now().Before(deadline); round++ {
		for range 1 + rng.IntN(3) {
			key := fmt.Sprintf("rk%d", rng.IntN(8))
			g := pick()
			wg.Go(func() {
				s, err := tryOpen(http.MethodPost, g.URL+"/v1/chat/completions", key, "")
				if err == nil {
					s.readAll()
				}
				mu.Lock()
				results = append(results, result{key, s, err})
				mu.Unlock()
			})
		}
		// The round's fault, then a pause of random length that lets the
		// requests run into it: the schedule of the chaos, not a wait for
		// something to happen.
		var paused *gatetest.Process
		var pause time.Duration
		switch f := rng.IntN(10); {
		case f == 0: // kill a replica and start a new one in its place
			mu.Lock()
			i := rng.IntN(len(gates))
			g := gates[i]
			mu.Unlock()
			g.Kill()
			ng := e.start(fmt.Sprintf("g%d-r%d", i, round))
			mu.Lock()
			gates[i] = ng
			mu.Unlock()
		case f <= 2: // pause a replica, sometimes past its lease
			paused = pick()
			paused.Pause()
			pause = time.Duration(rng.IntN(int(2*lease/time.Millisecond))) * time.Millisecond
		default:
			pause = time.Duration(50+rng.IntN(200)) * time.Millisecond
		}
		time.Sleep(pause)
		if paused != nil {
			paused.Resume()
		}
	}
	wg.Wait()
	unstored := e.unstored()
	clean := map[string][]byte{}
	ok, fresh, whole := 0, 0, 0
	for i, r := range results {
		if r.err != nil || r.s.status == 200 && r.s.header.Get("Idempotent-Replayed") != "true" {
			fresh++ // a request that may have claimed its key
		}
		if r.err != nil || r.s.status != 200 {
			continue // a killed replica's connection, or an answer before any stream
		}
		gen := contiguous(t, r.s, sse.ID{})
		if !r.s.clean() {
			continue
		}
		ok++
		if unstored[r.key][gen] {
			// Whole, but refused by the store (its owner was paused past
			// its lease and fenced): a later request of the key may be
			// answered by another generation.
			whole++
			continue
		}
		if prev, seen := clean[r.key]; seen && !bytes.Equal(prev, r.s.raw) {
			t.Fatalf("client %d, key %s: a clean stream differs from another clean stream of the key", i, r.key)
		}
		clean[r.key] = r.s.raw
	}
	e.atMostOneCommit()
	if ok == 0 {
		t.Fatal("no client got a clean stream")
	}
	// Only a request that claimed its key calls the upstream, and its
	// client gets a fresh answer (or loses its replica): a join or a
	// replay that called the upstream would push the calls past that.
	calls := e.mock.Calls()
	if calls > int64(fresh) {
		t.Errorf("upstream calls: got %d; want at most %d, the clients not answered by a join or a replay", calls, fresh)
	}
	t.Logf("%d clients, %d clean streams (%d of them unstored), %d fresh answers, %d upstream calls", len(results), ok, whole, fresh, calls)
}
