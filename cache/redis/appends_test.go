package redis

import (
	"bytes"
	"context"
	"fmt"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"github.com/ssegate/ssegate/cache/internal/wiretest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/ssegate/ssegate/internal/redistest"
)

// appendLease is the lease of the tests of batched appends: long enough
// that no renewal (a script call of its own) runs while they count the
// append calls.
const appendLease = 30 * time.Second

// ownerOf returns the owner of f on r.
func ownerOf(tb testing.TB, r *Store, f *cache.Flight) *owner {
	tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for o := range r.owners {
		if o.f == f {
			return o
		}
	}
	tb.Fatalf("flight %d: no owner", f.Gen)
	return nil
}

// mirroredStreams claims n keys on r, starts their streams with one event
// each and has their owners mirror, as a follower's ask does; it returns
// once every journal holds its event.
func mirroredStreams(tb testing.TB, r *Store, name string, n int) ([]cache.Scope, []*cache.Flight, [][]byte) {
	tb.Helper()
	scs, fs, wants := make([]cache.Scope, n), make([]*cache.Flight, n), make([][]byte, n)
	for i := range n {
		scs[i], fs[i], wants[i] = ownedStream(tb, r, name+"-"+strconv.Itoa(i), 1)
		ownerOf(tb, r, fs[i]).ask()
	}
	for i := range n {
		eventually(tb, 5*time.Second, func() error {
			if got, want := journalLast(tb, r, scs[i]), fmt.Sprintf("%d-1", fs[i].Gen); got != want {
				return fmt.Errorf("stream %d: the journal ends at %q; want %s", i, got, want)
			}
			return nil
		})
	}
	// Load the batch script, so that no NOSCRIPT retry is counted.
	if _, err := appendsScript.exec(context.Background(), r.c, nil); err != nil {
		tb.Fatal(err)
	}
	return scs, fs, wants
}

// heldMod configures the stores of the tests that hold an append in a
// stopped Redis: a timeout long enough that the held call is not given up
// and sent again while the others queue on a loaded machine.
func heldMod(c *Config) {
	c.Lease = appendLease
	c.Timeout = 10 * time.Second
}

// journalLast returns the id sc's journal in Redis ends with ("" for
// none).
func journalLast(tb testing.TB, r *Store, sc cache.Scope) string {
	tb.Helper()
	es, err := r.c.Do(context.Background(), r.c.B().Xrevrange().Key(r.keys(sc).j).End("+").Start("-").Count(1).Build()).AsXRange()
	if err != nil {
		tb.Fatalf("XREVRANGE: %v", err)
	}
	if len(es) == 0 {
		return ""
	}
	return es[0].ID
}

// journalsWhole waits until the journal of each stream but skip (-1 for
// none) ends with the last event its flight journaled.
func journalsWhole(tb testing.TB, r *Store, scs []cache.Scope, fs []*cache.Flight, skip int) {
	tb.Helper()
	for i := range fs {
		if i == skip {
			continue
		}
		eventually(tb, 5*time.Second, func() error {
			if got, want := journalLast(tb, r, scs[i]), fmt.Sprintf("%d-%d", fs[i].Gen, fs[i].Events()); got != want {
				return fmt.Errorf("stream %d: the journal ends at %q; want %s", i, got, want)
			}
			return nil
		})
	}
}

// commitAll commits each stream but skip (-1 for none) and checks that a
// replay gives its events.
func commitAll(tb testing.TB, r *Store, scs []cache.Scope, fs []*cache.Flight, wants [][]byte, skip int) {
	tb.Helper()
	for i, f := range fs {
		if i == skip {
			continue
		}
		if !f.Commit(nil) {
			tb.Fatalf("stream %d: Commit: got false; want true", i)
		}
		if b := rbegin(tb, r, scs[i], "fp"); b.Decision != cache.Hit || !bytes.Equal(b.Result.Data, wants[i]) {
			tb.Fatalf("stream %d: replay got %v; want its events", i, b.Decision)
		}
	}
}

