package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// env is one test's world: a real mock LLM on loopback, a real ssegate
// server on loopback in front of it, and an HTTP client.
type env struct {
	t      *testing.T
	mock   *mockllm.Server
	store  *cache.Memory
	proxy  *Proxy
	url    string
	client *http.Client
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
	mock := mockllm.New(mc)
	upURL, err := mock.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mock.Close() })
	return newEnvUpstream(t, upURL, mock, pc, cc)
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
		// The server waits for keep-alive connections to idle a while
		// before closing them; the test's own can go at once.
		client.CloseIdleConnections()
		p.Abort()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.ShutdownWithContext(ctx) //nolint:errcheck
		p.Wait(ctx)                  //nolint:errcheck
		store.Close()
	})
	return &env{
		t: t, mock: mock, store: store, proxy: p, url: "http://" + ln.Addr().String(),
		client: client,
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

func (e *env) calls() int64 { return e.mock.Calls() }

func (e *env) wantCalls(want int64) {
	e.t.Helper()
	if got := e.calls(); got != want {
		e.t.Fatalf("upstream calls: got %d; want %d", got, want)
	}
}

// waitState polls GET /keys/{key} until the key reaches state.
func (e *env) waitState(key, auth string, state cache.State) cache.KeyInfo {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		ki, ok := e.store.Info(cache.Scope{Tenant: e.tenantOf(auth), Key: key})
		if ok && ki.State == state {
			return ki
		}
		last = fmt.Sprintf("%+v (found %v)", ki, ok)
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatalf("key %q: got %s; want state %s", key, last, state)
	return cache.KeyInfo{}
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
