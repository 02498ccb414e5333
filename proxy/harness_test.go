package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/poll"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// TestMain runs up to 4×GOMAXPROCS parallel tests at once, unless
// -parallel says how many: a test here mostly waits, on loopback sockets
// and timers, so the default (GOMAXPROCS) leaves the CPUs idle. Tests that
// time what they check are not parallel, and run alone.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if fuzz := flag.Lookup("test.fuzz"); !set && (fuzz == nil || fuzz.Value.String() == "") {
		flag.Set("test.parallel", strconv.Itoa(4*runtime.GOMAXPROCS(0))) //nolint:errcheck // a valid number
	}
	// A client that kept a slice of a journal its stream gave back would
	// then read garbage, which the stream checks catch.
	cache.PoisonFreedBlocks()
	os.Exit(m.Run())
}

// env is one test's world: a real mock LLM on loopback, a real ssegate
// server on loopback in front of it, and an HTTP client.
type env struct {
	t      *testing.T
	mock   *mockllm.Server
	store  *cache.Memory
	proxy  *Proxy
	url    string
	client *http.Client
	// info reads a key's state from the proxy's store, when that is not
	// store (a Redis store: replicaEnv); nil: store's.
	info func(cache.Scope) (cache.KeyInfo, bool)
}

type envOption func(*Config, *cache.Config, *mockllm.Config)

func newEnv(t *testing.T, opts ...envOption) *env {
	t.Helper()
	var pc Config
	var cc cache.Config
	mc := mockllm.Config{Tokens: 16}
	for _, o := range opts {
		o(&pc, &cc, &mc)
	}
	mock, upURL := startMock(t, mc)
	return newEnvUpstream(t, upURL, mock, pc, cc)
}

// startMock starts the mock LLM with mc on loopback, closed when the test
// ends, and returns it with its base URL.
func startMock(t *testing.T, mc mockllm.Config) (*mockllm.Server, string) {
	t.Helper()
	mock := mockllm.New(mc)
	upURL, err := mock.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mock.Close() })
	return mock, upURL
}

// memoryStore is an in-memory store of cc, closed when the test ends.
func memoryStore(t *testing.T, cc cache.Config) *cache.Memory {
	t.Helper()
	store, err := cache.NewMemory(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return store
}

// newEnvUpstream puts ssegate in front of any upstream URL.
func newEnvUpstream(t *testing.T, upURL string, mock *mockllm.Server, pc Config, cc cache.Config) *env {
	t.Helper()
	store, err := cache.NewMemory(cc)
	if err != nil {
		t.Fatal(err)
	}
	if len(pc.Upstreams) == 0 {
		pc.Upstreams = []string{upURL}
	}
	if pc.Store == nil {
		pc.Store = store
	}
	if pc.Logger == nil {
		pc.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		if testing.Verbose() {
			pc.Logger = slog.New(slog.NewTextHandler(&testWriter{t}, nil))
		}
	}
	p, err := New(pc)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := p.Server()
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableCompression: true}}
	t.Cleanup(func() {
		// A fasthttp server's shutdown looks for open connections every
		// 100 ms: kept-alive ones closed first are gone by its first look.
		// The test's own to the proxy, and the proxy's to the upstream
		// (the mock is shut down next).
		client.CloseIdleConnections()
		closeUpstreamIdle(p)
		p.Abort()
		within(100*time.Millisecond, func() bool { return srv.GetOpenConnectionsCount() == 0 })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.ShutdownWithContext(ctx) //nolint:errcheck
		p.Wait(ctx)                  //nolint:errcheck
		// Those the generations just gave back.
		closeUpstreamIdle(p)
		store.Close()
	})
	return &env{
		t: t, mock: mock, store: store, proxy: p, url: "http://" + ln.Addr().String(),
		client: client,
	}
}

func slowMock(delay time.Duration, tokens int) envOption {
	return func(_ *Config, _ *cache.Config, mc *mockllm.Config) {
		mc.Delay = delay
		mc.Tokens = tokens
	}
}

// withConfig changes the proxy's config for one test.
func withConfig(f func(*Config)) envOption {
	return func(pc *Config, _ *cache.Config, _ *mockllm.Config) { f(pc) }
}

