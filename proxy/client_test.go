package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/redistest"
	"github.com/valyala/fasthttp"
)

// TestKeepAliveAfterStream: after a complete streamed answer the client's
// connection serves its next request, also when the client sent that
// request before reading the answer (pipelining), and after many streams.
func TestKeepAliveAfterStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(0, 3))
	conn, br := dialKept(t, e)
	request := func(key string) string {
		return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(chatBody), chatBody)
	}
	read := func() { t.Helper(); readWholeStream(t, br) }
	for i := range 50 {
		fmt.Fprint(conn, request(fmt.Sprint("ka-", i)))
		read()
	}
	// Two requests at once: the second is already read by the server when
	// the first stream ends.
	fmt.Fprint(conn, request("ka-p1")+request("ka-p2"))
	read()
	read()
	e.wantCalls(52)
}

// TestKeepAliveMixed: one connection carries answers written by the
// server itself (a request that is not a stream's, with a key and
// without: answerInHandler) and taken-over streams, in every order, sent
// one by one and pipelined behind each other; each is whole and in its
// place, and each key is one upstream call.
func TestKeepAliveMixed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(0, 3))
	conn, br := dialKept(t, e)
	request := func(key, body string) string {
		kh := ""
		if key != "" {
			kh = "Idempotency-Key: " + key + "\r\n"
		}
		return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", kh, len(body), body)
	}
	readWhole := func(what string) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: reading an answer on the kept-alive connection: %v", what, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.Contains(string(body), `"chat.completion"`) || resp.ContentLength != int64(len(body)) {
			t.Fatalf("%s: got %d, length %d, %q (%v); want a whole completion with its length", what, resp.StatusCode, resp.ContentLength, body, err)
		}
	}
	calls := int64(0)
	for i := range 5 {
		fmt.Fprint(conn, request(fmt.Sprint("mix-w", i), plainBody))
		readWhole("keyed")
		fmt.Fprint(conn, request("", plainBody))
		readWhole("unkeyed")
		fmt.Fprint(conn, request(fmt.Sprint("mix-s", i), chatBody))
		readWholeStream(t, br)
		calls += 3
	}
	// Pipelined: a whole answer behind a stream, a stream behind a whole
	// answer, and two whole answers.
	fmt.Fprint(conn, request("mix-p1", chatBody)+request("", plainBody)+request("mix-p2", plainBody)+request("mix-p3", chatBody)+request("", plainBody)+request("mix-p4", plainBody))
	readWholeStream(t, br)
	readWhole("unkeyed, behind a stream")
	readWhole("keyed, behind a whole answer")
	readWholeStream(t, br)
	readWhole("unkeyed, behind a stream")
	readWhole("keyed, behind a whole answer")
	calls += 6
	// A repeat of a keyed whole answer is its replay: no call.
	fmt.Fprint(conn, request("mix-w0", plainBody))
	readWhole("replay")
	e.wantCalls(calls)
}

// TestClientLeavesWholeAnswer: a client whose request is not a stream's
// closes its connection while its handler waits for the answer
// (answerInHandler): the keyed generation goes on to its end and is
// committed, and a repeat of the key is its replay, with no second
// upstream call.
func TestClientLeavesWholeAnswer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(20*time.Millisecond, 20)) // about 400 ms
	conn, _ := dialKept(t, e)
	key := newKey("leaves-whole")
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(plainBody), plainBody)
	waitFor(t, func() bool { return e.mock.Calls() == 1 })
	conn.Close()
	e.waitState(key, "", cache.StateCommitted)
	r := e.fetch(req{key: key, body: plainBody})
	if r.status != http.StatusOK || !r.replayed || !strings.Contains(string(r.raw), `"chat.completion"`) {
		t.Fatalf("the repeat: got %d replayed %v %q; want the stored completion, replayed", r.status, r.replayed, r.raw)
	}
	e.wantCalls(1)
}

// dialKept opens a connection to e's proxy, closed at t's end, for
// requests written by hand, with its reader; it fails t after 20 s.
func dialKept(t *testing.T, e *env) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	return conn, bufio.NewReader(conn)
}

