package cache

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/redistest"
)

// TestToolUnknownHeld: a tool call that ended commit_unknown answers its
// re-issues Unknown (Conflict with another fingerprint) until its own
// time passes or it is forgotten, where any other key in that state is
// free; a running key cannot be forgotten; a committed tool call's key
// stands for its Keep.
func TestToolUnknownHeld(t *testing.T) {
	clk := newClock()
	m := newMemory(t, Config{TTL: time.Hour, FailedTTL: time.Minute, Now: clk.Now})
	tool := Tool{Name: "write", Keep: 10 * time.Minute, UnknownTTL: 5 * time.Hour}
	sc := Scope{Tenant: "t", Key: "k"}

	b, err := m.BeginTool(sc, "fp", tool)
	if err != nil || b.Decision != Miss {
		t.Fatalf("first call: %v %v", b.Decision, err)
	}
	if err := m.Forget(sc); !errors.Is(err, ErrLive) {
		t.Fatalf("Forget of a running key: %v; want ErrLive", err)
	}
	b.Flight.SetHead(Head{Status: 200})
	b.Flight.Fail(StateCommitUnknown, "upstream_reset", nil)
	if n := m.ToolUnknowns(); n != 1 {
		t.Fatalf("ToolUnknowns: %d; want 1", n)
	}
	clk.Advance(time.Hour) // past FailedTTL, within UnknownTTL
	if b, _ := m.BeginTool(sc, "fp", tool); b.Decision != Unknown {
		t.Fatalf("re-issue: %v; want unknown", b.Decision)
	}
	if b, _ := m.BeginTool(sc, "other", tool); b.Decision != Conflict {
		t.Fatalf("other fingerprint: %v; want conflict", b.Decision)
	}
	if b, _ := m.Begin(sc, "fp"); b.Decision != Conflict {
		t.Fatalf("a request that is no tool call: %v; want conflict", b.Decision)
	}
	if ki, _ := m.Info(sc); ki.Tool != "write" || ki.State != StateCommitUnknown {
		t.Fatalf("Info: %+v", ki)
	}
	if err := m.Forget(sc); err != nil {
		t.Fatalf("Forget: %v", err)
	}
	if n := m.ToolUnknowns(); n != 0 {
		t.Fatalf("ToolUnknowns after Forget: %d; want 0", n)
	}
	b, _ = m.BeginTool(sc, "fp", tool)
	if b.Decision != Miss {
		t.Fatalf("after Forget: %v; want miss", b.Decision)
	}
	b.Flight.SetHead(Head{Status: 200, ContentType: "application/json"})
	b.Flight.Commit([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`))
	clk.Advance(9 * time.Minute)
	if b, _ := m.BeginTool(sc, "fp", tool); b.Decision != Hit {
		t.Fatalf("within Keep: %v; want hit", b.Decision)
	}
	clk.Advance(2 * time.Minute)
	if b, _ := m.BeginTool(sc, "fp", tool); b.Decision != Miss {
		t.Fatalf("past Keep: %v; want miss", b.Decision)
	}

	// An LLM key left commit_unknown is free, as before.
	llm := Scope{Tenant: "t", Key: "llm"}
	b, _ = m.Begin(llm, "fp")
	b.Flight.Fail(StateCommitUnknown, "upstream_reset", nil)
	if b, _ := m.Begin(llm, "fp"); b.Decision != Miss {
		t.Fatalf("an LLM key's commit_unknown: %v; want miss", b.Decision)
	}
}

// TestToolBodyGoneNotRun: a committed tool call whose stored answer is
// gone (ristretto dropped or evicted it; Redis evicted the result) is Gone
// to its re-issue, never a Miss that would run the tool again, whatever
// MissingBody says for LLM keys.
func TestToolBodyGoneNotRun(t *testing.T) {
	tool := Tool{Name: "write", UnknownTTL: time.Hour}
	sc := Scope{Tenant: "t", Key: "gone"}
	commit := func(b Begun, err error) {
		t.Helper()
		if err != nil || b.Decision != Miss {
			t.Fatalf("first call: %v %v; want miss", b.Decision, err)
		}
		b.Flight.SetHead(Head{Status: 200, ContentType: "application/json"})
		if !b.Flight.Commit([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`)) {
			t.Fatal("Commit: got false")
		}
	}
	t.Run("memory", func(t *testing.T) {
		m := newMemory(t, Config{TTL: time.Hour, MissingBody: Regenerate})
		commit(m.BeginTool(sc, "fp", tool))
		m.DropBody(sc)
		if b, err := m.BeginTool(sc, "fp", tool); err != nil || b.Decision != Gone {
			t.Fatalf("re-issue after the body went: %v %v; want gone", b.Decision, err)
		}
	})
	t.Run("redis", func(t *testing.T) {
		r := replicas(t, 1)[0]
		commit(r.BeginTool(sc, "fp", tool))
		if err := r.c.Do(context.Background(), r.c.B().Del().Key(r.keys(sc).res).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if b, err := r.BeginTool(sc, "fp", tool); err != nil || b.Decision != Gone {
			t.Fatalf("re-issue after the result went: %v %v; want gone", b.Decision, err)
		}
	})
}

