package proxy

import (
	"bufio"
	"fmt"
	"github.com/ssegate/ssegate/internal/doctable"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// TestSlowOrigin: the client whose request started the generation is
// written by the generation while it keeps up; when it falls behind, a
// goroutine of its own takes over from the exact byte where the
// generation's last write stopped. A client that catches up gets the
// whole stream, byte for byte; one that stalls is dropped after
// -slow-client-timeout, and neither the generation nor a joiner waits.
func TestSlowOrigin(t *testing.T) {
	// Not parallel: it times the joiner of a 12 MB stream. Its two cases
	// run at once, each with a proxy of its own: the joiner's bound (8 s)
	// is four times its time alone.
	t.Run("behind, then catches up", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, slowMock(time.Millisecond, 1500), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
			pc.SlowClientTimeout = 10 * time.Second
		})
		key := newKey("behind")
		conn := keyedConn(t, e, key, "X-Mock-Chunk-Bytes: 8000\r\n") // ~12 MB: more than socket buffers hold
		// Read nothing while the generation runs, so that its writes fill
		// the socket buffers, then read all.
		e.waitState(key, "", cache.StateCommitted)
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("reading the stream: %v (after %d bytes)", err, len(raw))
		}
		got := parseResult(resp, raw, nil)
		if n := len(got.events); n != 1503 || got.events[n-1].Data != "[DONE]" || got.aborted {
			t.Fatalf("got %d events (aborted %v); want 1503 ending [DONE]", n, got.aborted)
		}
		if n := testutil.ToFloat64(e.proxy.m.originHandoffs); n != 1 {
			t.Fatalf("clients_behind_total = %v; want 1 (the test must make the client fall behind)", n)
		}
		replay := e.fetch(req{key: key})
		if !replay.replayed || string(eventBytes(raw)) != string(replay.raw) {
			t.Fatalf("the stream the slow client got differs from the recorded one")
		}
		if testutil.ToFloat64(e.proxy.m.slowDropped) != 0 {
			t.Fatalf("a client that caught up was counted as dropped")
		}
		e.wantCalls(1)
	})
	t.Run("stalled: dropped, the generation goes on", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, slowMock(time.Millisecond, 1500), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
			pc.SlowClientTimeout = time.Second
		})
		key := newKey("stalled")
		conn := keyedConn(t, e, key, "X-Mock-Chunk-Bytes: 8000\r\n") // ~12 MB
		e.waitState(key, "", cache.StateExecutionStarted)
		start := time.Now()
		joiner := e.fetch(req{key: key})
		if n := len(joiner.events); n != 1503 || joiner.events[n-1].Data != "[DONE]" || !joiner.replayed {
			t.Fatalf("joiner: got %d events; want 1503 ending [DONE]", n)
		}
		if took := time.Since(start); took > 8*time.Second {
			t.Fatalf("the joiner took %v", took)
		}
		e.waitState(key, "", cache.StateCommitted)
		waitFor(t, func() bool { return testutil.ToFloat64(e.proxy.m.slowDropped) == 1 })
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		slowRaw, _ := io.ReadAll(conn)
		if strings.Contains(string(slowRaw), "data: [DONE]") || !strings.Contains(string(slowRaw), "200 OK") {
			t.Fatalf("stalled client: got %d bytes (whole stream or no head); want a prefix, then the end of the connection", len(slowRaw))
		}
		e.wantCalls(1)
	})
}

// TestDisconnectDoesNotCancel: a client that drops after 3 events does not
// stop the generation; a repeat is a hit with the full stream.
func TestDisconnectDoesNotCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(3*time.Millisecond, 60))
	key := newKey("drop")
	readPrefix(t, e.do(req{key: key}), 3)
	e.waitState(key, "", cache.StateCommitted)
	got := e.fetch(req{key: key})
	if !got.replayed || got.lastData() != "[DONE]" || len(got.events) != 63 {
		t.Fatalf("repeat: replayed %v last %q events %d; want true [DONE] 63", got.replayed, got.lastData(), len(got.events))
	}
	e.wantCalls(1)
}

