package redis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"github.com/ssegate/ssegate/cache/internal/wiretest"
	"github.com/ssegate/ssegate/internal/doctable"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/redistest"
	"github.com/ssegate/ssegate/sse"
)

// TestRedisClaimAtomic: eight concurrent identical requests spread over
// two replicas cause one Miss; the other seven join, on either replica,
// and receive the owner's bytes and ids exactly; later requests replay.
func TestRedisClaimAtomic(t *testing.T) {
	t.Parallel()
	rs := replicas(t, 2)
	sc := cache.Scope{Tenant: "t", Key: "claim"}
	var wg sync.WaitGroup
	got := make([]cache.Begun, 8)
	start := make(chan struct{})
	for i := range got {
		wg.Go(func() {
			<-start
			got[i] = rbegin(t, rs[i%2], sc, "fp")
		})
	}
	close(start)
	wg.Wait()
	var owner *cache.Flight
	var joins []*cache.Flight
	for i, b := range got {
		switch b.Decision {
		case cache.Miss:
			if owner != nil {
				t.Fatalf("request %d: got a second miss; want exactly one", i)
			}
			owner = b.Flight
		case cache.Join:
			joins = append(joins, b.Flight)
		default:
			t.Fatalf("request %d: got %v; want miss or join", i, b.Decision)
		}
	}
	if owner == nil || len(joins) != 7 {
		t.Fatalf("got owner %v and %d joins; want 1 miss and 7 joins", owner != nil, len(joins))
	}
	subs := make([]*cache.Sub, len(joins))
	for i, f := range joins {
		if f.Gen != owner.Gen {
			t.Fatalf("join %d: generation %d; want %d", i, f.Gen, owner.Gen)
		}
		s, err := f.Subscribe(0)
		if err != nil {
			t.Fatal(err)
		}
		subs[i] = s
	}
	storetest.StartStream(t, owner)
	want := storetest.AppendN(t, owner, 1, 300)
	if !owner.Commit(nil) {
		t.Fatalf("Commit: got false; want the result kept")
	}
	for i, s := range subs {
		p, ended := wiretest.Follow(s, 5*time.Second)
		if !ended || !bytes.Equal(p, want) {
			t.Fatalf("join %d: got %d bytes (ended %v); want the owner's %d bytes", i, len(p), ended, len(want))
		}
		if state := waitDone(t, joins[i], time.Second); state != cache.StateCommitted {
			t.Fatalf("join %d: state %v; want committed", i, state)
		}
		if h, _ := joins[i].Head(); h.Header[0].Value != "req-1" {
			t.Fatalf("join %d: head %+v; want the owner's", i, h)
		}
	}
	for i, r := range rs {
		b := rbegin(t, r, sc, "fp")
		if b.Decision != cache.Hit || !bytes.Equal(b.Result.Data, want) || b.Result.Events() != 300 {
			t.Fatalf("replica %d after commit: got %v; want a hit with the same 300 events", i, b.Decision)
		}
		if b := rbegin(t, r, sc, "other"); b.Decision != cache.Conflict {
			t.Fatalf("replica %d, other fingerprint: got %v; want conflict", i, b.Decision)
		}
	}
	if n := commits(t, rs[0], sc); n != 1 {
		t.Fatalf("commits: got %d; want 1", n)
	}
}

