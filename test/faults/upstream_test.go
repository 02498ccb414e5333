package faults_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ssegate/ssegate/internal/mcpmock"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/valyala/fasthttp"
)

// originHeader names the client request an upstream call is made for. The
// proxy copies a request's headers to its upstream calls, so every call of
// one generation (its first and its retries) carries the header of the
// request that started it: the upstream can tell a retry of one request
// from a new generation of the same key. It is not part of the
// fingerprint, so duplicates that differ in it still join.
const originHeader = "X-Faults-Request"

// slowFirst is how late the first event (or body) of fSlowFirst comes: well
// inside the proxy's attempt and idle timeouts.
const slowFirst = 300 * time.Millisecond

// reference is a spec's whole answer as the mock makes it, fetched before
// the round with no fault, and the streams of its error-after faults.
type reference struct {
	raw        [][]byte // the stream's event blocks
	events     []event
	body       []byte // a non-streaming answer
	errorAfter map[int][]event
}

// call is one upstream call, as the upstream saw and answered it.
type call struct {
	spec   *spec
	n      int    // the spec's n-th call
	origin string // originHeader: the client request it is made for
	key    string // the Idempotency-Key it carried
	fault  fault
	class  class
	sent   []event // the events sent (for a fault mid-stream, those before it)
	status int     // an error answer's status
	body   []byte  // a non-streaming body or an error answer's body, as sent
	at     time.Time
}

func (c *call) String() string {
	return fmt.Sprintf("call #%d for %s: %s (%s)", c.n, c.origin, c.fault, c.class)
}

// upstream is the LLM API the proxy calls: the mock's own handler, with
// X-Mock-Fault set for the faults the mock has, and the faults it lacks
// written here. It keeps every call, by spec.
type upstream struct {
	plan *plan
	mock *mockllm.Server
	srv  *fasthttp.Server
	url  string
	ln   net.Listener

	closing chan struct{} // closed by close: generated streams end

	mu      sync.Mutex // guards calls, unknown and every call's fields
	calls   map[string][]*call
	unknown []string // requests that named no spec of the plan

	connsMu sync.Mutex // guards conns
	conns   map[net.Conn]fasthttp.ConnState

	tools *tools // the MCP server, on mcpmock.Path
}

func newUpstream(p *plan, mock *mockllm.Server) (*upstream, error) {
	u := &upstream{plan: p, mock: mock, closing: make(chan struct{}),
		calls: map[string][]*call{}, conns: map[net.Conn]fasthttp.ConnState{}}
	u.srv = &fasthttp.Server{
		Handler:               u.handle,
		Name:                  "faults-upstream",
		Concurrency:           1 << 16,
		ReadBufferSize:        16 << 10,
		NoDefaultDate:         true,
		CloseOnShutdown:       true,
		MaxIdleWorkerDuration: 500 * time.Millisecond,
		Logger:                quietLogger{},
		ConnState: func(c net.Conn, st fasthttp.ConnState) {
			u.connsMu.Lock()
			defer u.connsMu.Unlock()
			if st == fasthttp.StateClosed || st == fasthttp.StateHijacked {
				delete(u.conns, c)
			} else {
				u.conns[c] = st
			}
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u.ln = ln
	u.url = "http://" + ln.Addr().String()
	if u.tools, err = newTools(p.tools, u); err != nil {
		ln.Close()
		return nil, err
	}
	go u.srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	return u, nil
}

// closeIdle closes the keep-alive connections that wait for a next
// request, so that their goroutines do not count as the proxy's.
func (u *upstream) closeIdle() {
	u.tools.closeIdle()
	u.connsMu.Lock()
	defer u.connsMu.Unlock()
	for c, st := range u.conns {
		if st == fasthttp.StateIdle {
			_ = c.Close()
		}
	}
}

// close ends the generated streams and the server; connections that do
// not end within a second (a proxy that stopped reading) are cut.
func (u *upstream) close() {
	close(u.closing)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if u.srv.ShutdownWithContext(ctx) != nil {
		u.connsMu.Lock()
		for c := range u.conns {
			_ = c.Close()
		}
		u.connsMu.Unlock()
		_ = u.srv.Shutdown()
	}
	u.tools.close()
}

// callsOf returns a copy of the calls made for a spec, in arrival order.
func (u *upstream) callsOf(name string) []call {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]call, len(u.calls[name]))
	for i, c := range u.calls[name] {
		out[i] = *c
	}
	return out
}