// TestShortStreamsAreWhole: one-token streams, with and without a key,
// from several clients at once, each arrive whole from one upstream call:
// they end about when the client's connection is taken over.
// TestHeadAndEndDuringTakeOver runs the take-over against the head and the
// end far more often.
func TestShortStreamsAreWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(0, 1))
	const workers, each = 4, 200
	var wg sync.WaitGroup
	errs := make(chan string, workers*each)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				key := ""
				if i%4 != 0 { // most with a key, some without
					key = fmt.Sprintf("short-%d-%d", w, i)
				}
				r := e.fetch(req{key: key})
				if r.status != 200 || len(r.events) < 2 || r.lastData() != "[DONE]" {
					errs <- fmt.Sprintf("%s: %d, %d events, last %q", key, r.status, len(r.events), r.lastData())
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	n := 0
	for msg := range errs {
		if n++; n <= 5 {
			t.Error(msg)
		}
	}
	if n > 0 {
		t.Fatalf("%d of %d short streams were not whole", n, workers*each)
	}
	e.wantCalls(workers * each)
}

// TestHeadAndEndDuringTakeOver: the take-over runs while the generation
// sets the head of a short stream, ends it and makes its last push, in
// every order the scheduler comes up with; the client always gets the
// whole stream, never an empty answer. The take-over decides from one
// look at the flight (Flight.HeadEnded), so there is no moment between
// two looks for the head and the end to come in.
func TestHeadAndEndDuringTakeOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.SlowClientTimeout = 2 * time.Second
	})
	spin := func(n int) {
		for range n {
			runtime.Gosched()
		}
	}
	for i := range 300 {
		r := newOriginRig(t, e.proxy, false)
		var wg sync.WaitGroup
		wg.Go(func() { // the generation
			spin(i % 7)
			r.f.SetHead(eventStreamHead)
			r.event(`{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}`)
			r.event("[DONE]")
			r.f.Commit(nil)
			r.end()
		})
		wg.Go(func() { // the take-over
			spin(i % 5)
			r.o.attach(r.c)
		})
		wg.Wait()
		got := r.read()
		if got.status != 200 || len(got.events) != 2 || got.lastData() != "[DONE]" {
			t.Fatalf("run %d: got %d with %d events %q; want the whole stream", i, got.status, len(got.events), got.raw)
		}
		if m := r.mode(); m != originOver {
			t.Fatalf("run %d: mode %s; want %s", i, m, originOver)
		}
	}
}

var eventStreamHead = cache.Head{Status: 200, ContentType: "text/event-stream", Stream: true}

// originRig is an origin on a loopback connection, driven by the test
// through the entry points of its goroutines: attach (the take-over),
// push and answerRaw (the generation), beat (the heartbeat timer).
type originRig struct {
	t    *testing.T
	p    *Proxy
	f    *cache.Flight
	g    *gen
	o    *origin
	c    *clientConn // for attach
	peer net.Conn
	done bool // the generation is over, or handed its end over (answerRaw)
}

// newOriginRig makes an origin in mode waiting, as serveOrigin leaves it
// before the take-over. small: socket buffers small enough that the client
// falls behind after a few writes it does not read.
func newOriginRig(t *testing.T, p *Proxy, small bool) *originRig {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var d net.Dialer
	if small {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) {
				setRcvBuf(fd, 4096)
			})
		}
	}
	peer, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if small {
		conn.(*net.TCPConn).SetWriteBuffer(4096)
	}
	rc, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if !p.acquireSlot() {
		t.Fatal("no stream slot")
	}
	f := cache.NewDetached(64 << 20)
	g := p.newGen(f, sse.Request{Stream: true}, llmKind)
	o := g.o // its place in f taken by newGen, as for every generation
	o.mu.Lock()
	o.method, o.path = "POST", "/v1/chat/completions"
	o.mu.Unlock()
	p.clients.Add(1) // as takeOver does; the answer's end (clientConn.finish) is Done
	c := &clientConn{p: p, conn: conn, rc: rc}
	c.wfn = c.writeFD
	r := &originRig{t: t, p: p, f: f, g: g, o: o, c: c, peer: peer}
	t.Cleanup(func() {
		// The client goes away and the generation ends, as in run: the
		// flight's end, the last push, finish.
		peer.Close()
		r.f.Fail(cache.StateFailedRetryable, "test_over", nil)
		r.end()
		if r.mode() == originWaiting { // no take-over: nothing else ends the client
			p.clients.Done()
			conn.Close()
		}
	})
	return r
}

// end is the end of the generation, as in run: its last push, then finish.
func (r *originRig) end() {
	if !r.done {
		r.done = true
		r.o.push()
		r.g.finish()
	}
}

