package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

// TestRedisReplay: a committed result replays on every replica with its
// head, events and ids, from any position; a non-streaming body too; and
// a failure reaches followers with the upstream's own answer.
func TestRedisReplay(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
		eventually(t, 10*time.Second, func() error {
			b, err := r.Begin(sc, "fp")
			if err != nil {
				return fmt.Errorf("%s: Begin after Redis came back: %w", how, err)
			}
			if b.Flight != nil && b.Decision == Miss {
				b.Flight.Fail(StateFailedRetryable, "test", nil)
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
	r := newRedis(t, srv.Addr, "ssg", func(c *RedisConfig) { c.Timeout = 200 * time.Millisecond })
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
