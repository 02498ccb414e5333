//go:build !race

package proxy

import (
	"context"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestOfferAllocs holds the generation's write of an event to its client
// (a chunk frame and one writev that never waits) at zero allocations;
// the race detector's instrumentation allocates, hence the build tag.
func TestOfferAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun counts every allocation of the process.
	for _, traced := range []bool{false, true} {
		c := drainedClient(t, traced)
		ev := sse.AppendEvent(nil, sse.ID{Gen: 1, Seq: 1}, "", `{"choices":[{"index":0,"delta":{"content":"hello"}}]}`)
		if got := testing.AllocsPerRun(1000, func() {
			if _, err := c.offer(false, ev); err != nil {
				t.Fatal(err)
			}
			if err := c.flush(); err != nil { // whatever the socket did not take
				t.Fatal(err)
			}
		}); got != 0 {
			t.Errorf("offer, traced %v: got %v allocs per event; want 0", traced, got)
		}
	}
}

// TestWriteAllocs holds a blocking write of a chunk larger than
// writePiece, which goes out in pieces with a deadline each, at zero
// allocations.
func TestWriteAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun counts every allocation of the process.
	for _, traced := range []bool{false, true} {
		c := drainedClient(t, traced)
		c.p.cfg.SlowClientTimeout = 10 * time.Second
		big := make([]byte, 5*writePiece+123)
		if got := testing.AllocsPerRun(100, func() {
			if err := c.write(big); err != nil {
				t.Fatal(err)
			}
		}); got != 0 {
			t.Errorf("write of %d bytes, traced %v: got %v allocs; want 0", len(big), traced, got)
		}
	}
}

// TestDeliverAllocs holds the relay of a journaled event to a client, by
// the generation itself (writes that never wait) and by a follower's
// goroutine (writes that wait), at zero allocations.
func TestDeliverAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun counts every allocation of the process.
	data := `{"choices":[{"index":0,"delta":{"content":"hello"}}]}`
	for i := range 4 {
		traced, wait := i >= 2, i%2 == 1
		c := drainedClient(t, traced)
		c.p.cfg.SlowClientTimeout = 10 * time.Second
		f := cache.NewDetached(1 << 30)
		sub, err := f.Subscribe(0)
		if err != nil {
			t.Fatal(err)
		}
		if got := testing.AllocsPerRun(1000, func() {
			if _, err := f.Append("", data); err != nil {
				t.Fatal(err)
			}
			if d := deliver(c, sub, f, wait, nil); d.err != nil && d.err != errBehind {
				t.Fatal(d.err)
			}
			if err := c.flush(); err != nil { // whatever the socket did not take
				t.Fatal(err)
			}
		}); got != 0 {
			t.Errorf("deliver, wait %v, traced %v: got %v allocs per event; want 0", wait, traced, got)
		}
	}
}

// drainedClient is a client on a loopback connection whose other end
// reads everything; traced, its proxy makes spans and the client's
// answer has one, recorded in memory.
func drainedClient(t *testing.T, traced bool) *clientConn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(io.Discard, c) //nolint:errcheck // drains until the test closes
			c.Close()
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rc, err := conn.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{m: newMetrics(&Proxy{})}
	p.hooks = p.m.hooks()
	c := &clientConn{p: p, conn: conn, rc: rc}
	if traced {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
		t.Cleanup(func() { tp.Shutdown(context.Background()) }) //nolint:errcheck // in memory
		p.tracer = tp.Tracer(tracerName)
		p.hooks = compose(p.hooks, p.traceHooks())
		ctx, span := p.tracer.Start(context.Background(), "POST", trace.WithSpanKind(trace.SpanKindServer))
		c.span = &reqSpan{span: span, ctx: ctx, taken: true, status: 200}
	}
	c.wfn = c.writeFD
	return c
}