// TestRedisReplay: a committed result replays on every replica with its
// head, events and ids, from any position; a non-streaming body too; and
// a failure reaches followers with the upstream's own answer.
func TestRedisReplay(t *testing.T) {
	t.Parallel()
	rs := replicas(t, 2)
	sc, a, want := ownedStream(t, rs[0], "replay", 40)
	a.Commit(nil)
	_, res, err := rs[1].Attach(sc, "", sse.ID{Gen: a.Gen, Seq: 25}, true)
	if err != nil {
		t.Fatalf("Attach after commit: %v", err)
	}
	p, _ := res.After(25)
	wiretest.CheckSeq(t, wiretest.ParseWire(t, p), a.Gen, 25, 40)
	if !bytes.Equal(res.Data, want) || res.Head.Header[0].Value != "req-1" {
		t.Fatal("result on the other replica: not the owner's bytes and head")
	}
	if _, _, err := rs[1].Attach(sc, "", sse.ID{Gen: a.Gen, Seq: 41}, true); !errors.Is(err, cache.ErrPosition) {
		t.Fatalf("resume past the end: got %v; want ErrPosition", err)
	}
	if _, _, err := rs[1].Attach(sc, "", sse.ID{Gen: a.Gen - 1, Seq: 1}, true); !errors.Is(err, cache.ErrGone) {
		t.Fatalf("resume in another generation: got %v; want ErrGone", err)
	}
	if _, _, err := rs[1].Attach(cache.Scope{Tenant: "other", Key: "replay"}, "", sse.ID{}, false); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("another tenant: got %v; want ErrNotFound", err)
	}

	t.Run("body", func(t *testing.T) {
		sc := cache.Scope{Tenant: "t", Key: "replay-body"}
		a := rbegin(t, rs[0], sc, "fp").Flight
		j := rbegin(t, rs[1], sc, "fp").Flight
		a.SetHead(cache.Head{Status: 200, ContentType: "application/json"})
		a.Commit([]byte(`{"ok":true}`))
		if state := waitDone(t, j, 2*time.Second); state != cache.StateCommitted {
			t.Fatalf("follower: %v; want committed", state)
		}
		if _, _, body := j.Outcome(); string(body) != `{"ok":true}` {
			t.Fatalf("follower body: %q", body)
		}
		if b := rbegin(t, rs[1], sc, "fp"); b.Decision != cache.Hit || string(b.Result.Data) != `{"ok":true}` {
			t.Fatalf("replay: got %v", b.Decision)
		}
	})
	t.Run("failure", func(t *testing.T) {
		sc := cache.Scope{Tenant: "t", Key: "replay-fail"}
		a := rbegin(t, rs[0], sc, "fp").Flight
		j := rbegin(t, rs[1], sc, "fp").Flight
		a.SetHead(cache.Head{Status: 400, ContentType: "application/json"})
		a.Fail(cache.StateFailedTerminal, "upstream_status_400", []byte(`{"error":1}`))
		if state := waitDone(t, j, 2*time.Second); state != cache.StateFailedTerminal {
			t.Fatalf("follower: %v; want failed_terminal", state)
		}
		if _, reason, body := j.Outcome(); reason != "upstream_status_400" || string(body) != `{"error":1}` {
			t.Fatalf("follower: got %q %q; want the owner's reason and body", reason, body)
		}
		if b := rbegin(t, rs[1], sc, "other-fp"); b.Decision != cache.Miss {
			t.Fatalf("after a failure: got %v; want miss", b.Decision)
		}
	})
}

// TestRedisUnavailable: with Redis down, Begin fails within the timeout
// with ErrUnavailable (never ErrStoreFull); once it is back, the same
// store works again without a restart.
func TestRedisUnavailable(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "ssg", func(c *Config) { c.Timeout = 300 * time.Millisecond })
	sc := cache.Scope{Tenant: "t", Key: "down"}
	for _, how := range []string{"paused", "killed"} {
		if how == "paused" {
			srv.Pause()
		} else {
			srv.Stop()
		}
		start := time.Now()
		_, err := r.Begin(sc, "fp")
		if !errors.Is(err, cache.ErrUnavailable) || errors.Is(err, cache.ErrStoreFull) {
			t.Fatalf("%s: Begin got %v; want ErrUnavailable", how, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("%s: Begin took %v; want about the timeout", how, d)
		}
		if err := r.Ping(context.Background()); err == nil {
			t.Fatalf("%s: Ping got nil; want an error", how)
		}
		if how == "paused" {
			srv.Resume()
		} else {
			srv.Restart()
		}
		eventually(t, 10*time.Second, func() error {
			b, err := r.Begin(sc, "fp")
			if err != nil {
				return fmt.Errorf("%s: Begin after Redis came back: %w", how, err)
			}
			if b.Flight != nil && b.Decision == cache.Miss {
				b.Flight.Fail(cache.StateFailedRetryable, "test", nil)
			}
			return nil
		})
	}
}

// TestRedisStartsWithoutRedis: a replica starts while Redis is down and
// works once it comes.
func TestRedisStartsWithoutRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Stop()
	r := newRedis(t, srv.Addr, "ssg", func(c *Config) { c.Timeout = 200 * time.Millisecond })
	if err := r.Ping(context.Background()); err == nil {
		t.Fatal("Ping with Redis down: got nil; want an error")
	}
	srv.Restart()
	eventually(t, 10*time.Second, func() error {
		if err := r.Ping(context.Background()); err != nil {
			return fmt.Errorf("Ping: Redis never became reachable: %w", err)
		}
		return nil
	})
}