func (u *upstream) unknownRequests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.tools.mu.Lock()
	defer u.tools.mu.Unlock()
	return append(append([]string(nil), u.unknown...), u.tools.unknown...)
}

func (u *upstream) handle(ctx *fasthttp.RequestCtx) {
	if string(ctx.Path()) == mcpmock.Path {
		u.tools.handle(ctx)
		return
	}
	origin := string(ctx.Request.Header.Peek(originHeader))
	name, _, _ := strings.Cut(origin, "/")
	s := u.plan.byKey[name]
	if s == nil {
		// The warm-up, or a stray request: the mock answers it whole.
		if origin != warmupOrigin {
			u.mu.Lock()
			u.unknown = append(u.unknown, fmt.Sprintf("%s %s (%s: %q)", ctx.Method(), ctx.Path(), originHeader, origin))
			u.mu.Unlock()
		}
		u.mock.Handler(ctx)
		return
	}
	u.mu.Lock()
	c := &call{spec: s, n: len(u.calls[s.name]) + 1, origin: origin,
		key: string(ctx.Request.Header.Peek("Idempotency-Key")), at: time.Now()}
	c.fault = s.fault(c.n)
	c.class = c.fault.kind.class()
	if c.fault.kind == fErrorMid && preambleOnly(s.ref.events[:min(c.fault.n, len(s.ref.events))]) {
		// An error before any output: the upstream said it failed before
		// it produced anything (docs/design.md, The preamble).
		c.class = notRun
	}
	u.calls[s.name] = append(u.calls[s.name], c)
	u.mu.Unlock()

	h := &ctx.Request.Header
	h.Set("X-Mock-Tokens", strconv.Itoa(s.tokens))
	h.Set("X-Mock-Delay", s.delay.String())
	if s.chunk > 0 {
		h.Set("X-Mock-Chunk-Bytes", strconv.Itoa(s.chunk))
	}
	ref := &s.ref
	f := c.fault
	mockFault := func(v string, sent []event) {
		if f.kind == fNone {
			u.setSent(c, sent, ref.body)
		} else {
			u.setSent(c, sent, nil)
		}
		if v != "" {
			h.Set("X-Mock-Fault", v)
		}
		u.mock.Handler(ctx)
	}
	switch f.kind {
	case fNone:
		mockFault("", ref.events)
	case f429RetryAfter, f500, f503:
		mockFault("status="+map[faultKind]string{f429RetryAfter: "429", f500: "500", f503: "503"}[f.kind], nil)
		u.setError(c, ctx.Response.StatusCode(), ctx.Response.Body())
	case fErrorFirst:
		mockFault("error-after=0", ref.errorAfter[0])
	case fErrorMid:
		mockFault(fmt.Sprintf("error-after=%d", f.n), ref.errorAfter[f.n])
	case fHang:
		mockFault("hang", nil)
	case fResetAfter:
		mockFault(fmt.Sprintf("reset-after=%d", f.n), ref.events[:f.n])
	case fCut:
		mockFault(fmt.Sprintf("eof-after=%d", f.n), ref.events[:f.n])
	case fStall:
		mockFault(fmt.Sprintf("hang-after=%d", f.n), ref.events[:f.n])

	case f429:
		body := []byte(`{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}`)
		if s.dialect == messagesStream {
			body = []byte(`{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}`)
		}
		ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
		u.setError(c, fasthttp.StatusTooManyRequests, body)
	case fSlowFirst:
		if !s.dialect.stream() {
			u.setSent(c, nil, ref.body)
			if !u.sleep(slowFirst) {
				return
			}
			ctx.SetContentType("application/json")
			ctx.SetBody(ref.body)
			return
		}
		u.setSent(c, ref.events, nil)
		u.stream(ctx, s, ref.raw, slowFirst)
	case fMalformed:
		raw := append([][]byte(nil), ref.raw...)
		evs := append([]event(nil), ref.events...)
		bad := malformedEvent(s.dialect)
		raw[f.n] = bad
		_, be, _ := parseStream(bad)
		evs[f.n] = be[0]
		u.setSent(c, evs, nil)
		u.stream(ctx, s, raw, 0)
	case fNoDone, fNoDoneNoUsage:
		n := len(ref.raw) - 1 // without [DONE]
		if f.kind == fNoDoneNoUsage {
			n-- // and without the usage chunk
		}
		raw := append([][]byte(nil), ref.raw[:n]...)
		evs := append([]event(nil), ref.events[:n]...)
		if f.kind == fNoDone {
			for i, ev := range raw {
				if b := bytes.Replace(ev, []byte(`"finish_reason":"stop"`), []byte(`"finish_reason":"`+f.finish+`"`), 1); !bytes.Equal(b, ev) {
					raw[i] = b
					_, fe, _ := parseStream(b)
					evs[i] = fe[0]
				}
			}
		}
		u.setSent(c, evs, nil)
		u.stream(ctx, s, raw, 0)
	case fGarbage200:
		body := []byte("<html><head><title>Service Unavailable</title></head><body>The gateway is warming up.</body></html>\n")
		u.setSent(c, nil, body)
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetContentType("text/html; charset=utf-8")
		ctx.SetBody(body)
	case fResetHead:
		u.hijack(ctx, resetConn)
	case fBadChunk:
		u.setSent(c, ref.events[:f.n], nil)
		u.hijack(ctx, func(conn net.Conn) {
			w := bufio.NewWriter(conn)
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
			if w.Flush() != nil {
				return
			}
			for _, ev := range ref.raw[:f.n] {
				if !u.sleep(s.delay) {
					return
				}
				fmt.Fprintf(w, "%x\r\n%s\r\n", len(ev), ev)
				if w.Flush() != nil {
					return
				}
			}
			w.WriteString("zz\r\ndata: {}\n\n\r\n") // a chunk size that is not hex
			_ = w.Flush()
		})
	case fCutBody:
		u.setSent(c, nil, ref.body[:len(ref.body)/2])
		u.hijack(ctx, func(conn net.Conn) {
			fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(ref.body), ref.body[:len(ref.body)/2])
		})
	case fCutChunked:
		u.setSent(c, nil, ref.body[:len(ref.body)/2])
		u.hijack(ctx, func(conn net.Conn) {
			half := ref.body[:len(ref.body)/2]
			fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(half), half)
		})
	case fMarked502, fMarked504:
		// What an ssegate answers when the request went on from it and no
		// answer can be known: the upstream behind it may be running it.
		code, typ := fasthttp.StatusBadGateway, "upstream_error"
		if f.kind == fMarked504 {
			code, typ = fasthttp.StatusGatewayTimeout, "upstream_timeout"
		}
		body := []byte(`{"error":{"type":"` + typ + `","message":"the upstream took the request and did not answer; its outcome is unknown, and it was not sent again"}}`)
		ctx.Response.Header.Set("Ssegate-Outcome", "unknown")
		ctx.SetStatusCode(code)
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
		u.setError(c, code, body)
	case fBalancer504:
		// A balancer that read the request, passed it on and gave up
		// waiting for its backend (nginx's proxy_read_timeout).
		body := []byte("<html>\r\n<head><title>504 Gateway Time-out</title></head>\r\n<body>\r\n<center><h1>504 Gateway Time-out</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")
		ctx.SetStatusCode(fasthttp.StatusGatewayTimeout)
		ctx.SetContentType("text/html")
		ctx.SetBody(body)
		u.setError(c, fasthttp.StatusGatewayTimeout, body)
	case fCutClose:
		// The body's end is the connection's: by HTTP's framing the
		// answer is complete, and only its JSON shows it is cut.
		u.setSent(c, nil, ref.body[:len(ref.body)/2])
		u.hijack(ctx, func(conn net.Conn) {
			fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n%s", ref.body[:len(ref.body)/2])
		})
	default:
		panic("unhandled fault " + f.String())
	}
}