func (r *originRig) mode() originMode {
	r.o.mu.Lock()
	defer r.o.mu.Unlock()
	return r.o.mode
}

func (r *originRig) event(data string) {
	r.t.Helper()
	if _, err := r.f.Append("", data); err != nil {
		r.t.Fatal(err)
	}
}

// read reads the client's whole answer.
func (r *originRig) read() result {
	r.t.Helper()
	r.peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(r.peer), nil)
	if err != nil {
		r.t.Fatal(err)
	}
	raw, err := io.ReadAll(resp.Body)
	return parseResult(resp, raw, err)
}

// fill writes the connection itself until its buffers take no more.
func (r *originRig) fill() {
	conn := r.o.c.conn
	conn.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
	conn.Write(make([]byte, 256<<10)) //nolint:errcheck // a timeout: full
	conn.SetWriteDeadline(time.Time{})
}

// originMove is one row of originMode's table: from, to, by.
type originMove struct {
	from, to originMode
	by       string // "take-over", "generation" or "timer"
}

// TestOriginTransitions: each row of originMode's table, made through the
// entry point of the goroutine the row names, moves the origin from its
// mode to the one the row says; the final modes stay put under push and
// beat; and the rows tested here are the rows of the table.
func TestOriginTransitions(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 64<<10)
	cases := []struct {
		name  string
		move  originMove
		small bool
		c     func(*clientConn) // changes the client before the take-over
		run   func(*originRig)
	}{
		{name: "taken over", move: originMove{originWaiting, originAttached, "take-over"},
			run: func(r *originRig) { r.o.attach(r.c) }},
		{name: "head at the take-over", move: originMove{originAttached, originDirect, "take-over"},
			run: func(r *originRig) {
				r.f.SetHead(eventStreamHead)
				r.event("a")
				r.o.attach(r.c)
			}},
		{name: "head after the take-over", move: originMove{originAttached, originDirect, "generation"},
			run: func(r *originRig) {
				r.o.attach(r.c)
				r.f.SetHead(eventStreamHead)
				r.event("a")
				r.o.push()
			}},
		{name: "head at the take-over, writes that wait", move: originMove{originAttached, originFollower, "take-over"},
			c: func(c *clientConn) { c.rc = nil },
			run: func(r *originRig) {
				r.f.SetHead(eventStreamHead)
				r.o.attach(r.c)
			}},
		{name: "head after the take-over, writes that wait", move: originMove{originAttached, originFollower, "generation"},
			c: func(c *clientConn) { c.rc = nil },
			run: func(r *originRig) {
				r.o.attach(r.c)
				r.f.SetHead(eventStreamHead)
				r.o.push()
			}},
		{name: "ended without a head at the take-over", move: originMove{originAttached, originOther, "take-over"},
			run: func(r *originRig) {
				r.f.Fail(cache.StateFailedRetryable, "upstream_unavailable", nil)
				r.o.attach(r.c)
			}},
		{name: "ended without a head after the take-over", move: originMove{originAttached, originOther, "generation"},
			run: func(r *originRig) {
				r.o.attach(r.c)
				r.f.Fail(cache.StateFailedRetryable, "upstream_unavailable", nil)
				r.o.push()
			}},
		{name: "raw answer after the take-over", move: originMove{originAttached, originOther, "generation"},
			run: func(r *originRig) {
				r.o.attach(r.c)
				r.answerRaw()
			}},
		{name: "raw answer before the take-over", move: originMove{originAttached, originOther, "take-over"},
			run: func(r *originRig) {
				r.answerRaw()
				if m := r.mode(); m != originWaiting {
					r.t.Fatalf("before the take-over: mode %s; want %s", m, originWaiting)
				}
				r.o.attach(r.c)
			}},
		{name: "behind, by the generation", move: originMove{originDirect, originFollower, "generation"}, small: true,
			run: func(r *originRig) {
				r.direct()
				for range 256 {
					r.event(big)
					if r.o.push(); r.mode() != originDirect {
						return
					}
				}
			}},
		{name: "behind, by the first write", move: originMove{originDirect, originFollower, "take-over"}, small: true,
			run: func(r *originRig) {
				r.f.SetHead(eventStreamHead)
				for range 64 {
					r.event(big)
				}
				r.o.attach(r.c)
			}},
		{name: "behind, by the heartbeat", move: originMove{originDirect, originFollower, "timer"}, small: true,
			run: func(r *originRig) {
				r.direct()
				r.o.beat() // marks the connection idle
				for range 50 {
					r.fill()
					if r.o.beat(); r.mode() != originDirect {
						return
					}
				}
			}},
		{name: "end, by the generation", move: originMove{originDirect, originOver, "generation"},
			run: func(r *originRig) {
				r.direct()
				r.f.Commit(nil)
				r.o.push()
			}},
		{name: "end, by the first write", move: originMove{originDirect, originOver, "take-over"},
			run: func(r *originRig) {
				r.f.SetHead(eventStreamHead)
				r.event("a")
				r.f.Commit(nil)
				r.o.attach(r.c)
			}},
		{name: "write failed, by the generation", move: originMove{originDirect, originOver, "generation"},
			run: func(r *originRig) {
				r.direct()
				r.o.c.conn.Close()
				r.event("b")
				r.o.push()
			}},
		{name: "write failed, by the heartbeat", move: originMove{originDirect, originOver, "timer"},
			run: func(r *originRig) {
				r.direct()
				r.o.c.conn.Close()
				r.o.beat() // marks the connection idle
				r.o.beat()
			}},
	}
	tested := map[originMove]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
				pc.SlowClientTimeout = 2 * time.Second
			})
			r := newOriginRig(t, e.proxy, tc.small)
			if tc.c != nil {
				tc.c(r.c)
			}
			tc.run(r)
			if m := r.mode(); m != tc.move.to {
				t.Fatalf("mode %s; want %s (from %s, by the %s)", m, tc.move.to, tc.move.from, tc.move.by)
			}
			if tc.move.to == originFollower || tc.move.to == originOther || tc.move.to == originOver {
				r.o.push()
				r.o.beat()
				if m := r.mode(); m != tc.move.to {
					t.Fatalf("final mode %s moved to %s", tc.move.to, m)
				}
			}
			tested[tc.move] = true
		})
	}
	table := originTable(t)
	for m := range table {
		if !tested[m] {
			t.Errorf("originMode's table has %s → %s by the %s; no case makes it", m.from, m.to, m.by)
		}
	}
	for m := range tested {
		if !table[m] {
			t.Errorf("%s → %s by the %s is made, but is not in originMode's table", m.from, m.to, m.by)
		}
	}
}