// heldStreams starts a private Redis, a store on it (heldMod) and
// heldCount mirrored streams of one event each.
func heldStreams(tb testing.TB) (*redistest.Server, *Store, []cache.Scope, []*cache.Flight, [][]byte) {
	tb.Helper()
	srv := redistest.Start(tb)
	r := newRedis(tb, srv.Addr, "held", heldMod)
	scs, fs, wants := mirroredStreams(tb, r, "s", heldCount)
	return srv, r, scs, fs, wants
}

// heldCount is how many streams the tests of held appends run.
const heldCount = 8

// queued returns how many appends wait in r's batcher.
func queued(r *Store) int {
	_, n := sending(r)
	return n
}

// sending returns the calls r's batcher has running and the appends
// waiting in its queue.
func sending(r *Store) (calls, queued int) {
	r.appends.mu.Lock()
	defer r.appends.mu.Unlock()
	return r.appends.calls, len(r.appends.queue)
}

// appendHeld appends one event to each of fs while srv is stopped: the
// first's append is sent alone and held in Redis, the others queue behind
// it; then srv resumes. It returns the events' bytes.
func appendHeld(tb testing.TB, srv *redistest.Server, r *Store, fs []*cache.Flight) [][]byte {
	tb.Helper()
	got := make([][]byte, len(fs))
	srv.Pause()
	defer srv.Resume()
	got[0] = storetest.AppendN(tb, fs[0], fs[0].Events()+1, 1)
	eventually(tb, 5*time.Second, func() error { // taken alone, for the stopped server
		if calls, n := sending(r); calls != 1 || n != 0 {
			return fmt.Errorf("%d calls, %d appends queued; want the first append in a call", calls, n)
		}
		return nil
	})
	for i, f := range fs[1:] {
		got[i+1] = storetest.AppendN(tb, f, f.Events()+1, 1)
	}
	eventually(tb, 5*time.Second, func() error {
		if n := queued(r); n != len(fs)-1 {
			return fmt.Errorf("%d appends queued; want %d", n, len(fs)-1)
		}
		return nil
	})
	return got
}

// TestRedisAppendsTogether: followed streams on one standalone Redis
// whose events come at the same moments are appended in far fewer script
// calls than batches (the appends of many owners go in one call), and
// each follower on the other replica still gets every event byte for
// byte.
func TestRedisAppendsTogether(t *testing.T) {
	t.Parallel()
	const streams, rounds = 32, 20
	srv := redistest.Start(t)
	mod := func(c *Config) { c.Lease = appendLease }
	rs := []*Store{newRedis(t, srv.Addr, "together", mod), newRedis(t, srv.Addr, "together", mod)}
	fs, subs, wants := make([]*cache.Flight, streams), make([]*cache.Sub, streams), make([][]byte, streams)
	for i := range streams {
		var sc cache.Scope
		sc, fs[i], wants[i] = ownedStream(t, rs[0], "s"+strconv.Itoa(i), 1)
		j := rbegin(t, rs[1], sc, "fp")
		if j.Decision != cache.Join {
			t.Fatalf("stream %d: duplicate got %v; want join", i, j.Decision)
		}
		subs[i], _ = j.Flight.Subscribe(0)
		defer subs[i].Close()
	}
	eventually(t, appendLease/2, func() error {
		if m := rs[0].Stats().Mirrors; m != streams {
			return fmt.Errorf("%d owners mirror; want %d", m, streams)
		}
		return nil
	})
	eventually(t, 5*time.Second, func() error {
		if e := rs[0].Stats().Events; e != streams {
			return fmt.Errorf("%d events in Redis; want %d", e, streams)
		}
		return nil
	})
	before, batches := readRedisCost(t, srv.Addr), rs[0].Stats().Batches
	for round := range rounds {
		for i, f := range fs {
			wants[i] = append(wants[i], storetest.AppendN(t, f, round+2, 1)...)
		}
		time.Sleep(20 * time.Millisecond)
	}
	eventually(t, 5*time.Second, func() error {
		if e := rs[0].Stats().Events; e != streams*(rounds+1) {
			return fmt.Errorf("%d events in Redis; want %d", e, streams*(rounds+1))
		}
		return nil
	})
	calls := readRedisCost(t, srv.Addr).scripts - before.scripts
	batches = rs[0].Stats().Batches - batches
	t.Logf("%d events of %d streams: %d batches in %d script calls", streams*rounds, streams, batches, calls)
	// Alone, each batch is a call; a round's 32 appends, all ready within
	// a round trip or two, go in a few calls however loaded the machine.
	if calls*4 > batches {
		t.Fatalf("%d script calls for %d batches; want at most a quarter as many", calls, batches)
	}
	var wg sync.WaitGroup
	for i, f := range fs {
		wg.Go(func() {
			if !f.Commit(nil) {
				t.Errorf("stream %d: Commit: got false", i)
				return
			}
			if got, ended := wiretest.Follow(subs[i], 5*time.Second); !ended || !bytes.Equal(got, wants[i]) {
				t.Errorf("stream %d: the follower got %d bytes (ended %v); want the owner's %d", i, len(got), ended, len(wants[i]))
			}
		})
	}
	wg.Wait()
}