func (u *upstream) setSent(c *call, sent []event, body []byte) {
	u.mu.Lock()
	c.sent, c.body = sent, body
	u.mu.Unlock()
}

func (u *upstream) setError(c *call, status int, body []byte) {
	u.mu.Lock()
	c.status, c.body = status, append([]byte(nil), body...)
	u.mu.Unlock()
}

// sleep waits d, or reports false when the upstream is closing.
func (u *upstream) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-u.closing:
		return false
	}
}

// stream answers with the event blocks raw, paced at the spec's delay, the
// first after first when that is longer; the body then ends properly.
func (u *upstream) stream(ctx *fasthttp.RequestCtx, s *spec, raw [][]byte, first time.Duration) {
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.ImmediateHeaderFlush = true
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		for i, ev := range raw {
			d := s.delay
			if i == 0 {
				d = max(d, first)
			}
			if !u.sleep(d) {
				return
			}
			_, _ = w.Write(ev)
			if w.Flush() != nil {
				return
			}
		}
	})
}

// hijack takes the connection over once the handler returns and runs f on
// the connection fasthttp accepted (a *net.TCPConn, for SO_LINGER).
func (u *upstream) hijack(ctx *fasthttp.RequestCtx, f func(net.Conn)) {
	conn := ctx.Conn()
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(net.Conn) { f(conn) })
}