// readWholeStream reads an answer from a kept-alive connection and fails
// t unless it is a whole stream.
func readWholeStream(t *testing.T, br *bufio.Reader) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading an answer on the kept-alive connection: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || !strings.Contains(string(body), "data: [DONE]") {
		t.Fatalf("got %d %q (%v); want a whole stream", resp.StatusCode, body, err)
	}
}

// TestKeepAliveIdleAfterStream: a connection kept after a streamed
// answer waits for its next request as long as the server's idle timeout
// (IdleTimeout), not ReadTimeout, which bounds reading a request: it
// closes soon after IdleTimeout, without an answer. A request that begins
// within it gets ReadTimeout from its first byte, even when it ends after
// the idle timeout has passed.
func TestKeepAliveIdleAfterStream(t *testing.T) {
	t.Parallel()
	const idle = time.Second
	e := newEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.IdleTimeout, pc.ReadTimeout = idle, 20*time.Second
	})
	// The proxy's own server, and another fasthttp server running its
	// Handler, whose connections the proxy serves on its own after a
	// stream (takeOver's over).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	other := &fasthttp.Server{Handler: e.proxy.Handler}
	go other.Serve(ln)                     //nolint:errcheck // ends with Shutdown
	t.Cleanup(func() { other.Shutdown() }) //nolint:errcheck // a test
	addrs := map[string]string{"own": strings.TrimPrefix(e.url, "http://"), "another": ln.Addr().String()}
	for name, addr := range addrs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			br := bufio.NewReader(conn)
			request := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
			stream := func() {
				t.Helper()
				conn.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
				readWholeStream(t, br)
			}
			fmt.Fprint(conn, request)
			stream()
			// The next request's first bytes within the idle timeout,
			// its end after it: served.
			fmt.Fprint(conn, request[:10])
			time.Sleep(idle + idle/4)
			fmt.Fprint(conn, request[10:])
			stream()
			// Then nothing: the connection closes after the idle timeout.
			waited := time.Now()
			conn.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
			if rest, err := io.ReadAll(br); err != nil || len(rest) > 0 {
				t.Fatalf("read %q, %v, after %s; want the connection closed", rest, err, time.Since(waited))
			}
			// The server's wait began when it wrote the answer's end, a
			// little before this read it.
			if took := time.Since(waited); took < idle/2 || took > idle+2*time.Second {
				t.Errorf("the idle connection closed after %s; want about the idle timeout, %s", took, idle)
			}
		})
	}
	t.Cleanup(func() { e.wantCalls(2 * int64(len(addrs))) })
}

// TestKeepAliveAfterSlowBound: a connection handed back after a
// taken-over answer keeps no write deadline: a later answer on it, which
// fasthttp writes itself past -slow-client-timeout, arrives.
func TestKeepAliveAfterSlowBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) { pc.SlowClientTimeout = 300 * time.Millisecond })
	key := newKey("ka")
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	e.fetch(req{key: key, body: body})
	e.waitState(key, "", cache.StateCommitted)
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	send := func(key string) *http.Response {
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("key %.10s: %v", key, err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		return resp
	}
	if resp := send(key); resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("repeat not replayed")
	}
	// Nothing to wait for but time: past -slow-client-timeout, a write
	// deadline the answer left on the connection has passed.
	time.Sleep(800 * time.Millisecond)
	if resp := send(strings.Repeat("x", 300)); resp.StatusCode != http.StatusBadRequest { // fasthttp writes the 400
		t.Fatalf("got %d; want 400", resp.StatusCode)
	}
}

// sendChat sends a streaming chat request (proto: HTTP/1.1 or HTTP/1.0)
// on a connection of its own, with key as its Idempotency-Key unless
// empty, and gives the connection 10 s to be read.
func sendChat(t *testing.T, addr, proto, key string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	keyHdr := ""
	if key != "" {
		keyHdr = "Idempotency-Key: " + key + "\r\n"
	}
	fmt.Fprintf(c, "POST /v1/chat/completions %s\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", proto, keyHdr, len(chatBody), chatBody)
	c.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // a fresh conn
	return c
}