// TestRedisAppendsFencedInBatch: an owner fenced by another replica, whose
// append goes in one call with other owners', is fenced alone: its flight
// fails, and the others' events reach Redis whole and commit.
func TestRedisAppendsFencedInBatch(t *testing.T) {
	t.Parallel()
	srv, r, scs, fs, wants := heldStreams(t)
	const victim = 3
	// Another replica took the key over: st names another token.
	if err := r.c.Do(context.Background(), r.c.B().Hset().Key(r.keys(scs[victim]).st).FieldValue().
		FieldValue("tok", "another").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	before := readRedisCost(t, srv.Addr)
	for i, p := range appendHeld(t, srv, r, fs) {
		wants[i] = append(wants[i], p...)
	}
	if state := waitDone(t, fs[victim], 5*time.Second); state != cache.StateCommitUnknown {
		t.Fatalf("fenced owner: state %v; want commit_unknown", state)
	}
	if _, reason, _ := fs[victim].Outcome(); reason != cache.ReasonGenerationLost {
		t.Fatalf("fenced owner: reason %q; want %s", reason, cache.ReasonGenerationLost)
	}
	journalsWhole(t, r, scs, fs, victim)
	// The held append, then the others' in one call.
	if calls := readRedisCost(t, srv.Addr).scripts - before.scripts; calls != 2 {
		t.Fatalf("%d script calls for the appends; want 2", calls)
	}
	commitAll(t, r, scs, fs, wants, victim)
}

// TestRedisAppendsPrevInBatch: an owner whose journal in Redis lost its
// tail (a failover) gets "prev" within a batch of other owners' appends:
// it alone re-appends from where Redis's journal ends, and every journal
// ends whole.
func TestRedisAppendsPrevInBatch(t *testing.T) {
	t.Parallel()
	srv, r, scs, fs, wants := heldStreams(t)
	const lost = 5
	// A failover lost the acknowledged event: the journal keeps only what
	// came before it, and loses its top id with it (which XDEL would keep).
	if err := r.c.Do(context.Background(), r.c.B().Eval().Script(`
local es = redis.call('XRANGE', KEYS[1], '-', ARGV[1])
redis.call('DEL', KEYS[1])
for _, e in ipairs(es) do redis.call('XADD', KEYS[1], e[1], unpack(e[2])) end`).Numkeys(1).
		Key(r.keys(scs[lost]).j).Arg(fmt.Sprintf("%d-0", fs[lost].Gen)).Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
		t.Fatal(err)
	}
	if last := journalLast(t, r, scs[lost]); last == fmt.Sprintf("%d-1", fs[lost].Gen) {
		t.Fatalf("the journal after the loss ends at %s; want the event gone", last)
	}
	before, batches := readRedisCost(t, srv.Addr), r.Stats().Batches
	for i, p := range appendHeld(t, srv, r, fs) {
		wants[i] = append(wants[i], p...)
	}
	journalsWhole(t, r, scs, fs, -1)
	for i, f := range fs {
		select {
		case <-f.Done():
			t.Fatalf("stream %d: ended; want it live", i)
		default:
		}
	}
	// The held append, the others' in one call, and the lost journal's
	// re-append alone; each batch Redis took is counted.
	calls := readRedisCost(t, srv.Addr).scripts - before.scripts
	if b := r.Stats().Batches - batches; calls != 3 || b != heldCount {
		t.Fatalf("%d script calls, %d batches; want 3 calls and %d batches", calls, b, heldCount)
	}
	commitAll(t, r, scs, fs, wants, -1)
}

// TestRedisAppendsCallFails: a call of many owners' appends that times out
// (Redis stopped) fails each of them as a failed append does alone: each
// owner retries, and once Redis answers (and ran the late call) each
// takes its events as written, without a fence or a gap.
func TestRedisAppendsCallFails(t *testing.T) {
	t.Parallel()
	const streams = 8
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "fails", func(c *Config) {
		c.Lease = appendLease
		c.Timeout = 300 * time.Millisecond
	})
	scs, fs, wants := mirroredStreams(t, r, "x", streams)
	unavailable := r.Stats().Unavailable
	srv.Pause()
	for i, f := range fs {
		wants[i] = append(wants[i], storetest.AppendN(t, f, 2, 1)...)
	}
	eventually(t, 5*time.Second, func() error {
		// Each owner's append failed at least once: the held one alone,
		// the others in one call (or more, on a loaded machine).
		if n := r.Stats().Unavailable - unavailable; n < streams {
			return fmt.Errorf("%d failed appends; want each of the %d", n, streams)
		}
		return nil
	})
	srv.Resume()
	journalsWhole(t, r, scs, fs, -1)
	commitAll(t, r, scs, fs, wants, -1)
	if st := r.Stats(); st.Fenced != 0 {
		t.Fatalf("%d owners fenced; want none", st.Fenced)
	}
}

