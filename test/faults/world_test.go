package faults_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mcpmock"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/proxy"
	"github.com/valyala/fasthttp"
)

// The proxy's timeouts in the test: short, so that hangs and stalls end in
// a second and a half, and far above what a healthy stream of the round
// needs (events every 4–12 ms, the slow first token at 300 ms).
const (
	upstreamTimeout = 1500 * time.Millisecond // -upstream-idle-timeout and -attempt-timeout
	slowClient      = time.Second             // -slow-client-timeout
	heartbeat       = 250 * time.Millisecond  // -heartbeat
	hangLimit       = 15 * time.Second        // the mock's bound on hang and hang-after
)

// warmupOrigin marks the request that readies the round's connections.
const warmupOrigin = "warmup/0"

// world is one round's processes-in-a-process: the mock LLM, the faulty
// upstream around it, and ssegate wired as cmd/ssegate wires it (the
// in-memory store, proxy.New, Proxy.Server on a loopback listener).
type world struct {
	mock  *mockllm.Server
	up    *upstream
	store *cache.Memory
	proxy *proxy.Proxy // the one the clients talk to
	srv   *fasthttp.Server
	url   string
	cl    *clients
	logs  *gatetest.LogBuffer
	inner *proxy.Proxy // in a chain, the one in front of the upstream
}

func newWorld(t *testing.T, p *plan) *world {
	t.Helper()
	w := &world{logs: &gatetest.LogBuffer{}}
	w.mock = mockllm.New(mockllm.Config{HangLimit: hangLimit})
	mockURL, err := w.mock.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bounded(t, "the mock LLM's Close", func() { w.mock.Close() }) })
	if err := fetchReferences(mockURL, p); err != nil {
		t.Fatal(err)
	}
	if w.up, err = newUpstream(p, w.mock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bounded(t, "the upstream's shutdown", w.up.close) }) // before the mock's Close, which waits for its streams
	log := slog.New(slog.NewTextHandler(w.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if w.store, err = cache.NewMemory(cache.Config{TTL: time.Hour, Logger: log}); err != nil {
		t.Fatal(err)
	}
	upURL, budget := w.up.url, upstreamTimeout
	var retryAmbiguous []string
	if p.chain {
		// The inner ssegate, in front of the upstream, as the single one
		// is; the outer one's budgets are twice its, so that the inner
		// one's timeouts, not the outer one's, end a silent call.
		innerURL := w.serve(t, "inner", w.up.url, upstreamTimeout, nil)
		upURL, budget, retryAmbiguous = innerURL, 2*upstreamTimeout, []string{innerURL}
	}
	w.url = w.serve(t, "outer", upURL, budget, retryAmbiguous)
	w.cl = newClients(w.url)
	return w
}

// serve starts an ssegate in front of upURL, wired as cmd/ssegate wires
// it, with budget as its -upstream-idle-timeout, -head-timeout and
// -attempt-timeout, and returns its URL. The last one started is the
// world's proxy (the one the clients talk to); the one before it, inner.
func (w *world) serve(t *testing.T, name, upURL string, budget time.Duration, retryAmbiguous []string) string {
	t.Helper()
	log := slog.New(slog.NewTextHandler(w.logs, &slog.HandlerOptions{Level: slog.LevelInfo})).With("ssegate", name)
	store := w.store
	if name == "inner" {
		var err error
		if store, err = cache.NewMemory(cache.Config{TTL: time.Hour, Logger: log}); err != nil {
			t.Fatal(err)
		}
	}
	// As cmd/ssegate's flags would set them: -heartbeat 250ms
	// -upstream-idle-timeout 1.5s -attempt-timeout 1.5s
	// -slow-client-timeout 1s -retry-backoff 20ms -retry-max-backoff 100ms
	// -retry-after-max 2s; the retry budget and the circuit breaker out of
	// the way (-retry-budget-min 100000 -breaker-failures 1000000000), since
	// the round makes an outage of every third call on purpose.
	px, err := proxy.New(proxy.Config{
		Upstreams: []string{upURL}, Store: store, Logger: log, RetryAmbiguous: retryAmbiguous,
		MCPPaths:  []string{mcpmock.Path},
		Heartbeat: heartbeat, UpstreamIdleTimeout: budget, HeadTimeout: budget, SlowClientTimeout: slowClient,
		Retry: proxy.RetryConfig{
			Attempts: 3, BaseBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
			RetryAfterMax: 2 * time.Second, AttemptTimeout: budget,
			BudgetMin: 100_000, BreakerFailures: 1_000_000_000,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := px.Server()
	if name == "inner" {
		// The outer one's keep-alive connections to it end soon after
		// the load, as the clients' and the upstream's are closed
		// (quiesce), so that their goroutines are not taken for leaks.
		srv.IdleTimeout = 200 * time.Millisecond
	}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	if name == "inner" {
		w.inner = px
	} else {
		w.proxy, w.srv = px, srv
	}
	t.Cleanup(func() {
		if w.cl != nil {
			w.cl.closeIdle()
		}
		bounded(t, "ssegate's shutdown (Abort, Shutdown, Wait) of the "+name+" one", func() {
			px.Abort()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.ShutdownWithContext(ctx)
			_ = px.Wait(ctx)
			store.Close()
		})
	})
	return "http://" + ln.Addr().String()
}

// teardownLimit bounds each step of a round's teardown.
const teardownLimit = 4 * time.Second

// bounded runs f, waiting at most teardownLimit: a wedged generation can
// block the proxy's own shutdown, and the test must still end (the round
// has reported what was left running). What f leaves behind stays behind.
func bounded(t *testing.T, what string, f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(teardownLimit):
		t.Errorf("%s did not return within %s; its goroutines are left behind", what, teardownLimit)
	}
}

// warmUp sends one whole unkeyed stream through the proxy, so that the
// pools and workers that any request starts exist before the baseline.
func (w *world) warmUp() error {
	req, _ := http.NewRequest(http.MethodPost, w.url+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"warm up"}]}`))
	req.Header.Set("Authorization", credential)
	req.Header.Set(originHeader, warmupOrigin)
	req.Header.Set("X-Mock-Tokens", "4")
	resp, err := w.cl.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && (resp.StatusCode != 200 || !bytes.Contains(b, []byte("[DONE]"))) {
		err = fmt.Errorf("warm-up stream: %d %q", resp.StatusCode, b)
	}
	if err != nil {
		return err
	}
	// And one unkeyed tool call, for the MCP server's pools.
	req, _ = http.NewRequest(http.MethodPost, w.url+mcpmock.Path, strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write","arguments":{"target":"warm-up","ms":20},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"faults","version":"1"}}}}`))
	req.Header.Set("Authorization", credential)
	req.Header.Set(originHeader, warmupOrigin)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", "write")
	resp, err = w.cl.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err = io.ReadAll(resp.Body)
	if err == nil && (resp.StatusCode != 200 || !bytes.Contains(b, []byte("wrote warm-up"))) {
		err = fmt.Errorf("warm-up tool call: %d %q", resp.StatusCode, b)
	}
	return err
}