// http10 sends one HTTP/1.0 request on a connection of its own and reads
// the answer to the connection's end.
func http10(t *testing.T, addr, key string) (*http.Response, string) {
	t.Helper()
	c := sendChat(t, addr, "HTTP/1.0", key)
	defer c.Close()
	raw, err := io.ReadAll(c) // the answer ends where the connection closes
	if err != nil {
		t.Fatalf("reading to the connection's end: %v", err)
	}
	head, body, _ := strings.Cut(string(raw), "\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(head+"\r\n\r\n")), nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// TestHTTP10Client: an HTTP/1.0 client gets its stream close-delimited,
// not chunked, and the connection closes at the stream's end: without a
// key, with one, and as a replay.
func TestHTTP10Client(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	addr := strings.TrimPrefix(e.url, "http://")
	key := newKey("http10")
	for _, c := range []struct{ name, key string }{{"unkeyed", ""}, {"keyed", key}, {"replay", key}} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "replay" {
				e.waitState(key, "", cache.StateCommitted)
			}
			resp, body := http10(t, addr, c.key)
			if resp.StatusCode != 200 || len(resp.TransferEncoding) != 0 {
				t.Fatalf("got %d, Transfer-Encoding %v; want 200 and none", resp.StatusCode, resp.TransferEncoding)
			}
			if !strings.HasPrefix(body, "data: ") && !strings.HasPrefix(body, "id: ") {
				t.Fatalf("body starts %q; want events, not a chunk size", body[:min(20, len(body))])
			}
			evs, _ := parseEvents([]byte(body))
			if n := len(evs); n != 19 || evs[n-1].Data != "[DONE]" {
				t.Fatalf("got %d events ending %q; want 19 ending [DONE]", n, evs[max(n-1, 0)].Data)
			}
			if c.name == "replay" && resp.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay not marked Idempotent-Replayed")
			}
		})
	}
	e.wantCalls(2)
}

// rawStream sends a streaming chat request on a connection of its own
// (rawPost) and reads until n events arrived.
func rawStream(t *testing.T, addr, key string, tokens, n int) *net.TCPConn {
	t.Helper()
	conn, _ := rawStreamSeen(t, addr, key, tokens, n)
	return conn
}

// rawStreamSeen is rawStream, and returns every byte it read from the
// connection (the answer's head, and the body's start as it came).
func rawStreamSeen(t *testing.T, addr, key string, tokens, n int) (*net.TCPConn, *bytes.Buffer) {
	t.Helper()
	return rawPostSeen(t, addr, "/v1/chat/completions",
		keyHeader(key)+fmt.Sprintf("X-Mock-Tokens: %d\r\nX-Mock-Chunk-Bytes: 8000\r\n", tokens), chatBody, n)
}

// rawPost sends a POST of a JSON body to path, with the header lines
// extra (each ended by CRLF), on a connection of its own with a small
// receive buffer, so that a client that stops reading is felt at once,
// and reads until n events arrived.
func rawPost(t *testing.T, addr, path, extra, body string, n int) *net.TCPConn {
	t.Helper()
	conn, _ := rawPostSeen(t, addr, path, extra, body, n)
	return conn
}

// rawPostSeen is rawPost, and returns every byte it read from the
// connection: what the client has had so far.
func rawPostSeen(t *testing.T, addr, path, extra, body string, n int) (*net.TCPConn, *bytes.Buffer) {
	t.Helper()
	conn := dialSmallBuffer(t, addr, 4096)
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		path, extra, len(body), body)
	var seen bytes.Buffer
	br := bufio.NewReader(io.TeeReader(conn, &seen))
	conn.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
	for events := 0; events < n; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d events: %v", events, err)
		}
		if strings.HasPrefix(line, "data: ") {
			events++
		}
	}
	return conn, &seen
}

// keyHeader is the Idempotency-Key header line of key, or "" for none.
func keyHeader(key string) string {
	if key == "" {
		return ""
	}
	return "Idempotency-Key: " + key + "\r\n"
}