// TestGenerationAllocs holds a generation's events, from the upstream's
// body to the client, under one allocation each for the whole process, and
// at no more allocations with spans made than without: the events of a stream of many events cost what those of a
// short one do, per event, traced or not (the spans hear of a call's head,
// first output and end only).
func TestGenerationAllocs(t *testing.T) {
	// Not parallel: the process's allocations are counted.
	// perEvent returns the allocations and the bytes allocated per event.
	perEvent := func(traced, keyed bool) (float64, float64) {
		up := newFaultServer(t, nil)
		var e *env
		if traced {
			e, _ = tracedEnv(t, []string{up.url}, nil)
		} else {
			e = retryEnv(t, []string{up.url}, nil)
		}
		allocs := func(events int) (mallocs, bytes int64) {
			body := strings.Repeat(chatChunk(0, "t", ""), events) + chatChunk(0, "", "stop") + "data: [DONE]\n\n"
			up.set(func(_ int64, w http.ResponseWriter, _ *http.Request) { writeSSE(w, body) })
			get := func() {
				r := req{body: chatBody}
				if keyed {
					r.key = newKey("allocs")
				}
				resp := e.do(r)
				defer resp.Body.Close()
				// Read, not parsed: the test's own reading allocates nothing per event.
				if n, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != 200 || n < int64(len(body)) {
					t.Fatalf("%d events: got %d, %d bytes, %v; want a whole stream", events, resp.StatusCode, n, err)
				}
			}
			get() // warm
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			get()
			runtime.ReadMemStats(&after)
			return int64(after.Mallocs - before.Mallocs), int64(after.TotalAlloc - before.TotalAlloc)
		}
		const short, long = 100, 3100
		// The lowest of a few runs: other goroutines' allocations only add.
		best, bestBytes := math.Inf(1), math.Inf(1)
		for range 3 {
			lm, lb := allocs(long)
			sm, sb := allocs(short)
			best = min(best, float64(lm-sm)/(long-short))
			bestBytes = min(bestBytes, float64(lb-sb)/(long-short))
		}
		return best, bestBytes
	}
	off, offBytes := perEvent(false, true)
	on, onBytes := perEvent(true, true)
	unkeyed, unkeyedBytes := perEvent(false, false)
	t.Logf("per event: %.3f allocations and %.0f bytes untraced, %.3f and %.0f traced, %.3f and %.0f without a key", off, offBytes, on, onBytes, unkeyed, unkeyedBytes)
	if on > off+0.05 {
		t.Errorf("traced: %.3f allocations per event; want no more than untraced (%.3f)", on, off)
	}
	// The whole process, mock upstream and client included: the upstream's
	// events are read in place (sse.Scanner), where go-sse's reader took two
	// allocations an event.
	if off >= 1 {
		t.Errorf("untraced: %.3f allocations per event; want below 1", off)
	}
	// Without a key, the upstream's reads of a score of events each go
	// through one journal block that holds them all: no allocation per
	// read, where a new block took one or two (0.10 an event). What is
	// left, 0.02 to 0.05, is the test's upstream's: net/http's chunk
	// writer allocates at each of its 4 KiB writes.
	if unkeyed > 0.075 {
		t.Errorf("without a key: %.3f allocations per event; want below 0.075", unkeyed)
	}
}

// TestMACAllocs holds a keyed request's tenant, and its resume token's
// MAC, to the tenant's one string: the HMAC states keyed by the secret are
// reused, not made anew (the secret hashed, two digests allocated) for
// each.
func TestMACAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun counts every allocation of the process.
	p, err := New(Config{Upstreams: []string{"http://127.0.0.1:1"}, Secret: []byte("0123456789abcdef-allocs")})
	if err != nil {
		t.Fatal(err)
	}
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.Set("Authorization", "Bearer sk-allocs")
	if got := testing.AllocsPerRun(1000, func() {
		if _, ok := p.tenant(&ctx); !ok {
			t.Fatal("Authorization: not taken as a credential")
		}
	}); got > 1 {
		t.Errorf("tenant: got %v allocs; want at most 1 (its string)", got)
	}
	if got := testing.AllocsPerRun(1000, func() { p.resumeMAC("tenant", "key", "1", "2") }); got != 0 {
		t.Errorf("resume MAC: got %v allocs; want 0", got)
	}
}

// TestQuietLogAllocs: a generation's state lines cost no allocation when
// info lines are not logged (their attributes are not boxed for nothing).
func TestQuietLogAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun counts every allocation of the process.
	store := memoryStore(t, cache.Config{})
	p, err := New(Config{Upstreams: []string{"http://127.0.0.1:1"}, Store: store,
		Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	b, err := store.Begin(cache.Scope{Tenant: "t", Key: "quiet"}, "fp")
	if err != nil || b.Decision != cache.Miss {
		t.Fatalf("Begin: %v, %v; want a miss", b.Decision, err)
	}
	g := &gen{p: p, f: b.Flight}
	mark := testing.AllocsPerRun(1000, func() { b.Flight.Mark(cache.StateExecutionStarted, 1, 0) })
	if got := testing.AllocsPerRun(1000, func() { g.mark(cache.StateExecutionStarted, 1, 0) }); got > mark {
		t.Errorf("mark: got %v allocs; want the flight's own, %v", got, mark)
	}
	if got := testing.AllocsPerRun(1000, g.logEnd); got != 0 {
		t.Errorf("logEnd: got %v allocs; want 0", got)
	}
	b.Flight.Fail(cache.StateFailedRetryable, "test", nil)
}