// closeUpstreamIdle closes p's idle connections to its upstreams.
func closeUpstreamIdle(p *Proxy) {
	for _, u := range p.ups {
		u.CloseIdleConnections()
	}
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

const chatBody = `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Tell me a joke"}]}`

// req is one request to ssegate.
type req struct {
	method, path, key, body, auth, lastEventID string
	header                                     map[string]string
}

func (e *env) do(r req) *http.Response {
	e.t.Helper()
	if r.method == "" {
		r.method = http.MethodPost
	}
	if r.path == "" {
		r.path = "/v1/chat/completions"
	}
	if r.body == "" && r.method == http.MethodPost {
		r.body = chatBody
	}
	hr, err := http.NewRequest(r.method, e.url+r.path, strings.NewReader(r.body))
	if err != nil {
		e.t.Fatal(err)
	}
	hr.Header.Set("Content-Type", "application/json")
	if r.key != "" {
		hr.Header.Set("Idempotency-Key", r.key)
	}
	if r.auth != "" {
		hr.Header.Set("Authorization", r.auth)
	}
	if r.lastEventID != "" {
		hr.Header.Set("Last-Event-ID", r.lastEventID)
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	resp, err := e.client.Do(hr)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// result is a whole answer read by the client.
type result struct {
	status   int
	header   http.Header
	raw      []byte // the body as received
	events   []sse.Event
	ids      []string
	readErr  error
	aborted  bool   // ended with a stream_aborted error event
	errType  string // the JSON error type of a non-2xx answer
	replayed bool
}

func (e *env) fetch(r req) result {
	e.t.Helper()
	resp := e.do(r)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return parseResult(resp, raw, err)
}

func parseResult(resp *http.Response, raw []byte, readErr error) result {
	res := result{status: resp.StatusCode, header: resp.Header, raw: raw, readErr: readErr,
		replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		res.events, res.ids = parseEvents(raw)
		if n := len(res.events); n > 0 && res.events[n-1].Type == "error" && strings.Contains(res.events[n-1].Data, `"stream_aborted"`) {
			res.aborted = true
		}
	} else if resp.StatusCode >= 400 {
		var b struct {
			Error struct{ Type string } `json:"error"`
		}
		if err := jsonUnmarshal(raw, &b); err == nil {
			res.errType = b.Error.Type
		}
	}
	return res
}

// parseEvents splits an SSE body into events and their ids, by hand, so
// the test does not trust the code under test to read what it wrote.
func parseEvents(raw []byte) ([]sse.Event, []string) {
	var evs []sse.Event
	var ids []string
	for _, block := range strings.Split(string(raw), "\n\n") {
		var ev sse.Event
		var id string
		var data []string
		seen := false
		for _, line := range strings.Split(block, "\n") {
			switch {
			case strings.HasPrefix(line, "id: "):
				id, seen = line[4:], true
			case strings.HasPrefix(line, "event: "):
				ev.Type, seen = line[7:], true
			case strings.HasPrefix(line, "data: "):
				data, seen = append(data, line[6:]), true
			}
		}
		if !seen {
			continue
		}
		ev.Data = strings.Join(data, "\n")
		evs = append(evs, ev)
		ids = append(ids, id)
	}
	return evs, ids
}

// eventBytes is the body without keep-alive comments: what must be
// byte-identical between the clients of one generation.
func eventBytes(raw []byte) []byte {
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	skip := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, ":") {
			skip = true
			continue
		}
		if line == "" && skip {
			skip = false
			continue
		}
		out.WriteString(line)
		out.WriteByte('\n')
	}
	return out.Bytes()
}

// lastData is the data of the last event.
func (r result) lastData() string {
	if len(r.events) == 0 {
		return ""
	}
	return r.events[len(r.events)-1].Data
}

func clean(r result) bool { return r.status == 200 && r.lastData() == "[DONE]" }

// readPrefix reads raw lines until n events (ids) were seen, then closes.
func readPrefix(t *testing.T, resp *http.Response, n int) (lastID string) {
	t.Helper()
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	seen := 0
	for seen < n {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d events: %v", seen, err)
		}
		if id, ok := strings.CutPrefix(line, "id: "); ok {
			lastID = strings.TrimSpace(id)
			seen++
		}
	}
	return lastID
}

func (e *env) calls() int64 { return e.mock.Calls() }

func (e *env) wantCalls(want int64) {
	e.t.Helper()
	if got := e.calls(); got != want {
		e.t.Fatalf("upstream calls: got %d; want %d", got, want)
	}
}

func wantCount(t *testing.T, what string, got, want int64) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: got %d; want %d", what, got, want)
	}
}

// waitState polls the store until the key reaches state.
func (e *env) waitState(key, auth string, state cache.State) cache.KeyInfo {
	e.t.Helper()
	var ki cache.KeyInfo
	var last string
	if within(10*time.Second, func() bool {
		var ok bool
		info := e.store.Info
		if e.info != nil {
			info = e.info
		}
		ki, ok = info(cache.Scope{Tenant: e.tenantOf(auth), Key: key})
		last = fmt.Sprintf("%+v (found %v)", ki, ok)
		return ok && ki.State == state
	}) {
		return ki
	}
	e.t.Fatalf("key %q: got %s; want state %s", key, last, state)
	return cache.KeyInfo{}
}

// waitFor polls cond until it holds, and fails the test after 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	if !within(10*time.Second, cond) {
		t.Fatal("condition not met within 10s")
	}
}

// within polls cond until it holds or d passed (internal/poll.Until):
// what the tests wait for is a condition, never a time.
func within(d time.Duration, cond func() bool) bool { return poll.Until(d, cond) }

// keyedConn sends a keyed streaming request on a connection of its own
// with a small receive buffer (dialSmallBuffer), with the extra header
// lines hdr, and reads nothing.
func keyedConn(t *testing.T, e *env, key string, hdr string) net.Conn {
	t.Helper()
	conn := dialSmallBuffer(t, strings.TrimPrefix(e.url, "http://"), 4096)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		key, hdr, len(chatBody), chatBody)
	return conn
}

