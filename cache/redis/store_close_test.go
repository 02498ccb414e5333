package redis

import (
	"context"
	"fmt"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"log/slog"
	"math"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/ssegate/ssegate/internal/redistest"
)

// closeBound is how long Close may take with Redis stopped under an
// append call in flight. Close cancels the store's context first, which
// ends the calls in flight (owner.ctx), so it must not wait for them:
// not for -redis-timeout (heldMod: 10 s), nor for a blocking command's
// idle bound beside it. What remains is rueidis's own close of its
// pipelined connections to a server that does not answer: it closes them
// in turn, each after a second without an answer to its PING, and opens
// 2^min(log2(GOMAXPROCS), 2) of them (rueidis's singleClientMultiplex).
// Two seconds more are margin.
func closeBound() time.Duration {
	conns := 1 << min(int(math.Log2(float64(runtime.GOMAXPROCS(0)))), 2)
	return time.Duration(conns+2) * time.Second
}

// storeGoroutines returns the stacks (function names, innermost first) of
// the goroutines running code of this package that are not a test's own:
// the stores' flushers, senders, loops and tails.
func storeGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	const pkg = "github.com/ssegate/ssegate/cache/redis."
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		var fns []string
		ours, test := false, false
		for _, l := range strings.Split(g, "\n") {
			if l == "" || l[0] == '\t' || strings.HasPrefix(l, "goroutine ") || strings.HasPrefix(l, "created by ") {
				continue
			}
			fn, _, _ := strings.Cut(l, "(0x")
			fn = strings.TrimSuffix(fn, "(...)")
			fns = append(fns, fn)
			if rest, ok := strings.CutPrefix(fn, pkg); ok {
				ours = true
				test = test || strings.HasPrefix(rest, "Test")
			}
		}
		if ours && !test {
			out = append(out, strings.Join(fns, " < "))
		}
	}
	return out
}

// countIn returns how many of stacks run fn.
func countIn(stacks []string, fn string) int {
	n := 0
	for _, s := range stacks {
		if strings.Contains(s, fn) {
			n++
		}
	}
	return n
}

