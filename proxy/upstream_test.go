package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/gatetest"
)

const plainBody = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Tell me a joke"}]}`

// chunkEvent is one chat completion chunk event.
func chunkEvent(i int) string {
	return fmt.Sprintf("data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"},\"finish_reason\":null}]}\n\n", i)
}

const streamHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"

// budgetEnv puts ssegate with the given budgets and one attempt per
// request in front of u, logging into log.
func budgetEnv(t *testing.T, u *rawUpstream, head, idle, attempt time.Duration, log *gatetest.LogBuffer) *env {
	pc := Config{HeadTimeout: head, UpstreamIdleTimeout: idle,
		Retry:  RetryConfig{Attempts: 1, AttemptTimeout: attempt},
		Logger: slog.New(slog.NewTextHandler(log, nil))}
	e := newEnvUpstream(t, u.url, nil, pc, cache.Config{})
	e.client.Timeout = 10 * time.Second // a budget that does not hold fails the test, not hangs it
	return e
}

// wantTimeoutLogged checks the metric and the log line of a budget that
// cut an upstream connection (budget ""), or that none did.
func wantTimeoutLogged(t *testing.T, e *env, log *gatetest.LogBuffer, budget, flag string) {
	t.Helper()
	for _, b := range []string{"head", "attempt", "idle"} {
		want := 0.0
		if b == budget {
			want = 1
		}
		if got := testutil.ToFloat64(e.proxy.m.timeouts.WithLabelValues(b)); got != want {
			t.Errorf("ssegate_upstream_timeouts_total{budget=%q}: got %v; want %v", b, got, want)
		}
	}
	logged := strings.Contains(log.String(), `msg="upstream timeout"`)
	switch {
	case budget == "" && logged:
		t.Errorf("an upstream timeout was logged; want none:\n%s", log)
	case budget != "" && (!logged || !strings.Contains(log.String(), "budget="+flag)):
		t.Errorf("no upstream timeout logged with budget=%s:\n%s", flag, log)
	}
}

// TestTimeBudgets: no silent upstream holds a client past its budget, and
// no budget cuts what another one governs. A streaming request's head
// must come within -head-timeout (even when the upstream does not take
// the request at all); a non-streaming answer within -attempt-timeout,
// however long past the head and idle bounds it comes; an answer that
// began, within -upstream-idle-timeout of silence. Each cut is a 504
// upstream_timeout (or, once a body was relayed, a connection closed
// before the end), a log line and a count by budget.
func TestTimeBudgets(t *testing.T) {
	// Not parallel: it measures when each budget cuts, in windows that other
	// tests' load would skew. Its cases run at once: each only waits on a
	// silent upstream of its own.
	const (
		head = 200 * time.Millisecond
		idle = 800 * time.Millisecond
		// Far above head and idle: a cut by either, late on a loaded
		// machine (a race build on two busy cores has taken 1.7 s to
		// answer the head's), still ends before attempt would have.
		attempt = 3 * time.Second
	)
	silent := func(u *rawUpstream, c net.Conn) { readRequest(c); u.stall() }
	// Reads nothing, with a receive buffer too small for the request.
	deaf := func(u *rawUpstream, c net.Conn) { c.(*net.TCPConn).SetReadBuffer(4096); u.stall() }
	headThenSilence := func(u *rawUpstream, c net.Conn) {
		readRequest(c)
		io.WriteString(c, streamHead)
		u.stall()
	}
	late := func(u *rawUpstream, c net.Conn) {
		readRequest(c)
		select {
		case <-time.After(1100 * time.Millisecond): // past head and idle, before attempt
		case <-u.done:
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
		u.stall()
	}
	partial := func(u *rawUpstream, c net.Conn) {
		readRequest(c)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"choices\":")
		u.stall()
	}
	big := `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("a", 12<<20) + `"}]}`
	cases := []struct {
		name     string
		script   func(*rawUpstream, net.Conn)
		body     string
		keyed    bool
		status   int
		errType  string
		readErr  bool // the body ends without its end
		min, max time.Duration
		budget   string
		flag     string
	}{
		{"stream, silent upstream", silent, chatBody, false, 504, "upstream_timeout", false, head, idle - 100*time.Millisecond, "head", "-head-timeout"},
		{"stream, silent upstream, keyed", silent, chatBody, true, 504, "upstream_timeout", false, head, idle - 100*time.Millisecond, "head", "-head-timeout"},
		// The client's own 12 MiB upload takes much of idle's window on a
		// loaded machine under the race detector; the log line names the
		// budget that cut it, so the window only has to end before attempt.
		{"stream, upstream takes no bytes", deaf, big, false, 504, "upstream_timeout", false, head, attempt - 100*time.Millisecond, "head", "-head-timeout"},
		{"stream, head then silence", headThenSilence, chatBody, true, 504, "upstream_timeout", false, idle * 15 / 16, attempt - 100*time.Millisecond, "idle", "-upstream-idle-timeout"},
		{"not streaming, silent upstream", silent, plainBody, false, 504, "upstream_timeout", false, attempt, 3 * attempt, "attempt", "-attempt-timeout"},
		{"not streaming, silent upstream, keyed", silent, plainBody, true, 504, "upstream_timeout", false, attempt, 3 * attempt, "attempt", "-attempt-timeout"},
		{"not streaming, late answer", late, plainBody, true, 200, "", false, 1100 * time.Millisecond, attempt - 100*time.Millisecond, "", ""},
		{"not streaming, body stalls", partial, plainBody, false, 200, "", true, idle * 15 / 16, attempt - 100*time.Millisecond, "idle", "-upstream-idle-timeout"},
		{"not streaming, body stalls, keyed", partial, plainBody, true, 504, "upstream_timeout", false, idle * 15 / 16, attempt - 100*time.Millisecond, "idle", "-upstream-idle-timeout"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			u := newRawUpstream(t, c.script)
			var log gatetest.LogBuffer
			e := budgetEnv(t, u, head, idle, attempt, &log)
			key := ""
			if c.keyed {
				key = newKey("budget")
			}
			start := time.Now()
			got := e.fetch(req{key: key, body: c.body})
			took := time.Since(start)
			if got.status != c.status || got.errType != c.errType || (got.readErr != nil) != c.readErr {
				t.Fatalf("got %d %q, read error %v (%.200q); want %d %q, read error %v", got.status, got.errType, got.readErr, got.raw, c.status, c.errType, c.readErr)
			}
			if took < c.min || took > c.max {
				t.Fatalf("answered after %v; want between %v and %v", took, c.min, c.max)
			}
			if c.status == 200 && !c.readErr && string(got.raw) != `{"ok":true}` {
				t.Fatalf("body %q; want the upstream's whole answer", got.raw)
			}
			wantCount(t, "upstream calls", u.calls.Load(), 1)
			wantTimeoutLogged(t, e, &log, c.budget, c.flag)
			if c.keyed {
				want := cache.StateCommitUnknown
				switch {
				case c.status == 200:
					want = cache.StateCommitted
				case c.budget == "idle" && c.body == plainBody:
					want = cache.StateFailedRetryable // the head came: a failed read
				}
				e.waitState(key, "", want)
			}
		})
	}
}