// quiesce closes the idle connections of the clients and of the upstream,
// so that what is left running belongs to the proxy.
func (w *world) quiesce() {
	w.cl.closeIdle()
	w.up.closeIdle()
}

// look reads ssegate_live_generations, closes the idle connections that
// left (quiesce), and takes a snapshot of the goroutines.
func (w *world) look() (goroutines, int, error) {
	live, err := w.liveGenerations()
	w.quiesce()
	return snapshotGoroutines(), live, err
}

// liveGenerations reads ssegate_live_generations from GET /metrics.
func (w *world) liveGenerations() (int, error) {
	req, _ := http.NewRequest(http.MethodGet, w.url+"/metrics", nil)
	req.Close = true // no keep-alive connection left behind
	resp, err := w.cl.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "ssegate_live_generations "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(f), err
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("GET /metrics has no ssegate_live_generations (status %d)", resp.StatusCode)
}

// goroutines is a snapshot of the process's goroutines: the count, the
// count of those running code of ssegate's packages (proxy, cache, sse),
// and the count of each distinct stack (pprof's debug=1 grouping).
type goroutines struct {
	n, owned int
	stacks   map[string]int
}

// ownPackages are the packages whose goroutines are ssegate's own.
var ownPackages = []string{"github.com/ssegate/ssegate/proxy.", "github.com/ssegate/ssegate/cache.", "github.com/ssegate/ssegate/sse."}

func snapshotGoroutines() goroutines {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	g := goroutines{n: runtime.NumGoroutine(), stacks: map[string]int{}}
	// "goroutine profile: total N", then the records, most goroutines
	// first, a blank line between two.
	_, recs, _ := strings.Cut(b.String(), "\n")
	for _, rec := range strings.Split(recs, "\n\n") {
		head, stack, _ := strings.Cut(rec, "\n")
		n, err := strconv.Atoi(strings.Fields(head + " 0")[0])
		if err != nil {
			continue
		}
		g.stacks[shortStack(stack)] += n
		for _, p := range ownPackages {
			if strings.Contains(stack, p) {
				g.owned += n
				break
			}
		}
	}
	return g
}

// shortStack keeps a stack's function names, innermost first.
func shortStack(stack string) string {
	var fns []string
	for _, l := range strings.Split(stack, "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(l, "#"))
		f := strings.Fields(l)
		if len(f) >= 2 {
			fn := f[1]
			if i := strings.LastIndex(fn, "/"); i >= 0 {
				fn = fn[i+1:]
			}
			if j := strings.IndexByte(fn, '+'); j >= 0 {
				fn = fn[:j]
			}
			fns = append(fns, fn)
		}
	}
	return strings.Join(fns, " < ")
}

// grown lists the stacks that have more goroutines than in base, most first.
func (g goroutines) grown(base goroutines) []string {
	type d struct {
		stack string
		n     int
	}
	var ds []d
	for s, n := range g.stacks {
		if n > base.stacks[s] {
			ds = append(ds, d{s, n - base.stacks[s]})
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].n > ds[j].n })
	var out []string
	for i, x := range ds {
		if i == 6 {
			break
		}
		out = append(out, fmt.Sprintf("+%d %s", x.n, x.stack))
	}
	return out
}

// about returns the last max log lines that name key, without the
// attributes every line of the round shares (date, tenant, fingerprint).
func about(b *gatetest.LogBuffer, key string, max int) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		if !strings.Contains(l, " key="+key+" ") && !strings.HasSuffix(l, " key="+key) {
			continue
		}
		var keep []string
		for _, f := range strings.Split(l, " ") {
			switch {
			case strings.HasPrefix(f, "time="):
				if i := strings.IndexByte(f, 'T'); i >= 0 {
					f = strings.TrimSuffix(f[i+1:], "Z")
				}
			case strings.HasPrefix(f, "tenant="), strings.HasPrefix(f, "fingerprint="), strings.HasPrefix(f, "key="), f == "level=INFO":
				continue
			}
			keep = append(keep, f)
		}
		out = append(out, strings.Join(keep, " "))
	}
	if len(out) > max {
		out = out[len(out)-max:]
	}
	return out
}