// TestRedisCloseAppendsQueued: the store closed while an owner's append
// call is held in a stopped Redis and the other owners' appends queue
// behind it (and more events behind the held one). Close returns within
// closeBound(), not after -redis-timeout; every owner waiting for its
// append gets an answer and ends (no goroutine of the store is left); a
// commit that waited for the held owner, and the other owners' commits
// after Close, are refused; and once Redis runs again no key is
// committed, none has a result, and no queued append reached a journal.
//
// Not parallel: it counts the package's goroutines, to which the stores
// of parallel tests would add.
func TestRedisCloseAppendsQueued(t *testing.T) {
	base := len(storeGoroutines())
	srv := redistest.Start(t)
	cfg := Config{URL: "redis://" + srv.Addr, Prefix: "closeq", Logger: slog.New(slog.DiscardHandler)}
	heldMod(&cfg)
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	var closing atomic.Bool // Close was called: a Close that hangs is not called again
	t.Cleanup(func() {
		if !closing.Swap(true) {
			r.Close()
		}
	})
	t.Cleanup(srv.Resume) // before the Close above, when the test ends early
	scs, fs, _ := mirroredStreams(t, r, "s", heldCount)
	srv.Pause()
	storetest.AppendN(t, fs[0], 2, 1)
	eventually(t, 5*time.Second, func() error { // sent alone, held in the stopped server
		if calls, n := sending(r); calls != 1 || n != 0 {
			return fmt.Errorf("%d calls, %d appends queued; want the first append in a call", calls, n)
		}
		return nil
	})
	for _, f := range fs[1:] {
		storetest.AppendN(t, f, 2, 1)
	}
	eventually(t, 5*time.Second, func() error {
		if n := queued(r); n != heldCount-1 {
			return fmt.Errorf("%d appends queued; want %d", n, heldCount-1)
		}
		return nil
	})
	storetest.AppendN(t, fs[0], 3, 2) // behind the held append, in the journal only
	// Every owner's flusher waits for its append's answer.
	eventually(t, 5*time.Second, func() error {
		if n := countIn(storeGoroutines(), "redis.(*Store).appendJournal"); n != heldCount {
			return fmt.Errorf("%d owners wait for an append; want %d", n, heldCount)
		}
		return nil
	})
	// The held owner's generation ends: its commit waits for the flusher.
	held := ownerOf(t, r, fs[0])
	committed := make(chan bool, 1)
	go func() { committed <- fs[0].Commit(nil) }()
	eventually(t, 5*time.Second, func() error {
		held.mu.Lock()
		defer held.mu.Unlock()
		if held.state != ownerCommitting {
			return fmt.Errorf("held owner %v; want committing", held.state)
		}
		return nil
	})

	closed := make(chan struct{})
	start := time.Now()
	go func() {
		closing.Store(true)
		r.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(closeBound()):
		left := storeGoroutines()
		if n := countIn(left, "redis.(*Store).appendJournal"); n > 0 {
			t.Errorf("%v after Close began: %d owners still wait for their append's answer", closeBound(), n)
		}
		t.Errorf("Close: not returned within %v with Redis stopped; the store's goroutines then:\n\t%s",
			closeBound(), strings.Join(left, "\n\t"))
		srv.Resume() // so that Close can end, and the test with it
		select {
		case <-closed:
		case <-time.After(30 * time.Second):
			t.Fatal("Close: not returned 30 s after Redis resumed")
		}
	}
	took := time.Since(start)
	t.Logf("Close returned after %v", took.Round(time.Millisecond))
	if left := storeGoroutines(); len(left) > base {
		t.Errorf("after Close: %d goroutines of the package, %d before the store; still running:\n\t%s",
			len(left), base, strings.Join(left, "\n\t"))
	}
	select {
	case ok := <-committed:
		if ok {
			t.Error("the held owner's Commit: got true; want it refused")
		}
	case <-time.After(time.Second):
		t.Fatal("the held owner's Commit: no answer 1 s after Close")
	}
	for i, f := range fs {
		if i > 0 && f.Commit(nil) {
			t.Errorf("stream %d: Commit after Close: got true; want it refused", i)
		}
		if state, reason, _ := f.Outcome(); state == cache.StateCommitted || reason != cache.ReasonStoreUnavailable {
			t.Errorf("stream %d: ended %v (%s); want a failure with %s", i, state, reason, cache.ReasonStoreUnavailable)
		}
	}

	// Redis, running again: what the closed store left there.
	srv.Resume()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		t.Fatalf("a client of the resumed Redis: %v", err)
	}
	defer c.Close()
	ctx := context.Background()
	for i, sc := range scs {
		k := r.keys(sc)
		st, err := c.Do(ctx, c.B().Hgetall().Key(k.st).Build()).AsStrMap()
		if err != nil {
			t.Fatalf("stream %d: HGETALL st: %v", i, err)
		}
		if st["phase"] != "live" || st["state"] == string(cache.StateCommitted) || (st["commits"] != "" && st["commits"] != "0") {
			t.Errorf("stream %d: st phase %q state %q commits %q; want it live, never committed", i, st["phase"], st["state"], st["commits"])
		}
		if n, err := c.Do(ctx, c.B().Exists().Key(k.res).Build()).AsInt64(); err != nil || n != 0 {
			t.Errorf("stream %d: a result in Redis (EXISTS %d, %v); want none", i, n, err)
		}
		es, err := c.Do(ctx, c.B().Xrevrange().Key(k.j).End("+").Start("-").Count(1).Build()).AsXRange()
		if err != nil || len(es) == 0 {
			t.Fatalf("stream %d: XREVRANGE: %d entries, %v", i, len(es), err)
		}
		// The held append (sent before Close) may run now; the queued
		// ones were never sent.
		if want := fmt.Sprintf("%d-1", fs[i].Gen); i > 0 && es[0].ID != want {
			t.Errorf("stream %d: the journal ends at %s; want %s: a queued append was sent", i, es[0].ID, want)
		}
		if i == 0 && es[0].ID != fmt.Sprintf("%d-1", fs[0].Gen) && es[0].ID != fmt.Sprintf("%d-2", fs[0].Gen) {
			t.Errorf("held stream: the journal ends at %s; want %d-1 or the held append's %d-2", es[0].ID, fs[0].Gen, fs[0].Gen)
		}
	}
}
