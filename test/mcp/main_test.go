package mcp_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mcpmock"
	"github.com/ssegate/ssegate/internal/poll"
)

func TestMain(m *testing.M) { gatetest.Main(m) }

// metaKey is the params._meta member that carries a tool call's key for
// clients that cannot set a header per call.
const metaKey = "ssegate/idempotency-key"

// delay is how long a write runs: long enough to cut its caller and
// re-issue while it runs, even on a loaded machine.
const delay = 1500 * time.Millisecond

// steps is the number of progress notifications a write sends.
const steps = 3

// mode is how the server answers: SSE streams or JSON, without sessions
// (the Go SDK then speaks protocol 2026-07-28) or with them (it falls
// back to 2025-11-25, with Mcp-Session-Id).
type mode struct {
	name            string
	json, stateless bool
}

// modes are the server's modes the Go SDK client is tested against.
var modes = []mode{{"sse-stateless", false, true}, {"json-sessions", true, false}}

// forModes runs f for each of ms as a parallel subtest, in parallel with
// the package's other tests: they mostly wait for tools to run.
func forModes(t *testing.T, ms []mode, f func(t *testing.T, m mode)) {
	t.Parallel()
	for _, m := range ms {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			f(t, m)
		})
	}
}

// world is one test's MCP server and the ssegate in front of it.
type world struct {
	t    *testing.T
	mock *mcpmock.Server
	up   string // the mock's base URL
	gate *gatetest.Process
	auth string // the tenant's credential
}

// newWorld starts a mock in the given mode and ssegate in front of it
// with -mcp-path /mcp and args.
func newWorld(t *testing.T, m mode, args ...string) *world {
	t.Helper()
	w := &world{t: t, auth: "Bearer mcp-" + unique("tenant")}
	w.startMock(m)
	w.gate = w.startGate(args...)
	return w
}

func (w *world) startMock(m mode) {
	w.t.Helper()
	w.mock = mcpmock.New(mcpmock.Config{JSON: m.json, Stateless: m.stateless, Delay: delay, Steps: steps})
	var err error
	if w.up, err = w.mock.Start("127.0.0.1:0"); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { w.mock.Close() })
}

// startGate runs ssegate in front of the world's mock. It is killed at
// the end of the test: these tests are not about draining.
func (w *world) startGate(args ...string) *gatetest.Process {
	w.t.Helper()
	return gatetest.Config{Probe: "/keys/startup-probe"}.Start(w.t,
		append([]string{"-upstream", w.up, "-mcp-path", mcpmock.Path, "-log-format", "text", "-heartbeat", "1h"}, args...)...)
}