// resetConn closes c with SO_LINGER 0: the peer sees a reset, not an end.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// malformedEvent is an event whose data is cut inside its JSON.
func malformedEvent(d dialect) []byte {
	switch d {
	case messagesStream:
		return []byte("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_del\n\n")
	case responsesStream:
		return []byte("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"content_index\":0,\"delta\":\"tru\n\n")
	}
	return []byte("data: {\"id\":\"chatcmpl-x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tru\n\n")
}

// fetchReferences asks the mock for every spec's whole answer and for the
// streams of the spec's error-after faults.
func fetchReferences(mockURL string, p *plan) error {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableCompression: true}}
	defer hc.CloseIdleConnections()
	get := func(s *spec, fault string) ([]byte, error) {
		req, err := http.NewRequest(http.MethodPost, mockURL+s.dialect.path(), strings.NewReader(s.body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Mock-Tokens", strconv.Itoa(s.tokens))
		if s.chunk > 0 {
			req.Header.Set("X-Mock-Chunk-Bytes", strconv.Itoa(s.chunk))
		}
		if fault != "" {
			req.Header.Set("X-Mock-Fault", fault)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
		}
		return b, err
	}
	for _, s := range p.specs {
		b, err := get(s, "")
		if err != nil {
			return fmt.Errorf("reference of %s: %w", s.name, err)
		}
		if !s.dialect.stream() {
			s.ref.body = b
			continue
		}
		if s.ref.raw, s.ref.events, err = parseStream(b); err != nil {
			return fmt.Errorf("reference of %s: %w", s.name, err)
		}
		s.ref.errorAfter = map[int][]event{}
		for _, f := range s.faults {
			n := f.n
			if f.kind == fErrorFirst {
				n = 0
			} else if f.kind != fErrorMid {
				continue
			}
			b, err := get(s, fmt.Sprintf("error-after=%d", n))
			if err != nil {
				return fmt.Errorf("error-after=%d stream of %s: %w", n, s.name, err)
			}
			if _, s.ref.errorAfter[n], err = parseStream(b); err != nil {
				return fmt.Errorf("error-after=%d stream of %s: %w", n, s.name, err)
			}
		}
	}
	return nil
}

// quietLogger discards fasthttp's messages: faults cut connections on purpose.
type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}