// direct takes the connection over with a stream's head and first event.
func (r *originRig) direct() {
	r.t.Helper()
	r.o.attach(r.c)
	r.f.SetHead(eventStreamHead)
	r.event("a")
	r.o.push()
	if m := r.mode(); m != originDirect {
		r.t.Fatalf("mode %s; want %s", m, originDirect)
	}
}

// answerRaw hands the origin a whole answer that is not a stream, as the
// generation does for a request without a key.
func (r *originRig) answerRaw() {
	resp := fasthttp.AcquireResponse()
	resp.Header.SetContentType("application/json")
	resp.SetBodyString(`{"ok":true}`)
	r.done = true // answerRest finishes the generation
	r.o.answerRaw(resp)
}

// originTable reads the rows of originMode's table from its comment in
// origin.go: from, to, and each goroutine named in the last column.
func originTable(t *testing.T) map[originMove]bool {
	t.Helper()
	modes := map[string]originMode{}
	for m := range originMode(len(originModes)) {
		modes[m.String()] = m
	}
	rows := map[originMove]bool{}
	for _, line := range doctable.Rows(t, "origin.go", "originMode") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		from, ok1 := modes[f[0]]
		to, ok2 := modes[f[1]]
		if !ok1 || !ok2 {
			continue // the header, or a row's second line
		}
		by := line[strings.LastIndex(line, "  "):]
		for _, g := range []string{"take-over", "generation", "timer"} {
			if strings.Contains(by, g) {
				rows[originMove{from, to, g}] = true
			}
		}
	}
	if len(rows) == 0 {
		t.Fatal("no rows found in originMode's comment")
	}
	return rows
}

// TestOriginModeString: each mode has its name.
func TestOriginModeString(t *testing.T) {
	t.Parallel()
	want := []string{"waiting", "attached", "direct", "follower", "other", "over"}
	for m, name := range want {
		if got := originMode(m).String(); got != name {
			t.Errorf("originMode(%d).String() = %q; want %q", m, got, name)
		}
	}
	if got := originMode(len(want)).String(); got != "originMode(6)" {
		t.Errorf("an unknown mode: %q", got)
	}
}
