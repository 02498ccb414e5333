package redis

import (
	"bytes"
	"context"
	"fmt"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"github.com/ssegate/ssegate/cache/internal/wiretest"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/redistest"
	"github.com/ssegate/ssegate/sse"
)

// journalLen returns the entries of sc's journal in Redis (0 when it has
// none).
func journalLen(tb testing.TB, r *Store, sc cache.Scope) int64 {
	tb.Helper()
	n, err := r.c.Do(context.Background(), r.c.B().Xlen().Key(r.keys(sc).j).Build()).AsInt64()
	if err != nil {
		tb.Fatalf("XLEN: %v", err)
	}
	return n
}

// journalExists reports whether sc's journal key exists in Redis.
func journalExists(tb testing.TB, r *Store, sc cache.Scope) bool {
	tb.Helper()
	n, err := r.c.Do(context.Background(), r.c.B().Exists().Key(r.keys(sc).j).Build()).AsInt64()
	if err != nil {
		tb.Fatalf("EXISTS: %v", err)
	}
	return n == 1
}

// checkJournalTTL fails the test unless sc's journal expires, within max.
func checkJournalTTL(tb testing.TB, r *Store, sc cache.Scope, max time.Duration) {
	tb.Helper()
	ms, err := r.c.Do(context.Background(), r.c.B().Pttl().Key(r.keys(sc).j).Build()).AsInt64()
	if err != nil || ms <= 0 || time.Duration(ms)*time.Millisecond > max {
		tb.Fatalf("the journal's PTTL: %d ms, %v; want an expiry within %v", ms, err, max)
	}
}

// askDirectly sets st.want as a follower's ask does, without the signal
// to the owner's inbox: an ask whose signal was lost.
func askDirectly(tb testing.TB, r *Store, sc cache.Scope) {
	tb.Helper()
	if err := r.c.Do(context.Background(), r.c.B().Hset().Key(r.keys(sc).st).FieldValue().
		FieldValue("want", "1").Build()).Error(); err != nil {
		tb.Fatalf("HSET want: %v", err)
	}
}

// ownedStream claims key on r, starts a stream and journals n events; it
// returns the scope, the flight and the events' bytes.
func ownedStream(tb testing.TB, r *Store, key string, n int) (cache.Scope, *cache.Flight, []byte) {
	tb.Helper()
	sc := cache.Scope{Tenant: "t", Key: key}
	f := rbegin(tb, r, sc, "fp").Flight
	storetest.StartStream(tb, f)
	return sc, f, storetest.AppendN(tb, f, 1, n)
}

// TestRedisMirrorOnlyWhenAsked: a generation nobody follows from another
// replica writes no event to Redis, whatever its length, and leaves no
// journal once committed; its marks still reach Redis, and a resume on
// another replica reads the committed result.
func TestRedisMirrorOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	rs := replicas(t, 2)
	sc, f, want := ownedStream(t, rs[0], "unfollowed", 300)
	// The renewals (every lease/3) carry the marks.
	eventually(t, 10*testLease, func() error {
		if ki, ok := rs[1].Info(sc); !ok || ki.State != cache.StateExecutionStarted || ki.Events != 300 {
			return fmt.Errorf("the other replica's key info while live: %+v (found %v); want execution_started with 300 events", ki, ok)
		}
		return nil
	})
	if journalExists(t, rs[0], sc) {
		t.Fatal("a journal in Redis while live; want none")
	}
	if !f.Commit(nil) {
		t.Fatal("Commit: got false; want true")
	}
	if n := journalLen(t, rs[0], sc); n != 0 {
		t.Fatalf("journal entries in Redis after the commit: got %d; want no journal", n)
	}
	if st := rs[0].Stats(); st.Events != 0 || st.Mirrors != 0 {
		t.Fatalf("owner: %d events appended to Redis, %d mirrors; want none", st.Events, st.Mirrors)
	}
	_, res, err := rs[1].Attach(sc, "fp", sse.ID{Gen: f.Gen, Seq: 100}, true)
	if err != nil || res == nil {
		t.Fatalf("resume on the other replica: %v, result %v; want the result", err, res)
	}
	p, _ := res.After(100)
	if full, _ := res.After(0); !bytes.Equal(full, want) || len(p) == 0 {
		t.Fatal("the committed result differs from the events journaled")
	}
	wiretest.CheckSeq(t, wiretest.ParseWire(t, p), f.Gen, 100, 300)
}