// TestClientLeavesMidStream: a client that closes, resets or stops reading
// mid-stream never wedges the generation. Without a key the upstream call
// ends within a second (its connection closed: the mock stops writing);
// with one, the generation reads on and commits, in the memory store or
// in Redis, and a repeat of the key replays the whole stream without
// calling the upstream again. Either way the slot of -max-streams
// (ssegate_live_generations) comes back, and no goroutine is left
// behind. A client that stopped reading (cut after -slow-client-timeout)
// never got what reads as a whole stream.
func TestClientLeavesMidStream(t *testing.T) {
	// Not parallel: it holds the end of the upstream call to about a
	// second after the client left, which other tests' load would skew.
	// Its cases run at once, each with a proxy of its own (and counting
	// the goroutines of its own).
	for _, c := range []struct {
		store string
		keyed bool
	}{{"memory", false}, {"memory", true}, {"redis", true}} {
		for _, how := range []string{"close", "reset", "stop-reading"} {
			t.Run(fmt.Sprintf("%s/keyed=%v/%s", c.store, c.keyed, how), func(t *testing.T) {
				t.Parallel()
				goroutines := ownGoroutines(t) // before newEnv: the servers' goroutines are the test's
				// The keyed cases' repeat reads a 4.8 MB replay under the
				// same bound: a second leaves room for a loaded machine's
				// stalls, where 300 ms cut it.
				opts := []envOption{slowMock(2*time.Millisecond, 16), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
					pc.SlowClientTimeout = time.Second
				}}
				var e *env
				if c.store == "redis" {
					var logs gatetest.LogBuffer
					e, _ = replicaEnv(t, redistest.Shared(t), redistest.Prefix(t), &logs, opts...)
				} else {
					e = newEnv(t, opts...)
				}
				addr := strings.TrimPrefix(e.url, "http://")
				// A first stream of the same kind starts what lives as
				// long as the server (its worker pool's cleaner, the
				// upstream pool's, the Redis client's connections).
				first := ""
				if c.keyed {
					first = newKey("leave-first")
				}
				rawStream(t, addr, first, 3, 4).Close()
				if c.keyed {
					e.waitState(first, "", cache.StateCommitted)
				}
				within(time.Second, func() bool { return e.proxy.streams.Load() == 0 })
				before, stacks := goroutines()
				beforeOwn := busyGoroutines(stacks)
				key, tokens := "", 5000 // 10 s of stream, 40 MB: far more than socket buffers
				if c.keyed {
					key, tokens = newKey("leave"), 600 // 4.8 MB: still more (maxSocketBuffers)
				}
				conn, seen := rawStreamSeen(t, addr, key, tokens, 5)
				left := time.Now()
				switch how {
				case "close":
					conn.Close()
				case "reset":
					conn.SetLinger(0) //nolint:errcheck
					conn.Close()
				case "stop-reading":
					defer conn.Close()
				}
				if c.keyed {
					e.waitState(key, "", cache.StateCommitted)
				} else if !within(4*time.Second+e.proxy.cfg.SlowClientTimeout, func() bool { return e.mock.Active() == 0 }) {
					// Well before the stream's 10 s; a stalled client is
					// seen only once the socket buffers between are full,
					// which a loaded machine takes seconds to fill.
					t.Fatalf("upstream stream still written %v after the client left; want it ended", time.Since(left))
				}
				if !within(5*time.Second, func() bool { return e.proxy.streams.Load() == 0 }) {
					// Its state is committed before the generation
					// releases its slot: on a loaded machine, with
					// Redis, that has taken over a second.
					t.Fatalf("live generations: got %d five seconds after the stream ended; want 0", e.proxy.streams.Load())
				}
				var replay result
				if c.keyed {
					// The generation the client left is kept whole: a
					// repeat of the key is its replay, not a new call.
					replay = e.fetch(req{key: key})
					e.client.CloseIdleConnections() // its goroutines are the test's
					if !clean(replay) || !replay.replayed || len(replay.events) != tokens+3 {
						t.Fatalf("repeat: got %d, %d events ending %q, replayed %v; want the whole stream (%d events ending [DONE]) replayed",
							replay.status, len(replay.events), replay.lastData(), replay.replayed, tokens+3)
					}
				}
				if how == "stop-reading" {
					// Cut by -slow-client-timeout, unless the socket
					// buffers between took the whole stream.
					dropped := within(5*time.Second, func() bool { return testutil.ToFloat64(e.proxy.m.slowDropped) == 1 })
					wantCut(t, conn, seen, replay, dropped)
				}
				conn.Close()
				// And none of ssegate's own, however few: a goroutine a
				// generation leaves behind is one per request.
				if !within(5*time.Second, func() bool {
					n, stacks := goroutines()
					return n <= before+2 && busyGoroutines(stacks) <= beforeOwn
				}) {
					n, stacks := goroutines()
					t.Fatalf("goroutines: got %d, %d running ssegate's code; want at most %d (before the request + 2), %d running ssegate's code\n%s",
						n, busyGoroutines(stacks), before+2, beforeOwn, stacks)
				}
				e.wantCalls(2) // the first stream's and this one's
			})
		}
	}
}