// TestToolForgetLapsedLease: a tool call's live record is not forgotten
// when its owner's lease lapsed (the owner may only be paused while the
// call runs on): DELETE is refused as for a running key.
func TestToolForgetLapsedLease(t *testing.T) {
	r := replicas(t, 1)[0]
	sc := Scope{Tenant: "t", Key: "lapsed"}
	b, err := r.BeginTool(sc, "fp", Tool{Name: "write", UnknownTTL: time.Hour})
	if err != nil || b.Decision != Miss {
		t.Fatalf("first call: %v %v; want miss", b.Decision, err)
	}
	expireLease(t, r, sc)
	if err := r.Forget(sc); !errors.Is(err, ErrLive) {
		t.Fatalf("Forget with the lease lapsed: %v; want ErrLive", err)
	}
	b.Flight.Fail(StateFailedRetryable, "test over", nil)
}

// tenantScore returns how long from Redis's clock sc's key still counts
// against its tenant (its member's score in the tenant's set).
func tenantScore(tb testing.TB, r *Redis, sc Scope) time.Duration {
	tb.Helper()
	ctx := context.Background()
	score, err := r.c.Do(ctx, r.c.B().Zscore().Key(r.tenantKey(sc)).Member(r.keys(sc).h).Build()).AsFloat64()
	if err != nil {
		tb.Fatalf("ZSCORE: %v", err)
	}
	now, err := r.c.Do(ctx, r.c.B().Time().Build()).AsStrSlice()
	if err != nil || len(now) != 2 {
		tb.Fatalf("TIME: %v %v", now, err)
	}
	s, _ := strconv.ParseInt(now[0], 10, 64)
	us, _ := strconv.ParseInt(now[1], 10, 64)
	return time.Duration(score-float64(s*1000+us/1000)) * time.Millisecond
}