// TestRedisOwnerStates: each row of ownerState's table, made the way the
// row says, leaves the owner in the state the row names (a move on to
// failed in the same call included), with the row's effect on Redis;
// commit and fence do nothing once the owner left live; and the rows
// tested here are the rows of the table.
func TestRedisOwnerStates(t *testing.T) {
	type move struct{ from, to ownerState }
	tested := map[move]bool{}
	// claim starts a stream owned by rs[0], with its owner in state from.
	claim := func(t *testing.T, rs []*Store, key string, from ownerState) (*cache.Flight, *owner, cache.Scope) {
		t.Helper()
		sc := cache.Scope{Tenant: "t", Key: key}
		f := rbegin(t, rs[0], sc, "fp").Flight
		storetest.StartStream(t, f)
		storetest.AppendN(t, f, 1, 3)
		o := f.Backend().(*owner)
		o.mu.Lock()
		o.state = from
		o.mu.Unlock()
		return f, o, sc
	}
	state := func(o *owner) ownerState {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.state
	}
	want := func(t *testing.T, o *owner, s ownerState) {
		t.Helper()
		if got := state(o); got != s {
			t.Fatalf("owner state %s; want %s", got, s)
		}
	}
	// recorded reports whether Redis holds the failure fail records.
	recorded := func(r *Store, sc cache.Scope) bool {
		ki, ok := r.Info(sc)
		return ok && ki.State == cache.StateFailedRetryable && ki.Reason == "test_failure"
	}

	t.Run("commit taken", func(t *testing.T) {
		rs := replicas(t, 1)
		f, o, _ := claim(t, rs, "owner-commit", ownerLive)
		if !f.Commit(nil) {
			t.Fatal("Commit: got false; want true")
		}
		want(t, o, ownerCommitting)
		tested[move{ownerLive, ownerCommitting}] = true
	})
	t.Run("fenced by a batch or the renewal, then failed", func(t *testing.T) {
		rs := replicas(t, 2)
		f, o, sc := claim(t, rs, "owner-fence", ownerLive)
		expireLease(t, rs[0], sc)
		if b := rbegin(t, rs[1], sc, "fp"); b.Decision != cache.Miss {
			t.Fatalf("claim after the lease expired: got %v; want miss", b.Decision)
		}
		if s := waitDone(t, f, 2*testLease); s != cache.StateCommitUnknown {
			t.Fatalf("stale owner: state %v; want commit_unknown", s)
		}
		want(t, o, ownerFailed)
		if rs[0].Stats().Fenced != 1 {
			t.Fatalf("fenced: got %d; want 1", rs[0].Stats().Fenced)
		}
		tested[move{ownerLive, ownerFenced}] = true
		tested[move{ownerFenced, ownerFailed}] = true
	})
	t.Run("commit refused, then failed", func(t *testing.T) {
		// The stale replica renews rarely: the commit is the first to
		// learn of the new owner.
		addr, prefix := redistest.Shared(t), redistest.Prefix(t)
		rs := []*Store{
			newRedis(t, addr, prefix, func(c *Config) { c.Lease = time.Minute }),
			newRedis(t, addr, prefix, nil),
		}
		f, o, sc := claim(t, rs, "owner-refused", ownerLive)
		// The flusher has nothing in flight for Redis to refuse first.
		eventually(t, 2*time.Second, func() error {
			if ki, _ := rs[0].Info(sc); ki.Events != 3 {
				return fmt.Errorf("the journal did not reach Redis: %d events; want 3", ki.Events)
			}
			return nil
		})
		expireLease(t, rs[0], sc)
		if b := rbegin(t, rs[1], sc, "fp"); b.Decision != cache.Miss {
			t.Fatalf("claim after the lease expired: got %v; want miss", b.Decision)
		}
		if f.Commit(nil) {
			t.Fatal("stale owner's Commit: got true; want it refused")
		}
		if _, reason, _ := f.Outcome(); reason != cache.ReasonGenerationLost {
			t.Fatalf("stale owner: reason %q; want generation_lost (the commit refused)", reason)
		}
		want(t, o, ownerFailed)
		tested[move{ownerLive, ownerCommitting}] = true
		tested[move{ownerCommitting, ownerFenced}] = true
		tested[move{ownerFenced, ownerFailed}] = true
	})
	for _, from := range []ownerState{ownerLive, ownerCommitting, ownerFenced} {
		t.Run("failed from "+from.String(), func(t *testing.T) {
			rs := replicas(t, 1)
			f, o, sc := claim(t, rs, "owner-fail-"+from.String(), from)
			f.Fail(cache.StateFailedRetryable, "test_failure", nil)
			want(t, o, ownerFailed)
			if got, w := recorded(rs[0], sc), from != ownerFenced; got != w {
				t.Fatalf("the failure recorded in Redis: %v; want %v", got, w)
			}
			o.Fail(f, cache.StateFailedTerminal, "second") // failed is final
			want(t, o, ownerFailed)
			tested[move{from, ownerFailed}] = true
		})
	}
	for _, from := range []ownerState{ownerCommitting, ownerFenced, ownerFailed} {
		t.Run("fence and commit from "+from.String(), func(t *testing.T) {
			rs := replicas(t, 1)
			f, o, _ := claim(t, rs, "owner-stay-"+from.String(), from)
			o.fence(cache.ReasonGenerationLost)
			want(t, o, from)
			select {
			case <-f.Done():
				t.Fatal("a fence after the owner left live ended the flight")
			default:
			}
			go f.Fail(cache.StateFailedRetryable, "test_failure", nil)
			if o.Commit(f, &cache.Result{}) {
				t.Fatal("commit after the owner left live: got true; want false")
			}
		})
	}

	table := ownerTable(t)
	for m := range table {
		if !tested[m] {
			t.Errorf("ownerState's table has %s → %s; no case makes it", m.from, m.to)
		}
	}
	for m := range tested {
		if !table[m] {
			t.Errorf("%s → %s is made, but is not in ownerState's table", m.from, m.to)
		}
	}
}