// wantCut reads the rest of what a client that stopped reading was sent,
// seen holding what it read before. Unless it had the whole stream
// (whole: a replay of the same generation), it must have been dropped
// as a slow client, and its answer must read as cut: a chunked body
// without its end and without the stream's terminal event, whose events
// are the start of whole, when there is one.
func wantCut(t *testing.T, conn net.Conn, seen *bytes.Buffer, whole result, dropped bool) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
	resp, err := http.ReadResponse(bufio.NewReader(io.MultiReader(seen, conn)), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body) // to the body's end, or the connection's
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the client that stopped reading: its answer neither ended nor was cut 5 s after the generation, after %d bytes", len(body))
	}
	got := parseResult(resp, body, err)
	if !dropped {
		if whole.raw != nil && len(whole.raw) <= maxSocketBuffers() && err == nil && bytes.Equal(eventBytes(body), eventBytes(whole.raw)) {
			t.Logf("the client that stopped reading had the whole stream (%d bytes) in socket buffers: nothing to cut", len(body))
			return
		}
		t.Fatalf("slow clients dropped: got 0; want 1 (the client that stopped reading got %d bytes of %d, read error %v)", len(body), len(whole.raw), err)
	}
	if err == nil || got.lastData() == "[DONE]" || bytes.Contains(body, []byte("data: [DONE]")) {
		t.Fatalf("the client that stopped reading got %d bytes, read error %v, last event %q; want a cut answer, without [DONE]",
			len(body), err, got.lastData())
	}
	if whole.raw == nil {
		return
	}
	if i := bytes.LastIndex(body, []byte("\n\n")); i < 0 || !bytes.HasPrefix(eventBytes(whole.raw), eventBytes(body[:i+2])) {
		t.Fatalf("the %d bytes the client that stopped reading got are not the start of the stream's replay", len(body))
	}
}

// busyGoroutines counts, in stacks (ownGoroutines'), the goroutines
// running code of ssegate's packages other than tests: the store's, the
// proxy's, the mock upstream's; not an idle worker of the proxy's pool
// (its innermost frame of ssegate's is the pool's), which holds nothing
// and ends on its own.
func busyGoroutines(stacks string) (n int) {
	for _, group := range strings.Split(stacks, "\n\n") {
		if strings.Contains(group, "_test.go:") {
			continue
		}
		_, frames, _ := strings.Cut(group, "github.com/ssegate/ssegate/")
		if frames == "" || strings.HasPrefix(frames, "proxy.(*workers).") {
			continue
		}
		count, _, _ := strings.Cut(group, " @ ")
		c, _ := strconv.Atoi(count)
		n += c
	}
	return n
}

// maxSocketBuffers bounds what a loopback connection can hold unread:
// the sender's largest send buffer (Linux's tcp_wmem maximum) and the
// receiver's small one (dialSmallBuffer's, doubled by the kernel). Where
// it cannot be read, it is unbounded.
func maxSocketBuffers() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	if f := strings.Fields(string(b)); err == nil && len(f) == 3 {
		if n, err := strconv.Atoi(f[2]); err == nil {
			return n + 2*4096
		}
	}
	return math.MaxInt
}