// TestStreamSilenceAborted: a stream whose head came after longer than
// -upstream-idle-timeout (the idle bound starts with the answer; the
// head has its own) and that then falls silent after two events is
// aborted about one idle bound after its last byte: stream_aborted with
// code upstream_idle_timeout, nothing stored, a log line and a count.
func TestStreamSilenceAborted(t *testing.T) {
	// Not parallel: it measures the silence before the abort against
	// -upstream-idle-timeout.
	const (
		head    = 2 * time.Second
		idle    = 300 * time.Millisecond
		attempt = 5 * time.Second
	)
	u := newRawUpstream(t, func(u *rawUpstream, c net.Conn) {
		readRequest(c)
		select {
		case <-time.After(500 * time.Millisecond):
		case <-u.done:
			return
		}
		io.WriteString(c, streamHead+chunkEvent(0)+chunkEvent(1))
		u.stall()
	})
	var log gatetest.LogBuffer
	e := budgetEnv(t, u, head, idle, attempt, &log)
	key := newKey("silence")
	start := time.Now()
	resp := e.do(req{key: key})
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d; want 200 (the head came within -head-timeout)", resp.StatusCode)
	}
	var raw bytes.Buffer
	var lastEvent time.Time
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		raw.WriteString(line)
		if strings.HasPrefix(line, "data: {\"object\"") {
			lastEvent = time.Now()
		}
		if err != nil {
			break
		}
	}
	end := time.Now()
	got := parseResult(resp, raw.Bytes(), nil)
	if len(got.events) != 3 || !got.aborted || !strings.Contains(got.lastData(), `"code":"upstream_idle_timeout"`) {
		t.Fatalf("got %d events, aborted %v, last %q; want 2 events and stream_aborted upstream_idle_timeout", len(got.events), got.aborted, got.lastData())
	}
	if silence := end.Sub(lastEvent); silence < idle*15/16 || silence > 3*idle {
		t.Fatalf("aborted %v after the last event; want about -upstream-idle-timeout (%v)", silence, idle)
	}
	if took := end.Sub(start); took > attempt/2 {
		t.Fatalf("the stream took %v; want it cut well before -attempt-timeout (%v)", took, attempt)
	}
	ki := e.waitState(key, "", cache.StateFailedRetryable)
	if ki.BodyStored {
		t.Fatalf("an aborted stream was stored")
	}
	wantTimeoutLogged(t, e, &log, "idle", "-upstream-idle-timeout")
}