// BenchmarkRedisFollowed measures what Redis spends on 64 streams of 100
// events paced together (one event each every 20 ms), each followed by a
// join on another replica from its first event, so that every event is
// mirrored: claims, joins, appends, tail reads and commits. An op is the
// 64 streams; the metrics are per event.
func BenchmarkRedisFollowed(b *testing.B) {
	const streams, events, pace = 64, 100, 20 * time.Millisecond
	srv := redistest.Start(b)
	mod := func(c *Config) { c.Lease = appendLease }
	rs := []*Store{newRedis(b, srv.Addr, "followed", mod), newRedis(b, srv.Addr, "followed", mod)}
	costStream(b, rs[0], "warm") // loads the scripts
	if _, err := appendsScript.exec(context.Background(), rs[0].c, nil); err != nil {
		b.Fatal(err)
	}
	before := readRedisCost(b, srv.Addr)
	b.ResetTimer()
	for n := range b.N {
		fs, subs := make([]*cache.Flight, streams), make([]*cache.Sub, streams)
		for i := range streams {
			sc := cache.Scope{Tenant: "t", Key: strconv.Itoa(n) + "-" + strconv.Itoa(i)}
			fs[i] = rbegin(b, rs[0], sc, "fp").Flight
			storetest.StartStream(b, fs[i])
			if _, err := fs[i].Append("", wiretest.ChatChunk); err != nil {
				b.Fatal(err)
			}
			j := rbegin(b, rs[1], sc, "fp")
			if j.Decision != cache.Join {
				b.Fatalf("stream %d: duplicate got %v; want join", i, j.Decision)
			}
			subs[i], _ = j.Flight.Subscribe(0)
		}
		for range events - 1 {
			time.Sleep(pace)
			for _, f := range fs {
				if _, err := f.Append("", wiretest.ChatChunk); err != nil {
					b.Fatal(err)
				}
			}
		}
		var wg sync.WaitGroup
		for i, f := range fs {
			wg.Go(func() {
				defer subs[i].Close()
				if !f.Commit(nil) {
					b.Error("Commit: got false")
				}
				if _, ended := wiretest.Follow(subs[i], 5*time.Second); !ended {
					b.Error("a follower did not end")
				}
			})
		}
		wg.Wait()
	}
	b.StopTimer()
	st := rs[0].Stats()
	reportRedisCost(b, srv.Addr, before, streams*events) // per event
	b.ReportMetric(float64(st.Batches)/float64(b.N*streams*events), "batches/op")
}