// ownGoroutines labels the calling goroutine with the test's name, and so
// every goroutine started from it from now on, and theirs. It returns a
// count of the goroutines alive with that label, the test's own whatever
// other tests run meanwhile, with their stacks.
func ownGoroutines(t *testing.T) func() (n int, stacks string) {
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("test", t.Name())))
	label := fmt.Sprintf("%q:%q", "test", t.Name())
	return func() (n int, stacks string) {
		var b bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&b, 1) //nolint:errcheck // a bytes.Buffer
		// Groups of goroutines with one stack and one label set: "N @ pcs",
		// "# labels: {...}" when they have labels, then the frames.
		var own []string
		for _, group := range strings.Split(b.String(), "\n\n") {
			lines := strings.Split(group, "\n")
			if strings.HasPrefix(lines[0], "goroutine profile:") {
				lines = lines[1:]
			}
			if len(lines) < 2 || !strings.HasPrefix(lines[1], "# labels: ") || !strings.Contains(lines[1], label) {
				continue
			}
			count, _, _ := strings.Cut(lines[0], " @ ")
			c, _ := strconv.Atoi(count)
			n += c
			own = append(own, strings.Join(lines, "\n"))
		}
		return n, strings.Join(own, "\n\n")
	}
}

// throttled reads at most rate bytes per second on average.
type throttled struct {
	r     io.Reader
	rate  float64
	start time.Time
	n     int
}

func (t *throttled) Read(p []byte) (int, error) {
	if t.start.IsZero() {
		t.start = time.Now()
	}
	if len(p) > 8<<10 {
		p = p[:8<<10]
	}
	n, err := t.r.Read(p)
	t.n += n
	if ahead := time.Duration(float64(t.n)/t.rate*float64(time.Second)) - time.Since(t.start); ahead > 0 {
		time.Sleep(ahead)
	}
	return n, err
}

// TestSlowReaderGetsWholeReplay: "slow" means no progress for
// -slow-client-timeout, never "a big result". A client that reads a
// 6 MB replay (more than the socket buffers between hold, maxSocketBuffers)
// steadily, at a pace that takes several times the bound,
// gets it whole in a correct chunked framing; one that stops reading is
// still dropped after about the bound.
func TestSlowReaderGetsWholeReplay(t *testing.T) {
	// Not parallel: it times the drop of a stopped reader against
	// -slow-client-timeout, and a steady reader must not stall for that
	// long; other tests' load would skew both.
	const slow = 500 * time.Millisecond
	e := newEnv(t, slowMock(0, 750), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.SlowClientTimeout = slow
	})
	key := newKey("big")
	hdr := map[string]string{"X-Mock-Chunk-Bytes": "8000"} // ~6 MB in all
	first := e.fetch(req{key: key, header: hdr})
	if first.lastData() != "[DONE]" || len(first.raw) < 5<<20 || len(first.raw) <= maxSocketBuffers() {
		t.Fatalf("first: %d bytes, last %q; want about 6 MB ending [DONE], more than the socket buffers hold (%d)", len(first.raw), first.lastData(), maxSocketBuffers())
	}
	e.waitState(key, "", cache.StateCommitted)
	dial := func() net.Conn { return dialSmall(t, e, key, chatBody) }

	t.Run("steady reader", func(t *testing.T) {
		conn := dial()
		defer conn.Close()
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		const rate = 3 << 20 // bytes/s: 2 s or more for the whole, four bounds
		start := time.Now()
		resp, err := http.ReadResponse(bufio.NewReader(&throttled{r: conn, rate: rate}), nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(resp.Body) // the chunked reader checks the framing
		took := time.Since(start)
		if err != nil {
			t.Fatalf("after %d bytes in %v: %v; want the whole replay", len(raw), took, err)
		}
		if resp.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(eventBytes(raw), eventBytes(first.raw)) {
			t.Fatalf("got %d bytes (replayed %q); want the %d bytes of the original", len(raw), resp.Header.Get("Idempotent-Replayed"), len(first.raw))
		}
		if took < 2*slow {
			t.Fatalf("read in %v; the reader must take longer than -slow-client-timeout (%v) for this to test anything", took, slow)
		}
		if n := testutil.ToFloat64(e.proxy.m.slowDropped); n != 0 {
			t.Fatalf("slow clients dropped: got %v; want 0", n)
		}
	})

	t.Run("stopped reader", func(t *testing.T) { wantDropped(t, e, dial, slow) })
	e.wantCalls(1)
}