// ownerTable reads the rows (from, to) of ownerState's table from its
// comment in owner.go.
func ownerTable(t *testing.T) map[struct{ from, to ownerState }]bool {
	t.Helper()
	states := map[string]ownerState{}
	for s := range ownerState(len(ownerStates)) {
		states[s.String()] = s
	}
	rows := map[struct{ from, to ownerState }]bool{}
	for _, line := range doctable.Rows(t, "owner.go", "ownerState") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		from, ok1 := states[f[0]]
		to, ok2 := states[f[1]]
		if ok1 && ok2 {
			rows[struct{ from, to ownerState }{from, to}] = true
		}
	}
	if len(rows) == 0 {
		t.Fatal("no rows found in ownerState's comment")
	}
	return rows
}

// TestRedisOwnerStateString: each state has its name.
func TestRedisOwnerStateString(t *testing.T) {
	want := []string{"live", "committing", "fenced", "failed"}
	for s, name := range want {
		if got := ownerState(s).String(); got != name {
			t.Errorf("ownerState(%d).String() = %q; want %q", s, got, name)
		}
	}
	if got := ownerState(len(want)).String(); got != "ownerState(4)" {
		t.Errorf("an unknown state: %q", got)
	}
}

// TestRedisKeyInfoModel: the model and fallbacks a generation records go
// to Redis with its marks, so that another replica's GET /keys names the
// model that answered, live and after the commit.
func TestRedisKeyInfoModel(t *testing.T) {
	t.Parallel()
	rs := replicas(t, 2)
	sc := cache.Scope{Tenant: "t", Key: "model"}
	f := rbegin(t, rs[0], sc, "fp").Flight
	fbs := []cache.Fallback{{Model: "gpt-4o", Reason: "upstream_status_429"}}
	f.SetModel("gpt-4o-mini", fbs)
	f.Mark(cache.StateExecutionStarted, 2, 429)
	want := func(what string) {
		t.Helper()
		eventually(t, 5*time.Second, func() error {
			ki, ok := rs[1].Info(sc)
			if ok && ki.Model == "gpt-4o-mini" && len(ki.Fallbacks) == 1 && ki.Fallbacks[0] == fbs[0] {
				return nil
			}
			return fmt.Errorf("%s: the other replica's key info %+v (found %v); want model gpt-4o-mini after gpt-4o", what, ki, ok)
		})
	}
	want("live")
	f.SetHead(cache.Head{Status: 200, ContentType: "text/event-stream", Stream: true})
	if _, err := f.Append("", `{"x":1}`); err != nil {
		t.Fatal(err)
	}
	f.Commit(nil)
	want("committed")
}