// TestRedisFollowerAsks: followers on another replica join generations at
// once and mid-way; each owner mirrors on its follower's ask, the first
// batch carrying all it held, and every follower copies every event byte
// for byte. The wait for the first batch is logged (p50, p99) and bounded:
// an ask whose signal were lost is found by a renewal (every lease/3), so
// a lease, which leaves room for a loaded machine, means no ask was
// answered.
func TestRedisFollowerAsks(t *testing.T) {
	t.Parallel()
	// A longer lease than the other tests': 32 owners and followers at
	// once on a loaded machine can miss a 400 ms lease's renewals.
	const lease = 2 * time.Second
	addr, prefix := redistest.Shared(t), redistest.Prefix(t)
	mod := func(c *Config) { c.Lease = lease }
	rs := []*Store{newRedis(t, addr, prefix, mod), newRedis(t, addr, prefix, mod)}
	const streams, before, after = 32, 40, 20
	waits := make([]time.Duration, streams)
	var wg sync.WaitGroup
	for i := range streams {
		wg.Go(func() {
			sc := cache.Scope{Tenant: "t", Key: "asked-" + strconv.Itoa(i)}
			f := rbegin(t, rs[0], sc, "fp").Flight
			storetest.StartStream(t, f)
			held := (i % 2) * before // half join at the first event, half mid-way
			want := storetest.AppendN(t, f, 1, max(held, 1))
			held = f.Events()
			t0 := time.Now()
			j := rbegin(t, rs[1], sc, "fp")
			if j.Decision != cache.Join {
				t.Errorf("stream %d: duplicate got %v; want join", i, j.Decision)
				return
			}
			sub, _ := j.Flight.Subscribe(0)
			defer sub.Close()
			var got []byte
			timeout := time.After(3 * lease)
		wait:
			for len(got) < len(want) {
				select {
				case <-sub.C():
				case <-timeout:
					break wait
				}
				p, ended := storetest.ReadAll(sub)
				got = append(got, p...)
				if ended {
					break
				}
			}
			waits[i] = time.Since(t0)
			if !bytes.Equal(got, want) {
				t.Errorf("stream %d: the follower's first %d bytes differ from the owner's %d", i, len(got), len(want))
				return
			}
			want = append(want, storetest.AppendN(t, f, held+1, after)...)
			f.Commit(nil)
			p, _ := wiretest.Follow(sub, 3*lease)
			got = append(got, p...)
			if waitDone(t, j.Flight, 3*lease) != cache.StateCommitted || !bytes.Equal(got, want) {
				t.Errorf("stream %d: the follower did not end committed with every event", i)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	slices.Sort(waits)
	p50, p99 := waits[streams/2], waits[streams*99/100]
	t.Logf("wait for the first mirrored batch over %d streams: p50 %v, p99 %v, max %v", streams, p50, p99, waits[streams-1])
	if bound := lease; waits[streams-1] > bound {
		t.Fatalf("a follower waited %v for the first batch; want within %v", waits[streams-1], bound)
	}
	if a, m := rs[1].Stats().Asks, rs[0].Stats().Mirrors; a != streams || m != streams {
		t.Fatalf("asks %d, mirrors %d; want %d each: one per followed generation", a, m, streams)
	}
}

// TestRedisFollowAfterUnmirroredCommit: a follower whose ask comes after
// the generation was committed unmirrored (it saw the key live a moment
// before) copies the events from the committed result, byte for byte.
func TestRedisFollowAfterUnmirroredCommit(t *testing.T) {
	t.Parallel()
	rs := replicas(t, 2)
	sc, f, want := ownedStream(t, rs[0], "late", 120)
	if !f.Commit(nil) || journalLen(t, rs[0], sc) != 0 {
		t.Fatal("the unmirrored commit: not stored, or its journal kept")
	}
	fl := rs[1].follow(sc, rs[1].keys(sc), f.Gen, "fp")
	sub, _ := fl.Subscribe(0)
	defer sub.Close()
	got, ended := wiretest.Follow(sub, 3*testLease)
	if !ended || waitDone(t, fl, time.Second) != cache.StateCommitted || !bytes.Equal(got, want) {
		t.Fatalf("late follower: ended %v with %d bytes of %d; want committed with every event", ended, len(got), len(want))
	}
}

// TestRedisAskSignalLost: an ask whose signal to the owner was lost is
// found by the owner's next renewal, and one that comes just before the
// commit by the commit itself: either way the journal is mirrored whole
// and kept with its terminal entry for the follower.
func TestRedisAskSignalLost(t *testing.T) {
	t.Parallel()
	rs := replicas(t, 1)
	for _, atCommit := range []bool{false, true} {
		t.Run(fmt.Sprintf("at commit %v", atCommit), func(t *testing.T) {
			sc, f, _ := ownedStream(t, rs[0], fmt.Sprintf("lost-ask-%v", atCommit), 150)
			askDirectly(t, rs[0], sc)
			if !atCommit {
				eventually(t, 10*testLease, func() error {
					if n := journalLen(t, rs[0], sc); n != 150 {
						return fmt.Errorf("journal entries after a renewal: got %d; want 150", n)
					}
					return nil
				})
			}
			f.Commit(nil)
			if n := journalLen(t, rs[0], sc); n != 151 {
				t.Fatalf("journal entries after the commit: got %d; want every event and the end", n)
			}
			checkJournalTTL(t, rs[0], sc, journalTTL)
		})
	}
}

// TestRedisUnfollowedRecords: a new key's unfollowed stream writes no
// journal at its claim or its commit (no XADD, no DEL: the lease is left to expire, no
// XREVRANGE), and its claim writes in st only the fields that are not a
// default, which every reader takes as empty or 0.
func TestRedisUnfollowedRecords(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "records", func(c *Config) { c.Lease = time.Minute })
	ctx := context.Background()
	if _, warm, _ := ownedStream(t, r, "warm", 1); !warm.Commit(nil) { // loads the scripts
		t.Fatal("Commit: got false")
	}
	sc := cache.Scope{Tenant: "t", Key: "k"}
	before := readRedisCost(t, srv.Addr)
	f := rbegin(t, r, sc, "fp").Flight
	if f == nil {
		t.Fatal("the claim of a new key: not a miss")
	}
	n, err := r.c.Do(ctx, r.c.B().Hlen().Key(r.keys(sc).st).Build()).AsInt64()
	if err != nil || n != 8 {
		t.Errorf("st of a new key: %d fields, %v; want 8 (phase, state, gen, tok, fp, owner, created, updated)", n, err)
	}
	ki, ok := r.Info(sc)
	if want := (cache.KeyInfo{State: cache.StateIntentReceived, Generation: f.Gen, Created: ki.Created, Updated: ki.Updated}); !ok ||
		!reflect.DeepEqual(ki, want) || ki.Created.IsZero() {
		t.Errorf("Info of a new key: %+v (found %v); want %+v with its times", ki, ok, want)
	}
	storetest.StartStream(t, f)
	want := storetest.AppendN(t, f, 1, 50)
	if journalExists(t, r, sc) {
		t.Error("a journal in Redis while live; want none")
	}
	if !f.Commit(nil) {
		t.Fatal("Commit: got false")
	}
	after := readRedisCost(t, srv.Addr)
	for cmd, max := range map[string]int64{"xadd": 0, "xrevrange": 0, "hdel": 0, "del": 0} { // the lease is left to expire
		if got := after.calls[cmd] - before.calls[cmd]; got != max {
			t.Errorf("%s in the claim and commit of an unfollowed stream: %d calls; want %d", cmd, got, max)
		}
	}
	if journalExists(t, r, sc) {
		t.Error("a journal in Redis after the commit; want none")
	}
	if ki, ok := r.Info(sc); !ok || ki.State != cache.StateCommitted || ki.Events != 50 || ki.Reason != "" || !ki.BodyStored {
		t.Errorf("Info of the committed key: %+v (found %v); want committed with 50 events and its body", ki, ok)
	}
	if c := commits(t, r, sc); c != 1 {
		t.Errorf("commits: %d; want 1", c)
	}
	_, res, err := r.Attach(sc, "fp", sse.ID{}, false)
	if err != nil || res == nil {
		t.Fatalf("Attach: %v, %v; want the result", err, res)
	}
	if got, _ := res.After(0); !bytes.Equal(got, want) {
		t.Fatal("the committed result differs from the events journaled")
	}
}

// TestRedisStaleJournal: a failed generation's record expires before its
// journal (FailedTTL shorter than the journal's 60 s); the key's next
// generation, claimed with no record, is followed from another replica
// byte for byte, its first batch deleting the earlier journal, and then
// expires with st; unfollowed, the next one commits past it.
func TestRedisStaleJournal(t *testing.T) {
	t.Parallel()
	addr, prefix := redistest.Shared(t), redistest.Prefix(t)
	mod := func(c *Config) { c.FailedTTL = 20 * time.Millisecond }
	rs := []*Store{newRedis(t, addr, prefix, mod), newRedis(t, addr, prefix, mod)}
	sc, old, _ := ownedStream(t, rs[0], "stale", 10)
	staleJournal(t, rs[0], sc, old)
	_, f, want := ownedStream(t, rs[0], "stale", 30)
	if f == nil || f.Gen <= old.Gen {
		t.Fatalf("the next claim: %v; want a new generation after %d", f, old.Gen)
	}
	j := rbegin(t, rs[1], sc, "fp")
	if j.Decision != cache.Join {
		t.Fatalf("duplicate got %v; want join", j.Decision)
	}
	sub, _ := j.Flight.Subscribe(0)
	defer sub.Close()
	want = append(want, storetest.AppendN(t, f, 31, 10)...)
	eventually(t, 10*testLease, func() error {
		if n := journalLen(t, rs[0], sc); n != 40 {
			return fmt.Errorf("journal entries once mirrored: %d; want the new generation's 40 alone", n)
		}
		return nil
	})
	checkJournalTTL(t, rs[0], sc, rs[0].cfg.LiveTTL)
	if !f.Commit(nil) {
		t.Fatal("Commit: got false")
	}
	got, _ := wiretest.Follow(sub, 3*testLease)
	if waitDone(t, j.Flight, 3*testLease) != cache.StateCommitted || !bytes.Equal(got, want) {
		t.Fatalf("the follower: %d bytes of %d; want committed with every event", len(got), len(want))
	}
	// Unfollowed, past another failed generation's journal.
	sc2, old2, _ := ownedStream(t, rs[0], "stale-unfollowed", 5)
	staleJournal(t, rs[0], sc2, old2)
	_, f2, want2 := ownedStream(t, rs[0], "stale-unfollowed", 5)
	if !f2.Commit(nil) || journalExists(t, rs[0], sc2) && journalLen(t, rs[0], sc2) != 1 {
		t.Fatal("the unfollowed commit past a stale journal: refused, or a journal of its own")
	}
	if _, res, err := rs[1].Attach(sc2, "fp", sse.ID{}, false); err != nil || res == nil {
		t.Fatalf("Attach: %v; want the result", err)
	} else if got, _ := res.After(0); !bytes.Equal(got, want2) {
		t.Fatal("the committed result differs from the events journaled")
	}
}

// staleJournal fails f's generation and waits for its record to expire
// (FailedTTL) while its journal, with the terminal entry, stays.
func staleJournal(tb testing.TB, r *Store, sc cache.Scope, f *cache.Flight) {
	tb.Helper()
	f.Fail(cache.StateFailedRetryable, "upstream_error", nil)
	eventually(tb, 10*testLease, func() error {
		n, err := r.c.Do(context.Background(), r.c.B().Exists().Key(r.keys(sc).st).Build()).AsInt64()
		if err != nil || n != 0 {
			return fmt.Errorf("st of the failed generation: exists %d, %v; want expired", n, err)
		}
		return nil
	})
	if !journalExists(tb, r, sc) {
		tb.Fatal("the failed generation's journal expired with st; the test needs it to outlive st")
	}
}

// TestRedisFinishWholeJournal: a mirrored commit whose journal, with the
// events it carries (none, or some), would not end with the stream's last
// event is refused with "prev", before any write: a follower takes what
// precedes the terminal entry for the whole answer. With the rest it
// commits.
func TestRedisFinishWholeJournal(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "whole", func(c *Config) { c.Lease = time.Minute })
	ctx := context.Background()
	scs, fs, _ := mirroredStreams(t, r, "w", 1) // event 1 in the journal
	sc, f := scs[0], fs[0]
	o := ownerOf(t, r, f)
	o.shutdown() // its finishes are sent below, as if by it
	k := r.keys(sc)
	finish := func(prev string, from, to int) writeAnswer {
		t.Helper()
		args := finishArgs{keys: r.finishKeys(sc, k, true), tok: o.tok, gen: o.gen, done: true, prev: prev,
			keep: r.cfg.TTL, state: cache.StateCommitted, now: time.Now(), result: []byte("blob"), events: 5,
			mirrored: true, mark: markFields{attempts: 1, status: 200}, end: r.countEnd(k, r.cfg.TTL, true, false, o.fresh),
			from: from - 1}
		for seq := from; seq <= to; seq++ {
			args.evs = append(args.evs, []byte("event "+strconv.Itoa(seq)))
		}
		a, err := parseWriteAnswer(run(ctx, r.c, finishScript, args))
		if err != nil {
			t.Fatalf("finish: %v", err)
		}
		return a
	}
	// Five events; the commit carries none, its owner taking the journal
	// for whole where it ends at the first (a failover lost the rest).
	if a := finish(o.gen+"-5", 6, 5); a.verdict != writePrev || a.last != o.gen+"-1" {
		t.Fatalf("a commit of no events on a journal short of the last: got %+v; want prev %s-1", a, o.gen)
	}
	// The commit carries the second only: refused before any write.
	if a := finish(o.gen+"-1", 2, 2); a.verdict != writePrev || a.last != o.gen+"-1" {
		t.Fatalf("a commit short of the last event: got %+v; want prev %s-1", a, o.gen)
	}
	if got := journalLast(t, r, sc); got != o.gen+"-1" {
		t.Fatalf("the journal ends at %q; want %s-1: nothing written, no terminal entry", got, o.gen)
	}
	if ki, _ := r.Info(sc); ki.State == cache.StateCommitted {
		t.Fatal("committed short of the last event")
	}
	if a := finish(o.gen+"-1", 2, 5); a.verdict != writeOK {
		t.Fatalf("the commit with the rest: got %+v; want ok", a)
	}
	if got, want := journalLast(t, r, sc), o.gen+"-"+maxSeq; got != want {
		t.Fatalf("the journal ends at %q; want the terminal entry %s", got, want)
	}
}