// TestToolReapedHeld: a tool call whose owner died is reaped to
// commit_unknown, by a follower's idle check or by a claim of its
// re-issue; either way the reap is counted, the key is among the
// commit_unknown keys, and it counts against its tenant for as long as
// it is held (the tool's UnknownTTL), not for FailedTTL.
func TestToolReapedHeld(t *testing.T) {
	tool := Tool{Name: "write", UnknownTTL: 5 * time.Hour}
	within := func(got time.Duration) bool { return got > 4*time.Hour && got <= 5*time.Hour }
	first := func(t *testing.T, key string) ([]*Redis, Scope, *Flight) {
		t.Helper()
		rs := replicas(t, 2)
		sc := Scope{Tenant: "t", Key: key}
		b, err := rs[0].BeginTool(sc, "fp", tool)
		if err != nil || b.Decision != Miss {
			t.Fatalf("first call: %v %v; want miss", b.Decision, err)
		}
		return rs, sc, b.Flight
	}
	// relayed returns a store on a Redis of its own and one on the same
	// Redis through a relay that can lose a reply, and a tool call begun
	// on the first.
	relayed := func(t *testing.T, key string) (a, b *Redis, relay *redistest.Relay, sc Scope, f *Flight) {
		t.Helper()
		srv := redistest.Start(t)
		relay = redistest.NewRelay(t, srv.Addr)
		prefix := redistest.Prefix(t)
		a, b = newRedis(t, srv.Addr, prefix, nil), newRedis(t, relay.Addr, prefix, nil)
		sc = Scope{Tenant: "t", Key: key}
		begun, err := a.BeginTool(sc, "fp", tool)
		if err != nil || begun.Decision != Miss {
			t.Fatalf("first call: %v %v; want miss", begun.Decision, err)
		}
		return a, b, relay, sc, begun.Flight
	}
	// counted checks that r counted the reap of sc and holds its count
	// for the tool's UnknownTTL.
	counted := func(t *testing.T, r *Redis, sc Scope) {
		t.Helper()
		if n := r.Stats().Reaped; n != 1 {
			t.Errorf("reaped: got %d; want 1", n)
		}
		if n, err := r.UnknownKeys(); err != nil || n != 1 {
			t.Errorf("UnknownKeys: got %d, %v; want 1", n, err)
		}
		if got := tenantScore(t, r, sc); !within(got) {
			t.Errorf("the reaped tool call counts for its tenant %v more; want the tool's UnknownTTL (5h)", got)
		}
	}
	t.Run("follower", func(t *testing.T) {
		rs, sc, f := first(t, "followed")
		j, err := rs[1].BeginTool(sc, "fp", tool)
		if err != nil || j.Decision != Join {
			t.Fatalf("re-issue on the other replica: %v %v; want join", j.Decision, err)
		}
		f.be.(*owner).shutdown() // the owner's process is gone
		if st := waitDone(t, j.Flight, 3*testLease+time.Second); st != StateCommitUnknown {
			t.Fatalf("follower: got %v; want commit_unknown", st)
		}
		if got := tenantScore(t, rs[1], sc); !within(got) {
			t.Errorf("the reaped tool call counts for its tenant %v more; want the tool's UnknownTTL (5h)", got)
		}
		if n, err := rs[1].UnknownKeys(); err != nil || n != 1 {
			t.Errorf("UnknownKeys: got %d, %v; want 1", n, err)
		}
	})
	t.Run("claim", func(t *testing.T) {
		rs, sc, f := first(t, "claimed")
		f.be.(*owner).shutdown() // the owner's process is gone
		expireLease(t, rs[0], sc)
		u, err := rs[1].BeginTool(sc, "fp", tool)
		if err != nil || u.Decision != Unknown {
			t.Fatalf("re-issue after the owner died: %v %v; want unknown", u.Decision, err)
		}
		if n := rs[1].Stats().Reaped; n != 1 {
			t.Errorf("reaped: got %d; want 1", n)
		}
		if n := rs[1].ToolUnknowns(); n != 1 {
			t.Errorf("ToolUnknowns: got %d; want 1", n)
		}
		if n, err := rs[1].UnknownKeys(); err != nil || n != 1 {
			t.Errorf("UnknownKeys: got %d, %v; want 1", n, err)
		}
		if got := tenantScore(t, rs[1], sc); !within(got) {
			t.Errorf("the reaped tool call counts for its tenant %v more; want the tool's UnknownTTL (5h)", got)
		}
		// The reap's terminal entry made the journal (the call was never
		// mirrored): it must expire, as every key but the secret does.
		ttl, err := rs[1].c.Do(context.Background(), rs[1].c.B().Pttl().Key(rs[1].keys(sc).j).Build()).AsInt64()
		if err != nil || ttl <= 0 || ttl > journalTTL.Milliseconds() {
			t.Errorf("PTTL of the reaped call's journal: got %d, %v; want 1..%d ms", ttl, err, journalTTL.Milliseconds())
		}
	})
	// A follower's reap whose answer is lost: the terminal entry it reads
	// next names its token and the hold, so that its replica still counts
	// the reap and ends the count with the hold.
	t.Run("follower-reply-lost", func(t *testing.T) {
		_, b, relay, sc, f := relayed(t, "followed-lost")
		j, err := b.BeginTool(sc, "fp", tool)
		if err != nil || j.Decision != Join {
			t.Fatalf("re-issue on the other replica: %v %v; want join", j.Decision, err)
		}
		lost := relay.LoseReply("$6\r\nreaped\r\n", 0)
		f.be.(*owner).shutdown() // the owner's process is gone
		if st := waitDone(t, j.Flight, 3*testLease+2*time.Second); st != StateCommitUnknown {
			t.Fatalf("follower: got %v; want commit_unknown", st)
		}
		select {
		case <-lost:
		default:
			t.Fatal("no reap's answer was lost")
		}
		counted(t, b, sc)
	})
	// A claim that reaps the call and loses its reply is sent again
	// (rueidis retries the claim): the run that answers finds the call
	// already reaped, by this claim's own token, and answers the reap
	// again, so that its count ends with the hold too.
	t.Run("claim-reply-lost", func(t *testing.T) {
		a, b, relay, sc, f := relayed(t, "claimed-lost")
		f.be.(*owner).shutdown() // the owner's process is gone
		expireLease(t, a, sc)
		lost := relay.LoseReply("$7\r\nunknown\r\n", 0)
		u, err := b.BeginTool(sc, "fp", tool)
		select {
		case <-lost:
		default:
			t.Fatal("no claim's reply was lost")
		}
		if err != nil || u.Decision != Unknown {
			t.Fatalf("re-issue after the owner died: %v %v; want unknown", u.Decision, err)
		}
		counted(t, b, sc)
	})
}

// TestToolCommitCountsItsKeep: a committed tool call whose key stands for
// its own window (Tool.Keep) counts against its tenant for that window,
// as long as its records stand, not for the store's TTL.
func TestToolCommitCountsItsKeep(t *testing.T) {
	t.Parallel()
	r := replicas(t, 1)[0]
	sc := Scope{Tenant: "t", Key: "call"}
	b, err := r.BeginTool(sc, "fp", Tool{Name: "search", Keep: 10 * time.Minute})
	if err != nil || b.Flight == nil {
		t.Fatalf("BeginTool: %+v, %v; want a miss", b, err)
	}
	startStream(t, b.Flight)
	if !b.Flight.Commit(nil) {
		t.Fatal("Commit: got false")
	}
	if got := tenantScore(t, r, sc); got < 9*time.Minute || got > 10*time.Minute {
		t.Errorf("the committed call counts for its tenant %v more; want its keep (10m), not TTL (%v)", got, r.cfg.TTL)
	}
}