// dialSmallBuffer connects to addr with a receive buffer of size bytes,
// set before connecting, so that a client that stops reading is felt at
// once. (Shrunk on an open connection, the buffer is smaller than the
// window already offered, and Linux can stall the sender for long
// zero-window backoffs: a client that reads again gets its bytes seconds
// later.) The connection closes when the test ends.
func dialSmallBuffer(t *testing.T, addr string, size int) *net.TCPConn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			setRcvBuf(fd, size)
		})
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// tenantOf computes the tenant as e's proxy does for a request whose only
// credential is the Authorization header auth.
func (e *env) tenantOf(auth string) string {
	var ctx fasthttp.RequestCtx
	if auth != "" {
		ctx.Request.Header.Set("Authorization", auth)
	}
	t, _ := e.proxy.tenant(&ctx)
	return t
}

var keySeq atomic.Int64

func newKey(prefix string) string { return fmt.Sprintf("%s-%d", prefix, keySeq.Add(1)) }

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// metricValue reads one sample from a Prometheus text scrape.
func metricValue(t *testing.T, scrape, series string) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` ([0-9.e+-]+)$`)
	m := re.FindStringSubmatch(scrape)
	if m == nil {
		t.Fatalf("series %s not in the scrape", series)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// faultServer is a real HTTP upstream on loopback whose every answer is
// chosen by a script from the call's number (1, 2, ...).
type faultServer struct {
	url    string
	calls  atomic.Int64
	script atomic.Value // func(n int64, w http.ResponseWriter, r *http.Request)
}

func newFaultServer(t *testing.T, script func(n int64, w http.ResponseWriter, r *http.Request)) *faultServer {
	t.Helper()
	fs := &faultServer{}
	fs.script.Store(script)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		n := fs.calls.Add(1)
		fs.script.Load().(func(int64, http.ResponseWriter, *http.Request))(n, w, r)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	fs.url = "http://" + ln.Addr().String()
	return fs
}

func (fs *faultServer) set(script func(n int64, w http.ResponseWriter, r *http.Request)) {
	fs.script.Store(script)
}

// retryEnv puts ssegate in front of upstreams, with backoffs of a few
// milliseconds and head and attempt budgets of 5 s: far longer than any
// answer here takes, however loaded the machine. A case that waits for a
// budget to cut sets short ones (shortBudgets).
func retryEnv(t *testing.T, upstreams []string, tune func(*Config)) *env {
	pc := Config{Retry: RetryConfig{BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, AttemptTimeout: 5 * time.Second}, HeadTimeout: 5 * time.Second}
	if tune != nil {
		tune(&pc)
	}
	pc.Upstreams = upstreams
	e := newEnvUpstream(t, upstreams[0], nil, pc, cache.Config{})
	return e
}

// shortBudgets bounds the head and each attempt to 300 ms, for a case
// whose upstream does not answer in time.
func shortBudgets(pc *Config) {
	pc.HeadTimeout = 300 * time.Millisecond
	pc.Retry.AttemptTimeout = 300 * time.Millisecond
}

const okEvents = 5

// okStream answers a clean chat stream of okEvents chunks.
func okStream(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range okEvents {
		fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"},\"finish_reason\":null}]}\n\n", i)
		fl.Flush()
	}
	fmt.Fprint(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
}

func status(code int) func(int64, http.ResponseWriter, *http.Request) {
	return func(_ int64, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"error":{"type":"upstream_says","message":"status %d"}}`, code)
	}
}

// rawUpstream is an upstream on loopback that is only a TCP listener:
// each connection is handed to a script, which may read the request or
// not, answer or not, and stall for as long as it likes (until the test
// ends).
type rawUpstream struct {
	url   string
	calls atomic.Int64
	done  chan struct{} // closed when the test ends: stalled scripts return
}

func newRawUpstream(t *testing.T, script func(u *rawUpstream, c net.Conn)) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{url: "http://" + ln.Addr().String(), done: make(chan struct{})}
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.calls.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				script(u, c)
			}()
		}
	}()
	t.Cleanup(func() {
		close(u.done)
		ln.Close()
		wg.Wait()
	})
	return u
}

// stall waits until the test ends.
func (u *rawUpstream) stall() { <-u.done }

// await waits for ch, or until the test ends; it reports whether ch came.
func (u *rawUpstream) await(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-u.done:
		return false
	}
}

// readRequest reads one request, body and all.
func readRequest(c net.Conn) {
	r, err := http.ReadRequest(bufio.NewReader(c))
	if err == nil {
		io.Copy(io.Discard, r.Body) //nolint:errcheck // only its end matters
	}
}

const plainJSON = `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello there"},"finish_reason":"stop"}]}`

// answerRaw reads the request and writes raw, then closes the connection.
func answerRaw(raw string) func(*rawUpstream, net.Conn) {
	return func(_ *rawUpstream, c net.Conn) {
		readRequest(c)
		io.WriteString(c, raw) //nolint:errcheck // the test reads what arrived
	}
}