// TestTimeBudgetsTLS: over TLS the budgets hold to the HTTP answer, not
// to TLS records. A TLS 1.3 server may send its session ticket after the
// client's Finished, so that it arrives after the request went out and
// before any answer: it must neither pass for the answer's first byte
// (which would put a stream's head, or a non-streaming answer, under the
// silence bound) nor go unbounded.
func TestTimeBudgetsTLS(t *testing.T) {
	// Not parallel: it measures when the budgets cut, in windows that other
	// tests' load would skew. Its two cases run at once: each only waits on
	// the server.
	const (
		head    = 200 * time.Millisecond
		idle    = 800 * time.Millisecond
		attempt = 1600 * time.Millisecond
	)
	done := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		wait := 1100 * time.Millisecond // a non-streaming answer, past head and idle, before attempt
		if r.Header.Get("X-Silent") != "" {
			wait = time.Hour
		}
		select {
		case <-time.After(wait):
		case <-done:
			return
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}))
	// Asking for a client certificate makes Go's server send its ticket
	// after the client's Finished, as OpenSSL-based servers do; a client
	// sends for tickets only with a session cache.
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	t.Cleanup(func() { close(done); srv.Close() })
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	cases := []struct {
		name     string
		r        req
		status   int
		min, max time.Duration
	}{
		{"late non-streaming answer", req{body: plainBody}, 200, 1100 * time.Millisecond, attempt - 100*time.Millisecond},
		{"silent stream", req{header: map[string]string{"X-Silent": "1"}}, 504, head, idle - 100*time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// A session cache of its own: a full handshake, with its ticket.
			tc := &tls.Config{RootCAs: roots, ClientSessionCache: tls.NewLRUClientSessionCache(4)}
			pc := Config{HeadTimeout: head, UpstreamIdleTimeout: idle, UpstreamTLS: tc,
				Retry: RetryConfig{Attempts: 1, AttemptTimeout: attempt}}
			e := newEnvUpstream(t, srv.URL, nil, pc, cache.Config{})
			e.client.Timeout = 10 * time.Second
			start := time.Now()
			got := e.fetch(c.r)
			took := time.Since(start)
			if got.status != c.status || took < c.min || took > c.max {
				t.Fatalf("got %d %q after %v; want %d after %v to %v", got.status, got.raw, took, c.status, c.min, c.max)
			}
			if c.status == 200 && string(got.raw) != `{"ok":true}` {
				t.Fatalf("body %q; want the upstream's answer", got.raw)
			}
		})
	}
}

// TestStalePooledConnection: an upstream that closes a kept-alive
// connection while it sits in the pool does not cost the next request its
// answer: its first write finds the close before sending a byte, and the
// request goes out on a new connection; one upstream call per request.
func TestStalePooledConnection(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var calls, closed atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		calls.Add(1)
		okStream(w)
	}), IdleTimeout: 50 * time.Millisecond, // closes a kept-alive connection after 50 ms idle
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed { // after the close
				closed.Add(1)
			}
		}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	url := "http://" + ln.Addr().String()
	e := retryEnv(t, []string{url}, nil)
	for i := range 3 {
		got := e.fetch(req{key: newKey("stale")})
		if !clean(got) {
			t.Fatalf("request %d: got %d %q; want a clean stream", i, got.status, got.errType)
		}
		// The upstream closes the pooled connection meanwhile (on
		// loopback its FIN is in the proxy's socket when close returns).
		waitFor(t, func() bool { return closed.Load() > int64(i) })
	}
	wantCount(t, "upstream calls", calls.Load(), 3)
}

// TestAnswersWithoutBody: answers fasthttp gives no body stream for (to a
// HEAD, a 204) are relayed, keyed or not, and the proxy serves on.
func TestAnswersWithoutBody(t *testing.T) {
	t.Parallel()
	fs := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	e := retryEnv(t, []string{fs.url}, nil)
	if got := e.fetch(req{method: http.MethodHead, path: "/v1/models"}); got.status != http.StatusNoContent {
		t.Fatalf("HEAD: got %d; want the upstream's 204", got.status)
	}
	key := newKey("nobody")
	body := `{"model":"m","messages":[]}`
	if got := e.fetch(req{key: key, body: body}); got.status != http.StatusNoContent {
		t.Fatalf("keyed: got %d; want the upstream's 204", got.status)
	}
	if got := e.fetch(req{key: key, body: body}); got.status != http.StatusNoContent || !got.replayed {
		t.Fatalf("keyed repeat: got %d replayed %v; want 204 replayed", got.status, got.replayed)
	}
	wantCount(t, "upstream calls", fs.calls.Load(), 2)
}