// TestRedisAppendsCatchUpAlone: a follower's first batch past a batch
// call's bounds (thousands of events) queued among other owners' appends
// goes in a call of its own, and every journal ends whole.
func TestRedisAppendsCatchUpAlone(t *testing.T) {
	t.Parallel()
	const held = 3000
	srv, r, scs, fs, wants := heldStreams(t)
	bigSc, big, bigWant := ownedStream(t, r, "big", held)
	before := readRedisCost(t, srv.Addr)
	srv.Pause()
	wants[0] = append(wants[0], storetest.AppendN(t, fs[0], 2, 1)...)
	for i, f := range fs[1:4] {
		wants[i+1] = append(wants[i+1], storetest.AppendN(t, f, 2, 1)...)
	}
	ownerOf(t, r, big).ask()
	for i, f := range fs[4:] {
		wants[i+4] = append(wants[i+4], storetest.AppendN(t, f, 2, 1)...)
	}
	time.Sleep(100 * time.Millisecond) // the appends and the catch-up queue, or wait in calls of their own
	srv.Resume()
	scs, fs, wants = append(scs, bigSc), append(fs, big), append(wants, bigWant)
	journalsWhole(t, r, scs, fs, -1)
	// The held append; the others in calls around the catch-up, which a
	// full queue's bytes sends at once in more calls at a time.
	if calls := readRedisCost(t, srv.Addr).scripts - before.scripts; calls > 1+maxAppendCalls+1 {
		t.Fatalf("%d script calls; want at most %d", calls, 1+maxAppendCalls+1)
	}
	if st := r.Stats(); st.Fenced != 0 {
		t.Fatalf("%d owners fenced; want none", st.Fenced)
	}
	commitAll(t, r, scs, fs, wants, -1)
}

// TestRedisAppendQueuedDeadline: an append queued behind a call held in a
// stopped Redis gets its answer (a failure, which its owner retries)
// -redis-timeout after it queued, not after the held call's timeout and
// then its own call's; the owners heal once Redis answers.
func TestRedisAppendQueuedDeadline(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "qdeadline", func(c *Config) {
		c.Lease = appendLease
		c.Timeout = timeout
	})
	scs, fs, wants := mirroredStreams(t, r, "q", heldCount)
	unavailable := r.Stats().Unavailable
	srv.Pause()
	t.Cleanup(srv.Resume) // when the test ends early
	wants[0] = append(wants[0], storetest.AppendN(t, fs[0], 2, 1)...)
	eventually(t, 5*time.Second, func() error { // sent alone, held in the stopped server
		if calls, n := sending(r); calls != 1 || n != 0 {
			return fmt.Errorf("%d calls, %d appends queued; want the first append in a call", calls, n)
		}
		return nil
	})
	queuedAt := time.Now()
	for i, f := range fs[1:] {
		wants[i+1] = append(wants[i+1], storetest.AppendN(t, f, 2, 1)...)
	}
	// The held call fails at its timeout; each queued append at its own
	// deadline, by then: without one, they would be sent after the held
	// call failed and fail a timeout later.
	eventually(t, 2*timeout, func() error {
		if n := r.Stats().Unavailable - unavailable; n < heldCount {
			return fmt.Errorf("%d failed appends; want each of the %d", n, heldCount)
		}
		return nil
	})
	if took := time.Since(queuedAt); took > timeout+timeout/2 {
		t.Errorf("the queued appends failed %v after they queued; want about -redis-timeout (%v)", took.Round(time.Millisecond), timeout)
	}
	srv.Resume()
	journalsWhole(t, r, scs, fs, -1)
	commitAll(t, r, scs, fs, wants, -1)
	if st := r.Stats(); st.Fenced != 0 {
		t.Fatalf("%d owners fenced; want none", st.Fenced)
	}
}