// TestRedisAbandonBeforeClaim: a claim whose bytes reach Redis only after
// its caller gave up and the clean-up of its outcome (abandon) ran, on
// another connection, takes nothing: the clean-up fenced its token. Left
// unfenced, the late claim made a live generation with a lease that no
// replica owned: a re-issue joined it, and a tool call was then reaped to
// commit_unknown and held, though it never ran.
func TestRedisAbandonBeforeClaim(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	relay := redistest.NewRelay(t, srv.Addr)
	prefix := redistest.Prefix(t)
	const lease, timeout = 8 * time.Second, time.Second
	mod := func(c *Config) { c.Lease, c.Timeout = lease, timeout }
	a := newRedis(t, relay.Addr, prefix, mod)
	b := newRedis(t, srv.Addr, prefix, mod)
	sc := cache.Scope{Tenant: "t", Key: "late"}
	tool := cache.Tool{Name: "search"}
	const fp = "fp-of-the-late-claim" // the claim carries it, the clean-up not
	held := relay.HoldRequest(fp)
	_, err := a.BeginTool(sc, fp, tool)
	select {
	case <-held.Caught:
	default:
		t.Fatal("the claim was not held")
	}
	if !errors.Is(err, cache.ErrUnavailable) {
		t.Fatalf("the held claim: got %v; want ErrUnavailable", err)
	}
	held.Cut() // the clean-up goes on another connection
	eventually(t, 5*time.Second, func() error {
		if n := a.abandoning.Load(); n != 0 {
			return fmt.Errorf("the clean-up still runs (%d)", n)
		}
		return nil
	})
	if n := a.Stats().Abandoned; n != 0 {
		t.Fatalf("abandoned: got %d; want 0: the claim had not run", n)
	}
	if err := held.Deliver(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if ki, ok := b.Info(sc); ok {
		t.Fatalf("after the late claim Redis holds generation %d (%s); want no record", ki.Generation, ki.State)
	}
	got, err := b.BeginTool(sc, fp, tool)
	if err != nil || got.Decision != cache.Miss {
		t.Fatalf("the re-issue: got %v, %v; want a miss: the late claim took nothing", got.Decision, err)
	}
	got.Flight.Fail(cache.StateFailedRetryable, "test", nil)
}

// TestRedisClaimReplyLost: a claim that ran in Redis and whose answer was
// lost is sent again with its token and takes its own claim: Miss, of the
// generation Redis holds, with what the first run answered (regenerated)
// kept. One whose answer stays lost past the timeout fails with
// ErrUnavailable, and its generation is ended failed_retryable as soon as
// Redis answers, so that a replica that joined it meanwhile ends at once
// and the next claim is a miss.
func TestRedisClaimReplyLost(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	relay := redistest.NewRelay(t, srv.Addr)
	prefix := redistest.Prefix(t)
	const lease, timeout = 8 * time.Second, time.Second
	mod := func(c *Config) { c.Lease, c.Timeout = lease, timeout }
	a := newRedis(t, relay.Addr, prefix, mod)
	b := newRedis(t, srv.Addr, prefix, mod)

	t.Run("cut", func(t *testing.T) {
		sc := cache.Scope{Tenant: "t", Key: "cut"}
		// A committed key whose body is gone: its claim regenerates.
		f := rbegin(t, b, sc, "fp").Flight
		f.SetHead(cache.Head{Status: 200, ContentType: "application/json"})
		f.Commit([]byte(`{}`))
		if _, err := redistest.Command(srv.Addr, time.Second, "DEL", b.keys(sc).res); err != nil {
			t.Fatal(err)
		}
		got := claimReplyCut(t, relay, a, b, sc)
		if !got.Regenerated {
			t.Fatal("the claim's own miss: not regenerated; want it regenerated")
		}
		got.Flight.Fail(cache.StateFailedRetryable, "test", nil)
	})
	t.Run("timeout", func(t *testing.T) {
		sc := cache.Scope{Tenant: "t", Key: "timeout"}
		lost := relay.LoseReply("$4\r\nmiss\r\n", timeout+200*time.Millisecond)
		done := make(chan error, 1)
		go func() {
			_, err := a.Begin(sc, "fp")
			done <- err
		}()
		select {
		case <-lost:
		case err := <-done:
			t.Fatalf("Begin ended (%v) before its claim's reply was lost", err)
		}
		j := rbegin(t, b, sc, "fp")
		if j.Decision != cache.Join {
			t.Fatalf("duplicate meanwhile: got %v; want a join", j.Decision)
		}
		if err := <-done; !errors.Is(err, cache.ErrUnavailable) {
			t.Fatalf("the lost claim: got %v; want ErrUnavailable", err)
		}
		if state := waitDone(t, j.Flight, lease/2); state != cache.StateFailedRetryable {
			t.Fatalf("the joiner: got %v; want failed_retryable", state)
		}
		if _, reason, _ := j.Flight.Outcome(); reason != cache.ReasonStoreUnavailable {
			t.Fatalf("the joiner: reason %q; want store_unavailable", reason)
		}
		eventually(t, time.Second, func() error {
			if n := a.Stats().Abandoned; n != 1 {
				return fmt.Errorf("abandoned: got %d; want 1", n)
			}
			return nil
		})
		if got := rbegin(t, a, sc, "fp"); got.Decision != cache.Miss {
			t.Fatalf("the retry: got %v; want miss", got.Decision)
		} else {
			got.Flight.Fail(cache.StateFailedRetryable, "test", nil)
		}
	})
}

// TestRedisAbandonUncountsAccounts: a claim of a key with two accounts
// counts it in the second's set (countMore) before the claim that takes
// it; when that claim's bytes never reach Redis and its caller gives up,
// the clean-up that finds it never ran takes the key out of that set.
// Left there, the account refused new keys for LiveTTL as if it held one.
func TestRedisAbandonUncountsAccounts(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	relay := redistest.NewRelay(t, srv.Addr)
	prefix := redistest.Prefix(t)
	const lease, timeout = 8 * time.Second, time.Second
	mod := func(c *Config) { c.Lease, c.Timeout, c.MaxKeysPerTenant = lease, timeout, 1 }
	a := newRedis(t, relay.Addr, prefix, mod)
	b := newRedis(t, srv.Addr, prefix, mod)
	sc := cache.Scope{Tenant: "t", Key: "lost", Accounts: []string{"first", "shared"}}
	// The second round's claim, which asks Redis to count the key (ask
	// "1"; the first asked "2"): refuse "0", ask "1", tool "", its ttl "0".
	held := relay.HoldRequest("$1\r\n0\r\n$1\r\n1\r\n$0\r\n\r\n$1\r\n0\r\n")
	_, err := a.Begin(sc, "fp")
	select {
	case <-held.Caught:
	default:
		t.Fatal("the claim was not held")
	}
	if !errors.Is(err, cache.ErrUnavailable) {
		t.Fatalf("the held claim: got %v; want ErrUnavailable", err)
	}
	held.Cut()
	eventually(t, 5*time.Second, func() error {
		if n := a.abandoning.Load(); n != 0 {
			return fmt.Errorf("the clean-up still runs (%d)", n)
		}
		return nil
	})
	other := cache.Scope{Tenant: "u", Key: "next", Accounts: []string{"another", "shared"}}
	got, err := b.Begin(other, "fp2")
	if err != nil || got.Decision != cache.Miss {
		t.Fatalf("a key of the shared account after the lost claim: got %v, %v; want a miss: the account holds no key", got.Decision, err)
	}
	got.Flight.Fail(cache.StateFailedRetryable, "test", nil)
}

// TestRedisFullKeepsOthersCount: a claim that a bound refuses after it
// counted its key in its second account's set takes out only what it
// added there: a concurrent claim of the same key that counted it there
// first, and may take the key, keeps its count. Before, the refused
// claim removed the member, and the key went uncounted in that account.
func TestRedisFullKeepsOthersCount(t *testing.T) {
	t.Parallel()
	addr := redistest.Shared(t)
	prefix := redistest.Prefix(t)
	r := newRedis(t, addr, prefix, func(c *Config) { c.MaxKeysPerTenant = 1 })
	busy := rbegin(t, r, cache.Scope{Tenant: "t", Key: "busy", Accounts: []string{"full"}}, "fp").Flight
	defer busy.Fail(cache.StateFailedRetryable, "test", nil)
	sc := cache.Scope{Tenant: "t", Key: "raced", Accounts: []string{"full", "shared"}}
	k := r.keys(sc)
	// Another claim of the key, by credentials "other" and "shared",
	// counted it in "shared" first.
	ctx, cancel := r.opCtx()
	defer cancel()
	set := r.accountKey("shared")
	if err := run(ctx, r.c, quotaScript, quotaArgs{set: set, member: k.h, bound: 1, liveTTL: r.cfg.LiveTTL, setTTL: r.setTTL()}).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Begin(sc, "fp"); !errors.Is(err, cache.ErrTenantFull) {
		t.Fatalf("a key of the full account: got %v; want ErrTenantFull", err)
	}
	if err := r.c.Do(ctx, r.c.B().Zscore().Key(set).Member(k.h).Build()).Error(); err != nil {
		t.Fatalf("the other claim's count in the shared account after the refused claim: %v; want it kept", err)
	}
}

// TestRedisForgetKeepsFence: a Forget of a key whose record holds a
// claim's fence (abandonScript) keeps the fence, for the lease or
// FailedTTL, so that the claim, should it land after both, takes nothing.
// Before, Forget deleted the record with its fence.
func TestRedisForgetKeepsFence(t *testing.T) {
	t.Parallel()
	r := newRedis(t, redistest.Shared(t), redistest.Prefix(t), nil)
	sc := cache.Scope{Tenant: "t", Key: "fenced"}
	f := rbegin(t, r, sc, "fp").Flight
	storetest.StartStream(t, f)
	storetest.AppendN(t, f, 1, 1)
	if !f.Commit(nil) {
		t.Fatal("Commit: got false; want true")
	}
	k := r.keys(sc)
	ctx, cancel := r.opCtx()
	defer cancel()
	const tok = "a-lost-claims-token"
	if err := run(ctx, r.c, abandonScript, abandonArgs{keys: k.withoutResult, tok: tok, stTTL: r.cfg.FailedTTL, now: r.cfg.Now()}).Error(); err != nil {
		t.Fatal(err)
	}
	if err := r.Forget(sc); err != nil {
		t.Fatalf("Forget: got %v; want none", err)
	}
	got, err := r.c.Do(ctx, r.c.B().Hget().Key(k.st).Field("abandoned").Build()).ToString()
	if err != nil || got != tok {
		t.Fatalf("the fence after Forget: got %q, %v; want %q", got, err, tok)
	}
	if _, ok := r.Info(sc); ok {
		t.Fatal("Info after Forget: the key has a record; want none")
	}
}

// TestToolBodyGoneNotRun: a committed tool call whose stored answer is
// gone (ristretto dropped or evicted it; Redis evicted the result) is Gone
// to its re-issue, never a Miss that would run the tool again, whatever
// MissingBody says for LLM keys.
func TestToolBodyGoneNotRun(t *testing.T) {
	tool := cache.Tool{Name: "write", UnknownTTL: time.Hour}
	sc := cache.Scope{Tenant: "t", Key: "gone"}
	commit := func(b cache.Begun, err error) {
		t.Helper()
		if err != nil || b.Decision != cache.Miss {
			t.Fatalf("first call: %v %v; want miss", b.Decision, err)
		}
		b.Flight.SetHead(cache.Head{Status: 200, ContentType: "application/json"})
		if !b.Flight.Commit([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`)) {
			t.Fatal("Commit: got false")
		}
	}
	r := replicas(t, 1)[0]
	commit(r.BeginTool(sc, "fp", tool))
	if err := r.c.Do(context.Background(), r.c.B().Del().Key(r.keys(sc).res).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if b, err := r.BeginTool(sc, "fp", tool); err != nil || b.Decision != cache.Gone {
		t.Fatalf("re-issue after the result went: %v %v; want gone", b.Decision, err)
	}
}

// TestToolForgetLapsedLease: a tool call's live record is not forgotten
// when its owner's lease lapsed (the owner may only be paused while the
// call runs on): DELETE is refused as for a running key.
func TestToolForgetLapsedLease(t *testing.T) {
	r := replicas(t, 1)[0]
	sc := cache.Scope{Tenant: "t", Key: "lapsed"}
	b, err := r.BeginTool(sc, "fp", cache.Tool{Name: "write", UnknownTTL: time.Hour})
	if err != nil || b.Decision != cache.Miss {
		t.Fatalf("first call: %v %v; want miss", b.Decision, err)
	}
	expireLease(t, r, sc)
	if err := r.Forget(sc); !errors.Is(err, cache.ErrLive) {
		t.Fatalf("Forget with the lease lapsed: %v; want ErrLive", err)
	}
	b.Flight.Fail(cache.StateFailedRetryable, "test over", nil)
}

// tenantScore returns how long from Redis's clock sc's key still counts
// against its tenant (its member's score in the tenant's set).
func tenantScore(tb testing.TB, r *Store, sc cache.Scope) time.Duration {
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
	tool := cache.Tool{Name: "write", UnknownTTL: 5 * time.Hour}
	within := func(got time.Duration) bool { return got > 4*time.Hour && got <= 5*time.Hour }
	first := func(t *testing.T, key string) ([]*Store, cache.Scope, *cache.Flight) {
		t.Helper()
		rs := replicas(t, 2)
		sc := cache.Scope{Tenant: "t", Key: key}
		b, err := rs[0].BeginTool(sc, "fp", tool)
		if err != nil || b.Decision != cache.Miss {
			t.Fatalf("first call: %v %v; want miss", b.Decision, err)
		}
		return rs, sc, b.Flight
	}
	// relayed returns a store on a Redis of its own and one on the same
	// Redis through a relay that can lose a reply, and a tool call begun
	// on the first.
	relayed := func(t *testing.T, key string) (a, b *Store, relay *redistest.Relay, sc cache.Scope, f *cache.Flight) {
		t.Helper()
		srv := redistest.Start(t)
		relay = redistest.NewRelay(t, srv.Addr)
		prefix := redistest.Prefix(t)
		a, b = newRedis(t, srv.Addr, prefix, nil), newRedis(t, relay.Addr, prefix, nil)
		sc = cache.Scope{Tenant: "t", Key: key}
		begun, err := a.BeginTool(sc, "fp", tool)
		if err != nil || begun.Decision != cache.Miss {
			t.Fatalf("first call: %v %v; want miss", begun.Decision, err)
		}
		return a, b, relay, sc, begun.Flight
	}
	// counted checks that r counted the reap of sc and holds its count
	// for the tool's UnknownTTL.
	counted := func(t *testing.T, r *Store, sc cache.Scope) {
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
		if err != nil || j.Decision != cache.Join {
			t.Fatalf("re-issue on the other replica: %v %v; want join", j.Decision, err)
		}
		f.Backend().(*owner).shutdown() // the owner's process is gone
		if st := waitDone(t, j.Flight, 3*testLease+time.Second); st != cache.StateCommitUnknown {
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
		f.Backend().(*owner).shutdown() // the owner's process is gone
		expireLease(t, rs[0], sc)
		u, err := rs[1].BeginTool(sc, "fp", tool)
		if err != nil || u.Decision != cache.Unknown {
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
		if err != nil || j.Decision != cache.Join {
			t.Fatalf("re-issue on the other replica: %v %v; want join", j.Decision, err)
		}
		lost := relay.LoseReply("$6\r\nreaped\r\n", 0)
		f.Backend().(*owner).shutdown() // the owner's process is gone
		if st := waitDone(t, j.Flight, 3*testLease+2*time.Second); st != cache.StateCommitUnknown {
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
		f.Backend().(*owner).shutdown() // the owner's process is gone
		expireLease(t, a, sc)
		lost := relay.LoseReply("$7\r\nunknown\r\n", 0)
		u, err := b.BeginTool(sc, "fp", tool)
		select {
		case <-lost:
		default:
			t.Fatal("no claim's reply was lost")
		}
		if err != nil || u.Decision != cache.Unknown {
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
	sc := cache.Scope{Tenant: "t", Key: "call"}
	b, err := r.BeginTool(sc, "fp", cache.Tool{Name: "search", Keep: 10 * time.Minute})
	if err != nil || b.Flight == nil {
		t.Fatalf("BeginTool: %+v, %v; want a miss", b, err)
	}
	storetest.StartStream(t, b.Flight)
	if !b.Flight.Commit(nil) {
		t.Fatal("Commit: got false")
	}
	if got := tenantScore(t, r, sc); got < 9*time.Minute || got > 10*time.Minute {
		t.Errorf("the committed call counts for its tenant %v more; want its keep (10m), not TTL (%v)", got, r.cfg.TTL)
	}
}

// TestRedisContracts runs the contracts every store keeps
// (storetest.Contracts) against a Redis store.
func TestRedisContracts(t *testing.T) {
	addr := redistest.Shared(t)
	for _, c := range storetest.Contracts {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			c.Run(t, newRedis(t, addr, redistest.Prefix(t), func(cfg *Config) { cfg.MaxKeys, cfg.Limits = c.MaxKeys, c.Limits }))
		})
	}
}

// TestRedisAliasTenants holds aliases to their tenants across two
// replicas: set on one, resolved on the other (storetest.AliasTenants).
func TestRedisAliasTenants(t *testing.T) {
	t.Parallel()
	rs := replicas(t, 2)
	storetest.AliasTenants(t, rs[0], rs[1])
}

// A Redis store is a store of the contracts' (storetest.Store, AliasStore).
var (
	_ storetest.Store      = (*Store)(nil)
	_ storetest.AliasStore = (*Store)(nil)
)