// unique returns prefix with a random suffix, so that keys and targets
// of one run never meet another's on a shared Redis.
func unique(prefix string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// waitRuns waits until target has run at least n times, or fails.
func (w *world) waitRuns(target string, n int64) {
	w.t.Helper()
	poll.For(w.t, 10*time.Second, fmt.Sprintf("%d runs of %s", n, target), func() bool { return w.mock.Runs(target) >= n })
}

// settle waits longer than a write runs, so that a second run, if one
// was started, has been counted, then checks target ran want times.
func (w *world) settle(target string, want int64) {
	w.t.Helper()
	w.settleAll(map[string]int64{target: want})
}

// wantRuns checks that target has run want times.
func (w *world) wantRuns(target string, want int64) {
	w.t.Helper()
	if got := w.mock.Runs(target); got != want {
		w.t.Fatalf("runs of %s: got %d; want %d", target, got, want)
	}
}

// settleAll waits longer than a write runs, so that a second run of any
// of the targets, if one was started, has been counted, then checks each
// ran as many times as want says. What it waits for is that nothing more
// happens, which no condition can signal: it is a pause, the one of
// these tests.
func (w *world) settleAll(want map[string]int64) {
	w.t.Helper()
	time.Sleep(delay + 500*time.Millisecond)
	for target, n := range want {
		if got := w.mock.Runs(target); got != n {
			w.t.Errorf("runs of %s: got %d; want %d", target, got, n)
		}
	}
}

// caller is one MCP client session (the Go SDK) through ssegate: its
// connections can be cut, and it counts the progress notifications it
// gets per token.
type caller struct {
	cs *mcp.ClientSession

	mu       sync.Mutex // guards conns, progress
	conns    []net.Conn
	progress map[string]int
}

// dial connects a Go SDK client session to url's MCP endpoint with the
// world's credential; key, if not empty, is sent as Idempotency-Key on
// its tools/call POSTs.
func (w *world) dial(url, key string) *caller {
	w.t.Helper()
	c := &caller{progress: map[string]int{}}
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{DisableCompression: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if err == nil {
			c.mu.Lock()
			c.conns = append(c.conns, conn)
			c.mu.Unlock()
		}
		return conn, err
	}}
	w.t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: keyed{base: tr, auth: w.auth, key: key}}
	client := mcp.NewClient(&mcp.Implementation{Name: "ssegate-test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress[fmt.Sprint(r.Params.ProgressToken)]++
			c.mu.Unlock()
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url + mcpmock.Path, HTTPClient: hc,
		MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	if err != nil {
		w.t.Fatalf("connect to %s: %v", url, err)
	}
	c.cs = cs
	w.t.Cleanup(func() { cs.Close() })
	return c
}

// cut closes every connection of the session, as a network that drops.
func (c *caller) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		conn.Close()
	}
}

// progressOf returns how many progress notifications came with token.
func (c *caller) progressOf(token string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.progress[token]
}

// tokens returns the progress tokens notifications came with.
func (c *caller) tokens() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ts []string
	for tok := range c.progress {
		ts = append(ts, tok)
	}
	return ts
}

// call is one tools/call's params: the tool, its target, and its key in
// _meta when metaKey is not empty, with a progress token.
func call(tool, target, key, token string, extra map[string]any) *mcp.CallToolParams {
	args := map[string]any{"target": target}
	for k, v := range extra {
		args[k] = v
	}
	p := &mcp.CallToolParams{Name: tool, Arguments: args}
	if key != "" {
		p.Meta = mcp.Meta{metaKey: key}
	}
	if token != "" {
		p.SetProgressToken(token)
	}
	return p
}

// callTool calls p on c with a bound, returning its result or error.
func (c *caller) callTool(p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return c.cs.CallTool(ctx, p)
}

// keyed sets the tenant's credential on every request, and the
// Idempotency-Key header on tools/call POSTs, as a client that sets a
// header per call does.
type keyed struct {
	base      http.RoundTripper
	auth, key string
}

func (k keyed) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", k.auth)
	if k.key != "" && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, err
		}
		var msg struct {
			Method string `json:"method"`
		}
		if json.Unmarshal(body, &msg) == nil && msg.Method == "tools/call" {
			r.Header.Set("Idempotency-Key", k.key)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
	}
	return k.base.RoundTrip(r)
}

// answer is an HTTP answer as a raw client read it.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// rawPost sends one JSON-RPC message to url's MCP endpoint with the
// world's credential and headers, and returns the answer.
func (w *world) rawPost(url, msg string, header map[string]string) answer {
	w.t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+mcpmock.Path, strings.NewReader(msg))
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("Authorization", w.auth)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		w.t.Fatalf("POST %s: reading the answer: %v", url, err)
	}
	return answer{resp.StatusCode, resp.Header, body}
}

// keyState returns GET /keys/{key}'s status and body on g.
func (w *world) keyState(g *gatetest.Process, key string) (int, string) {
	w.t.Helper()
	return w.keyRequest(g, http.MethodGet, key)
}

func (w *world) keyRequest(g *gatetest.Process, method, key string) (int, string) {
	w.t.Helper()
	req, err := http.NewRequest(method, g.URL+"/keys/"+key, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("Authorization", w.auth)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatalf("%s /keys/%s: %v", method, key, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
