package cache

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"github.com/klauspost/compress/zstd"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/ssegate/ssegate/internal/redistest"
	"github.com/ssegate/ssegate/sse"
)

// These tests run the Redis store against a real redis-server: the one CI
// starts (SSEGATE_REDIS_ADDR) or one of their own. Two stores on one
// Redis are two replicas in one process.

const testLease = 400 * time.Millisecond

// newRedis returns a store on addr with the test's key prefix, closed when
// the test ends.
func newRedis(tb testing.TB, addr, prefix string, mod func(*RedisConfig)) *Redis {
	tb.Helper()
	cfg := RedisConfig{URL: "redis://" + addr, Prefix: prefix, Lease: testLease, Timeout: time.Second}
	if mod != nil {
		mod(&cfg)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r, err := NewRedis(cfg)
	if err != nil {
		tb.Fatalf("NewRedis: got error %v; want none", err)
	}
	tb.Cleanup(r.Close)
	return r
}

// replicas returns n stores sharing one Redis and one prefix.
func replicas(tb testing.TB, n int) []*Redis {
	tb.Helper()
	addr := redistest.Shared(tb)
	prefix := redistest.Prefix(tb)
	rs := make([]*Redis, n)
	for i := range rs {
		rs[i] = newRedis(tb, addr, prefix, nil)
	}
	return rs
}

func rbegin(tb testing.TB, r *Redis, sc Scope, fp string) Begun {
	tb.Helper()
	b, err := r.Begin(sc, fp)
	if err != nil {
		tb.Fatalf("Begin(%v): got error %v; want none", sc, err)
	}
	return b
}

func startStream(tb testing.TB, f *Flight) {
	tb.Helper()
	f.Mark(StateExecutionStarted, 1, 200)
	f.SetHead(Head{Status: 200, ContentType: "text/event-stream", Stream: true,
		Header: []Header{{Name: "X-Request-Id", Value: "req-1"}}})
}

// waitDone waits for f to end and returns its outcome.
func waitDone(tb testing.TB, f *Flight, within time.Duration) State {
	tb.Helper()
	select {
	case <-f.Done():
	case <-time.After(within):
		tb.Fatalf("flight %d: not ended after %v", f.Gen, within)
	}
	state, _, _ := f.Outcome()
	return state
}

func commits(tb testing.TB, r *Redis, sc Scope) int64 {
	tb.Helper()
	n, err := r.c.Do(context.Background(), r.c.B().Hget().Key(r.keys(sc).st).Field("commits").Build()).AsInt64()
	if err != nil && !rueidis.IsRedisNil(err) {
		tb.Fatalf("HGET commits: %v", err)
	}
	return n
}

// TestRedisClaimAtomic: eight concurrent identical requests spread over
// two replicas cause one Miss; the other seven join, on either replica,
// and receive the owner's bytes and ids exactly; later requests replay.
func TestRedisClaimAtomic(t *testing.T) {
	rs := replicas(t, 2)
	sc := Scope{Tenant: "t", Key: "claim"}
	var wg sync.WaitGroup
	got := make([]Begun, 8)
	start := make(chan struct{})
	for i := range got {
		wg.Go(func() {
			<-start
			got[i] = rbegin(t, rs[i%2], sc, "fp")
		})
	}
	close(start)
	wg.Wait()
	var owner *Flight
	var joins []*Flight
	for i, b := range got {
		switch b.Decision {
		case Miss:
			if owner != nil {
				t.Fatalf("request %d: got a second miss; want exactly one", i)
			}
			owner = b.Flight
		case Join:
			joins = append(joins, b.Flight)
		default:
			t.Fatalf("request %d: got %v; want miss or join", i, b.Decision)
		}
	}
	if owner == nil || len(joins) != 7 {
		t.Fatalf("got owner %v and %d joins; want 1 miss and 7 joins", owner != nil, len(joins))
	}
	subs := make([]*Sub, len(joins))
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
	startStream(t, owner)
	want := appendN(t, owner, 1, 300)
	if !owner.Commit(nil) {
		t.Fatalf("Commit: got false; want the result kept")
	}
	for i, s := range subs {
		p, ended := follow(s, 5*time.Second)
		if !ended || !bytes.Equal(p, want) {
			t.Fatalf("join %d: got %d bytes (ended %v); want the owner's %d bytes", i, len(p), ended, len(want))
		}
		if state := waitDone(t, joins[i], time.Second); state != StateCommitted {
			t.Fatalf("join %d: state %v; want committed", i, state)
		}
		if h, _ := joins[i].Head(); h.Header[0].Value != "req-1" {
			t.Fatalf("join %d: head %+v; want the owner's", i, h)
		}
	}
	for i, r := range rs {
		b := rbegin(t, r, sc, "fp")
		if b.Decision != Hit || !bytes.Equal(b.Result.Data, want) || b.Result.Events() != 300 {
			t.Fatalf("replica %d after commit: got %v; want a hit with the same 300 events", i, b.Decision)
		}
		if b := rbegin(t, r, sc, "other"); b.Decision != Conflict {
			t.Fatalf("replica %d, other fingerprint: got %v; want conflict", i, b.Decision)
		}
	}
	if n := commits(t, rs[0], sc); n != 1 {
		t.Fatalf("commits: got %d; want 1", n)
	}
}

// TestRedisTailNoGap: clients resume on another replica at random
// positions while the owner appends, some while their replica's tail is
// still catching up; each gets exactly the events after its position.
func TestRedisTailNoGap(t *testing.T) {
	rs := replicas(t, 2)
	sc := Scope{Tenant: "t", Key: "tail"}
	owner := rbegin(t, rs[0], sc, "fp").Flight
	startStream(t, owner)
	const n = 2000
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for c := range 20 {
		wg.Go(func() {
			time.Sleep(time.Duration(c) * 15 * time.Millisecond)
			after := uint64(rand.IntN(max(owner.Events(), 1)))
			f, res, err := rs[1].Attach(sc, "fp", sse.ID{Gen: owner.Gen, Seq: after}, true)
			if err != nil {
				errs <- err
				return
			}
			if f == nil { // a late client: the stream was committed already
				p, _ := res.After(after)
				checkSeq(t, parseWire(t, p), owner.Gen, after, n)
				return
			}
			s, err := f.Subscribe(after)
			if err != nil {
				errs <- err
				return
			}
			p, ended := follow(s, 5*time.Second)
			if !ended {
				errs <- errors.New("stream did not end")
				return
			}
			checkSeq(t, parseWire(t, p), owner.Gen, after, n)
		})
	}
	for i := 1; i <= n; i++ {
		appendN(t, owner, i, 1)
		if i%10 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if !owner.Commit(nil) {
		t.Fatal("Commit: got false; want true")
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := rs[1].Stats()
	if st.Tails != 1 {
		t.Fatalf("tails on the other replica: got %d; want 1 for all its clients", st.Tails)
	}
	// The whole stream went to Redis in far fewer round trips than events.
	if b := rs[0].Stats().Batches; b >= n {
		t.Fatalf("append batches: got %d for %d events; want batching", b, n)
	}
}

// TestRedisFencing: an owner whose lease was lost and whose key another
// replica claimed can neither append nor commit; its flight fails, so its
// own clients get stream_aborted, and the new owner's result stands.
func TestRedisFencing(t *testing.T) {
	t.Run("commit", func(t *testing.T) {
		rs := replicas(t, 2)
		sc := Scope{Tenant: "t", Key: "fence-commit"}
		a := rbegin(t, rs[0], sc, "fp").Flight
		startStream(t, a)
		appendN(t, a, 1, 5)
		expireLease(t, rs[0], sc)
		b := rbegin(t, rs[1], sc, "fp")
		if b.Decision != Miss || b.Flight.Gen <= a.Gen {
			t.Fatalf("claim after the lease expired: got %v gen %d; want a miss with a newer generation than %d", b.Decision, b.Flight.Gen, a.Gen)
		}
		// This append may land before the fence is noticed (never in Redis),
		// or find the flight already failed by it.
		if _, err := a.Append("", "6"); err != nil && !errors.Is(err, ErrEnded) {
			t.Fatalf("stale owner's Append: got %v; want none or ErrEnded", err)
		}
		if a.Commit(nil) {
			t.Fatal("stale owner's Commit: got true; want it refused")
		}
		if state, reason, _ := a.Outcome(); state == StateCommitted || reason != "generation_lost" {
			t.Fatalf("stale owner: got %v (%s); want a failure with generation_lost", state, reason)
		}
		startStream(t, b.Flight)
		want := appendN(t, b.Flight, 1, 3)
		if !b.Flight.Commit(nil) {
			t.Fatal("new owner's Commit: got false; want true")
		}
		if r := rbegin(t, rs[0], sc, "fp"); r.Decision != Hit || !bytes.Equal(r.Result.Data, want) {
			t.Fatalf("replay: got %v; want the new owner's result", r.Decision)
		}
		if n := commits(t, rs[0], sc); n != 1 {
			t.Fatalf("commits: got %d; want 1", n)
		}
	})
	t.Run("append", func(t *testing.T) {
		rs := replicas(t, 2)
		sc := Scope{Tenant: "t", Key: "fence-append"}
		a := rbegin(t, rs[0], sc, "fp").Flight
		startStream(t, a)
		sub, _ := a.Subscribe(0)
		appendN(t, a, 1, 5)
		expireLease(t, rs[0], sc)
		if b := rbegin(t, rs[1], sc, "fp"); b.Decision != Miss {
			t.Fatalf("claim after the lease expired: got %v; want miss", b.Decision)
		}
		// The stale owner learns of it from its next batch or renewal,
		// without committing anything.
		deadline := time.Now().Add(2 * testLease)
		for i := 6; time.Now().Before(deadline); i++ {
			if _, err := a.Append("", "x"); err != nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if state := waitDone(t, a, testLease); state != StateCommitUnknown {
			t.Fatalf("stale owner: state %v; want commit_unknown", state)
		}
		if _, ended := follow(sub, time.Second); !ended {
			t.Fatal("stale owner's client: stream did not end")
		}
		if rs[0].Stats().Fenced != 1 {
			t.Fatalf("fenced: got %d; want 1", rs[0].Stats().Fenced)
		}
	})
	t.Run("pause without reap", func(t *testing.T) {
		rs := replicas(t, 1)
		sc := Scope{Tenant: "t", Key: "fence-none"}
		a := rbegin(t, rs[0], sc, "fp").Flight
		startStream(t, a)
		expireLease(t, rs[0], sc)
		time.Sleep(testLease / 2) // the renewal sets the lease again: nobody took over
		appendN(t, a, 1, 3)
		if !a.Commit(nil) {
			t.Fatal("Commit: got false; want true (no other replica claimed the key)")
		}
	})
}

// expireLease deletes a generation's lease, as its expiry would.
func expireLease(tb testing.TB, r *Redis, sc Scope) {
	tb.Helper()
	if err := r.c.Do(context.Background(), r.c.B().Del().Key(r.keys(sc).lease).Build()).Error(); err != nil {
		tb.Fatal(err)
	}
}

// TestRedisReap: an owner that dies mid-stream leaves its followers
// waiting only until its lease lapses; they end with generation_lost, the
// key is commit_unknown and free, and a resume into the dead generation
// is gone.
func TestRedisReap(t *testing.T) {
	rs := replicas(t, 2)
	sc := Scope{Tenant: "t", Key: "reap"}
	a := rbegin(t, rs[0], sc, "fp").Flight
	startStream(t, a)
	appendN(t, a, 1, 10)
	j := rbegin(t, rs[1], sc, "fp")
	if j.Decision != Join {
		t.Fatalf("duplicate: got %v; want join", j.Decision)
	}
	sub, _ := j.Flight.Subscribe(0)
	if p, _ := follow(sub, 300*time.Millisecond); len(parseWire(t, p)) != 10 {
		t.Fatalf("follower: got %d events before the crash; want 10", len(parseWire(t, p)))
	}
	died := time.Now()
	a.be.(*owner).shutdown() // the owner's process is gone: no renewals, no writes
	state := waitDone(t, j.Flight, 3*testLease)
	took := time.Since(died)
	if _, reason, _ := j.Flight.Outcome(); state != StateCommitUnknown || reason != "generation_lost" {
		t.Fatalf("follower: got %v (%s); want commit_unknown (generation_lost)", state, reason)
	}
	if bound := testLease + rs[1].idle + 200*time.Millisecond; took > bound {
		t.Fatalf("follower ended %v after the crash; want within lease + idle + slack = %v", took, bound)
	}
	ki, ok := rs[1].Info(sc)
	if !ok || ki.State != StateCommitUnknown {
		t.Fatalf("Info: got %+v; want commit_unknown", ki)
	}
	if _, _, err := rs[1].Attach(sc, "fp", sse.ID{Gen: a.Gen, Seq: 5}, true); !errors.Is(err, ErrGone) {
		t.Fatalf("resume into the reaped generation: got %v; want ErrGone", err)
	}
	b := rbegin(t, rs[1], sc, "fp")
	if b.Decision != Miss || b.Flight.Gen <= a.Gen {
		t.Fatalf("retry: got %v; want a miss with a new generation", b.Decision)
	}
	b.Flight.Fail(StateFailedRetryable, "test", nil)
	if rs[1].Stats().Reaped != 1 {
		t.Fatalf("reaped: got %d; want 1", rs[1].Stats().Reaped)
	}
}

// TestRedisReplay: a committed result replays on every replica with its
// head, events and ids, from any position; a non-streaming body too; and
// a failure reaches followers with the upstream's own answer.
func TestRedisReplay(t *testing.T) {
	rs := replicas(t, 2)
	sc := Scope{Tenant: "t", Key: "replay"}
	a := rbegin(t, rs[0], sc, "fp").Flight
	startStream(t, a)
	want := appendN(t, a, 1, 40)
	a.Commit(nil)
	_, res, err := rs[1].Attach(sc, "", sse.ID{Gen: a.Gen, Seq: 25}, true)
	if err != nil {
		t.Fatalf("Attach after commit: %v", err)
	}
	p, _ := res.After(25)
	checkSeq(t, parseWire(t, p), a.Gen, 25, 40)
	if !bytes.Equal(res.Data, want) || res.Head.Header[0].Value != "req-1" {
		t.Fatal("result on the other replica: not the owner's bytes and head")
	}
	if _, _, err := rs[1].Attach(sc, "", sse.ID{Gen: a.Gen, Seq: 41}, true); !errors.Is(err, ErrPosition) {
		t.Fatalf("resume past the end: got %v; want ErrPosition", err)
	}
	if _, _, err := rs[1].Attach(sc, "", sse.ID{Gen: a.Gen - 1, Seq: 1}, true); !errors.Is(err, ErrGone) {
		t.Fatalf("resume in another generation: got %v; want ErrGone", err)
	}
	if _, _, err := rs[1].Attach(Scope{Tenant: "other", Key: "replay"}, "", sse.ID{}, false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another tenant: got %v; want ErrNotFound", err)
	}

	t.Run("body", func(t *testing.T) {
		sc := Scope{Tenant: "t", Key: "replay-body"}
		a := rbegin(t, rs[0], sc, "fp").Flight
		j := rbegin(t, rs[1], sc, "fp").Flight
		a.SetHead(Head{Status: 200, ContentType: "application/json"})
		a.Commit([]byte(`{"ok":true}`))
		if state := waitDone(t, j, 2*time.Second); state != StateCommitted {
			t.Fatalf("follower: %v; want committed", state)
		}
		if _, _, body := j.Outcome(); string(body) != `{"ok":true}` {
			t.Fatalf("follower body: %q", body)
		}
		if b := rbegin(t, rs[1], sc, "fp"); b.Decision != Hit || string(b.Result.Data) != `{"ok":true}` {
			t.Fatalf("replay: got %v", b.Decision)
		}
	})
	t.Run("failure", func(t *testing.T) {
		sc := Scope{Tenant: "t", Key: "replay-fail"}
		a := rbegin(t, rs[0], sc, "fp").Flight
		j := rbegin(t, rs[1], sc, "fp").Flight
		a.SetHead(Head{Status: 400, ContentType: "application/json"})
		a.Fail(StateFailedTerminal, "upstream_status_400", []byte(`{"error":1}`))
		if state := waitDone(t, j, 2*time.Second); state != StateFailedTerminal {
			t.Fatalf("follower: %v; want failed_terminal", state)
		}
		if _, reason, body := j.Outcome(); reason != "upstream_status_400" || string(body) != `{"error":1}` {
			t.Fatalf("follower: got %q %q; want the owner's reason and body", reason, body)
		}
		if b := rbegin(t, rs[1], sc, "other-fp"); b.Decision != Miss {
			t.Fatalf("after a failure: got %v; want miss", b.Decision)
		}
	})
}

// TestRedisUnavailable: with Redis down, Begin fails within the timeout
// with ErrUnavailable (never ErrStoreFull); once it is back, the same
// store works again without a restart.
func TestRedisUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "ssg", func(c *RedisConfig) { c.Timeout = 300 * time.Millisecond })
	sc := Scope{Tenant: "t", Key: "down"}
	for _, how := range []string{"paused", "killed"} {
		if how == "paused" {
			srv.Pause()
		} else {
			srv.Stop()
		}
		start := time.Now()
		_, err := r.Begin(sc, "fp")
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrStoreFull) {
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
		deadline := time.Now().Add(10 * time.Second)
		for {
			b, err := r.Begin(sc, "fp")
			if err == nil {
				if b.Flight != nil && b.Decision == Miss {
					b.Flight.Fail(StateFailedRetryable, "test", nil)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: Begin after Redis came back: %v", how, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestRedisStartsWithoutRedis: a replica starts while Redis is down and
// works once it comes.
func TestRedisStartsWithoutRedis(t *testing.T) {
	srv := redistest.Start(t)
	srv.Stop()
	r := newRedis(t, srv.Addr, "ssg", func(c *RedisConfig) { c.Timeout = 200 * time.Millisecond })
	if err := r.Ping(context.Background()); err == nil {
		t.Fatal("Ping with Redis down: got nil; want an error")
	}
	srv.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for r.Ping(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("Ping: Redis never became reachable")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestBlobRoundTrip(t *testing.T) {
	c, err := newBlobCodec(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	m := newMemory(t, Config{})
	f := claim(t, m, Scope{Tenant: "t", Key: "k"}, "fp")
	f.SetHead(Head{Status: 200, Stream: true, ContentType: "text/event-stream", Header: []Header{{"A", "b"}}})
	appendN(t, f, 1, 100)
	f.Commit(nil)
	_, res, _ := m.Attach(Scope{Tenant: "t", Key: "k"}, "", sse.ID{}, false)
	b, err := c.encode(res)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.decode(b, res.Scope)
	if err != nil {
		t.Fatal(err)
	}
	if got.Gen != res.Gen || !bytes.Equal(got.Data, res.Data) || len(got.Ends) != len(res.Ends) || got.Ends[99] != res.Ends[99] || got.Head.Header[0] != res.Head.Header[0] {
		t.Fatal("decoded result differs from the encoded one")
	}
	if len(b) >= len(res.Data) {
		t.Fatalf("blob: %d bytes for %d of events; want compression", len(b), len(res.Data))
	}
	if _, err := c.decode(b[:len(b)/2], res.Scope); err == nil {
		t.Fatal("truncated blob: got no error")
	}
	// S2 blocks carry no checksum; the blob does: a damaged byte anywhere
	// in its frames is refused, not replayed.
	for _, at := range []int{len(b) - 1, len(b) / 2, len(b) - 40} {
		bad := append([]byte(nil), b...)
		bad[at] ^= 0x20
		if _, err := c.decode(bad, res.Scope); err == nil {
			t.Fatalf("blob damaged at byte %d of %d: got no error", at, len(b))
		}
	}
	// Blobs kept by earlier versions (zstd: one frame with no length, or
	// frames after the length) still read, since Redis may hold results
	// written before an upgrade.
	meta, err := c.meta(res)
	if err != nil {
		t.Fatal(err)
	}
	raw := append(meta, got.Data...)
	z, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	v1 := z.EncodeAll(raw, append([]byte(nil), blobMagicV1...))
	v2 := z.EncodeAll(raw, binary.AppendUvarint(append([]byte(nil), blobMagicV2...), uint64(len(raw))))
	z.Close()
	for v, blob := range [][]byte{v1, v2} {
		if got, err := c.decode(blob, res.Scope); err != nil || !bytes.Equal(got.Data, res.Data) || got.Events() != 100 {
			t.Fatalf("version %d blob: %v; want the same result", v+1, err)
		}
	}
	// A length beyond the bound is refused before anything is allocated,
	// and so is a frame that would decode past the length given.
	rest := b[len(blobMagic)+uvarintLen(b[len(blobMagic):]):]
	huge := binary.AppendUvarint(append([]byte(nil), blobMagic...), 1<<40)
	if _, err := c.decode(append(huge, rest...), res.Scope); err == nil {
		t.Fatal("blob claiming 1 TiB: got no error")
	}
	short := binary.AppendUvarint(append([]byte(nil), blobMagic...), 10)
	if _, err := c.decode(append(short, rest...), res.Scope); err == nil {
		t.Fatal("blob whose frames pass its length: got no error")
	}
}

func uvarintLen(b []byte) int {
	_, n := binary.Uvarint(b)
	return n
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
	claim := func(t *testing.T, rs []*Redis, key string, from ownerState) (*Flight, *owner, Scope) {
		t.Helper()
		sc := Scope{Tenant: "t", Key: key}
		f := rbegin(t, rs[0], sc, "fp").Flight
		startStream(t, f)
		appendN(t, f, 1, 3)
		o := f.be.(*owner)
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
	recorded := func(r *Redis, sc Scope) bool {
		ki, ok := r.Info(sc)
		return ok && ki.State == StateFailedRetryable && ki.Reason == "test_failure"
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
		if b := rbegin(t, rs[1], sc, "fp"); b.Decision != Miss {
			t.Fatalf("claim after the lease expired: got %v; want miss", b.Decision)
		}
		if s := waitDone(t, f, 2*testLease); s != StateCommitUnknown {
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
		rs := []*Redis{
			newRedis(t, addr, prefix, func(c *RedisConfig) { c.Lease = time.Minute }),
			newRedis(t, addr, prefix, nil),
		}
		f, o, sc := claim(t, rs, "owner-refused", ownerLive)
		// The flusher has nothing in flight for Redis to refuse first.
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
			if ki, _ := rs[0].Info(sc); ki.Events == 3 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the journal did not reach Redis")
			}
		}
		expireLease(t, rs[0], sc)
		if b := rbegin(t, rs[1], sc, "fp"); b.Decision != Miss {
			t.Fatalf("claim after the lease expired: got %v; want miss", b.Decision)
		}
		if f.Commit(nil) {
			t.Fatal("stale owner's Commit: got true; want it refused")
		}
		if _, reason, _ := f.Outcome(); reason != "generation_lost" {
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
			f.Fail(StateFailedRetryable, "test_failure", nil)
			want(t, o, ownerFailed)
			if got, w := recorded(rs[0], sc), from != ownerFenced; got != w {
				t.Fatalf("the failure recorded in Redis: %v; want %v", got, w)
			}
			o.fail(f, StateFailedTerminal, "second") // failed is final
			want(t, o, ownerFailed)
			tested[move{from, ownerFailed}] = true
		})
	}
	for _, from := range []ownerState{ownerCommitting, ownerFenced, ownerFailed} {
		t.Run("fence and commit from "+from.String(), func(t *testing.T) {
			rs := replicas(t, 1)
			f, o, _ := claim(t, rs, "owner-stay-"+from.String(), from)
			o.fence("generation_lost")
			want(t, o, from)
			select {
			case <-f.Done():
				t.Fatal("a fence after the owner left live ended the flight")
			default:
			}
			go f.Fail(StateFailedRetryable, "test_failure", nil)
			if o.commit(f, &Result{}) {
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
// comment in redis_owner.go.
func ownerTable(t *testing.T) map[struct{ from, to ownerState }]bool {
	t.Helper()
	file, err := parser.ParseFile(token.NewFileSet(), "redis_owner.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]ownerState{}
	for s := range ownerState(len(ownerStates)) {
		states[s.String()] = s
	}
	rows := map[struct{ from, to ownerState }]bool{}
	for _, d := range file.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.TYPE || gd.Specs[0].(*ast.TypeSpec).Name.Name != "ownerState" {
			continue
		}
		for line := range strings.Lines(gd.Doc.Text()) {
			f := strings.Fields(line)
			if !strings.HasPrefix(line, "\t") || len(f) < 2 {
				continue
			}
			from, ok1 := states[f[0]]
			to, ok2 := states[f[1]]
			if ok1 && ok2 {
				rows[struct{ from, to ownerState }{from, to}] = true
			}
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