// TestSlowReaderGetsWholeStoredBody: the same for a stored non-streaming
// body: written in pieces, each with its own -slow-client-timeout, so a
// steady reader slower than size/bound gets it whole and a reader that
// stops is dropped (before, fasthttp wrote it with no deadline at all, and
// a client that stopped reading held its connection forever).
func TestSlowReaderGetsWholeStoredBody(t *testing.T) {
	// Not parallel: it times the drop of a stopped reader against
	// -slow-client-timeout, and a steady reader must not stall for that
	// long; other tests' load would skew both.
	const slow = 500 * time.Millisecond
	e := newEnv(t, slowMock(0, 750), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.SlowClientTimeout = slow
	})
	key := newKey("bigbody")
	const body = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Tell me a joke"}]}`
	hdr := map[string]string{"X-Mock-Chunk-Bytes": "8000"}
	first := e.fetch(req{key: key, body: body, header: hdr})
	if first.status != 200 || len(first.raw) < 4<<20 || len(first.raw) <= maxSocketBuffers() {
		t.Fatalf("first: %d, %d bytes; want 200 and several MB, more than the socket buffers hold (%d)", first.status, len(first.raw), maxSocketBuffers())
	}
	e.waitState(key, "", cache.StateCommitted)
	dial := func() net.Conn { return dialSmall(t, e, key, body) }
	t.Run("steady reader", func(t *testing.T) {
		conn := dial()
		defer conn.Close()
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		rate := float64(len(first.raw)) / 2 // about 2 s for the whole: four bounds
		resp, err := http.ReadResponse(bufio.NewReader(&throttled{r: conn, rate: rate}), nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(resp.Body)
		if err != nil || !bytes.Equal(raw, first.raw) || resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("got %d of %d bytes, err %v, replayed %q; want the whole stored body", len(raw), len(first.raw), err, resp.Header.Get("Idempotent-Replayed"))
		}
	})
	t.Run("stopped reader", func(t *testing.T) { wantDropped(t, e, dial, slow) })
	e.wantCalls(1)
}

// dialSmall sends a keyed POST of body on a connection with a small
// receive buffer (set before any byte, so there is no window to fill).
func dialSmall(t *testing.T, e *env, key, body string) net.Conn {
	t.Helper()
	conn := dialSmallBuffer(t, strings.TrimPrefix(e.url, "http://"), 16<<10)
	request := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	return conn
}

// wantDropped: a client that reads nothing of its answer is dropped after
// about -slow-client-timeout (slow).
func wantDropped(t *testing.T, e *env, dial func() net.Conn, slow time.Duration) {
	t.Helper()
	before := testutil.ToFloat64(e.proxy.m.slowDropped)
	conn := dial()
	defer conn.Close()
	start := time.Now()
	waitFor(t, func() bool { return testutil.ToFloat64(e.proxy.m.slowDropped) > before })
	if took := time.Since(start); took < slow*7/8 || took > 4*slow {
		t.Fatalf("dropped after %v; want about -slow-client-timeout (%v)", took, slow)
	}
}

// TestStreamAnsweredToWholeRequest: an upstream that answers an event
// stream to a request that asked for none (no "stream": true). A keyed
// one's generation runs on its handler's goroutine (runsInHandler): its
// client gets the whole stream, as it came, once it ended, and a repeat
// is its replay; one without a key is relayed as a stream. One upstream
// call for each.
func TestStreamAnsweredToWholeRequest(t *testing.T) {
	t.Parallel()
	up := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { okStream(w) })
	e := retryEnv(t, []string{up.url}, nil)
	key := newKey("stream-to-whole")
	for i, r := range []req{{key: key, body: plainBody}, {key: key, body: plainBody}, {body: plainBody}} {
		got := e.fetch(r)
		if !clean(got) || len(got.events) != okEvents+2 || got.aborted {
			t.Fatalf("answer %d: got %d, %d events, aborted %v, %q; want the whole stream of %d events", i, got.status, len(got.events), got.aborted, got.raw, okEvents+2)
		}
		if replay := i == 1; got.replayed != replay {
			t.Fatalf("answer %d: replayed %v, want %v", i, got.replayed, replay)
		}
	}
	wantCount(t, "upstream calls", up.calls.Load(), 2)
}
