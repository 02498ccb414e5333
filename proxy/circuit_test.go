package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/proxy/upstream"
)

// modelServer is a real HTTP upstream on loopback that answers each call
// by its request's model, with the model's call number (1, 2, ...).
type modelServer struct {
	url    string
	ln     net.Listener
	srv    *http.Server
	script func(model string, n int64, w http.ResponseWriter)

	mu    sync.Mutex // guards calls
	calls map[string]int64
}

func newModelServer(t *testing.T, script func(model string, n int64, w http.ResponseWriter)) *modelServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveModels(t, ln, script)
}

func serveModels(t *testing.T, ln net.Listener, script func(model string, n int64, w http.ResponseWriter)) *modelServer {
	ms := &modelServer{url: "http://" + ln.Addr().String(), ln: ln, script: script, calls: map[string]int64{}}
	ms.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b struct{ Model string }
		body, _ := io.ReadAll(r.Body)
		json.Unmarshal(body, &b) //nolint:errcheck // a body without a model is model ""
		ms.mu.Lock()
		ms.calls[b.Model]++
		n := ms.calls[b.Model]
		ms.mu.Unlock()
		ms.script(b.Model, n, w)
	})}
	go ms.srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { ms.srv.Close() })
	return ms
}

// callsFor counts the calls for model.
func (ms *modelServer) callsFor(model string) int64 {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.calls[model]
}

// total counts every call.
func (ms *modelServer) total() int64 {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	var n int64
	for _, c := range ms.calls {
		n += c
	}
	return n
}

func unavailable(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(503)
	fmt.Fprint(w, `{"error":{"type":"server_error","message":"the model is overloaded"}}`)
}

func chatFor(model string) string {
	return fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, model)
}

func (e *env) scrape() string {
	e.t.Helper()
	got := e.fetch(req{method: http.MethodGet, path: "/metrics"})
	if got.status != 200 {
		e.t.Fatalf("GET /metrics: got %d; want 200", got.status)
	}
	return string(got.raw)
}

// TestCircuitModelOutage is the fault suite's case at half its scale: one
// model of an upstream answers 503 for 3 s, then serves again, with three clients
// for it and two for another model on the same upstream. Requests for the
// other model never fail meanwhile; the down model's circuit probes about
// once a second (not more than a few times), so from one second after the
// recovery every request for it succeeds.
func TestCircuitModelOutage(t *testing.T) {
	// Not parallel: it holds the breaker to its schedule in real time
	// (about a probe a second; every request served from 1.1 s after the
	// recovery), which other tests' load would skew.
	const outage = 3 * time.Second
	start := time.Now()
	recovered := start.Add(outage)
	var outageCalls atomic.Int64 // calls for the down model answered 503
	ms := newModelServer(t, func(model string, _ int64, w http.ResponseWriter) {
		if model == "down" && time.Now().Before(recovered) {
			outageCalls.Add(1)
			unavailable(w)
			return
		}
		okStream(w)
	})
	e := retryEnv(t, []string{ms.url}, nil) // the default breaker settings

	type sent struct {
		at  time.Time
		res result
	}
	var mu sync.Mutex
	results := map[string][]sent{}
	var wg sync.WaitGroup
	work := func(model string) {
		defer wg.Done()
		for time.Since(start) < outage+2*time.Second {
			at := time.Now()
			res := e.fetch(req{key: newKey(model), body: chatFor(model)})
			mu.Lock()
			results[model] = append(results[model], sent{at, res})
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}
	wg.Add(5)
	for range 3 {
		go work("down")
	}
	for range 2 {
		go work("healthy")
	}
	wg.Wait()

	failed := 0
	for _, s := range results["healthy"] {
		if !clean(s.res) {
			if failed++; failed <= 3 {
				t.Errorf("healthy model at %v: got %d %s %q; want a clean stream", s.at.Sub(start).Round(time.Millisecond), s.res.status, s.res.errType, s.res.lastData())
			}
		}
	}
	if failed > 0 {
		t.Errorf("healthy model: %d of %d requests failed; want none", failed, len(results["healthy"]))
	}
	// The last failed probe went before the recovery, so the next one goes
	// at most 1s (BreakerOpenMax) after it and closes the circuit; while
	// that probe is out, concurrent requests are still turned away, so
	// the check starts a round trip's slack (100ms) later.
	from := recovered.Add(time.Second + 100*time.Millisecond)
	after, failedAfter := 0, 0
	for _, s := range results["down"] {
		if s.at.Before(from) {
			continue
		}
		after++
		if !clean(s.res) {
			if failedAfter++; failedAfter <= 3 {
				t.Errorf("down model %v after the recovery: got %d %s; want a clean stream", s.at.Sub(recovered).Round(time.Millisecond), s.res.status, s.res.errType)
			}
		}
	}
	if after == 0 || failedAfter > 0 {
		t.Errorf("down model from 1.1s after the recovery: %d of %d requests failed; want none of some", failedAfter, after)
	}
	// Opening takes 5 failures (a few more calls may be out meanwhile);
	// then probes go 250ms, 500ms, then 1s after each failed one: 4 in 3s
	// (a probe every 250ms would be 12).
	n := outageCalls.Load()
	t.Logf("%d requests for the healthy model, %d for the down one; %d upstream calls for it during the outage", len(results["healthy"]), len(results["down"]), n)
	if n < 5+2 || n > 5+9 {
		t.Errorf("calls for the down model during the outage: got %d; want 7..14 (5 to open, then about one probe a second)", n)
	}
}

// TestCircuitFailoverPerModel: with two upstreams, a model that fails on
// the first fails over to the second and its circuit on the first opens
// after BreakerFailures, which the log says with the upstream and model;
// the other model keeps going to the first, and its successes there do
// not reset the failing model's count.
func TestCircuitFailoverPerModel(t *testing.T) {
	t.Parallel()
	primary := newModelServer(t, func(model string, _ int64, w http.ResponseWriter) {
		if model == "broken" {
			unavailable(w)
			return
		}
		okStream(w)
	})
	secondary := newModelServer(t, func(_ string, _ int64, w http.ResponseWriter) { okStream(w) })
	logs := &gatetest.LogBuffer{}
	e := retryEnv(t, []string{primary.url, secondary.url}, func(pc *Config) {
		pc.Retry.BreakerFailures = 3
		pc.Retry.BreakerOpen = 10 * time.Second // no probe during the test
		pc.Retry.BreakerOpenMax = 10 * time.Second
		pc.Retry.Attempts = 2
		pc.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	get := func(model string) {
		t.Helper()
		if got := e.fetch(req{key: newKey(model), body: chatFor(model)}); !clean(got) {
			t.Fatalf("%s: got %d %s %q; want a clean stream", model, got.status, got.errType, got.lastData())
		}
	}
	get("broken")
	for range 9 {
		get("fine")
		get("broken")
	}
	wantCount(t, "primary calls for the broken model", primary.callsFor("broken"), 3)
	wantCount(t, "secondary calls for the broken model", secondary.callsFor("broken"), 10)
	wantCount(t, "primary calls for the fine model", primary.callsFor("fine"), 9)
	wantCount(t, "secondary calls for the fine model", secondary.callsFor("fine"), 0)
	want := fmt.Sprintf(`msg="upstream circuit" upstream=%s scope=model model=broken from=closed to=open failures=3`, primary.url)
	if got := logs.String(); strings.Count(got, "upstream circuit") != 1 || !strings.Contains(got, want) {
		t.Fatalf("circuit log: got\n%s\nwant one line with %s", got, want)
	}
}

// TestCircuit4xxNeverOpens: storms of 429, 400 and 404 answers from the
// mock LLM, with a breaker that opens after 2 failures, open no circuit
// and keep none: every client gets the upstream's own answer, and the
// next healthy request takes exactly one upstream call.
func TestCircuit4xxNeverOpens(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.Retry.BreakerFailures = 2
		pc.Retry.Attempts = 1 // the storm, not the retries: one call per request
	})
	var wg sync.WaitGroup
	for _, code := range []int{429, 400, 404} {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 20 {
					got := e.fetch(req{key: newKey("storm"), header: map[string]string{"X-Mock-Fault": fmt.Sprintf("status=%d", code)}})
					if got.status != code {
						t.Errorf("got %d %s; want the upstream's %d", got.status, got.errType, code)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	e.wantCalls(120)
	if got := e.fetch(req{key: newKey("after")}); !clean(got) {
		t.Fatalf("after the storm: got %d %s; want a clean stream", got.status, got.errType)
	}
	e.wantCalls(121)
	s := e.scrape()
	up := e.proxy.ups[0].Name()
	for series, want := range map[string]float64{
		`ssegate_upstream_circuits_opened_total{scope="host",upstream="` + up + `"}`:  0,
		`ssegate_upstream_circuits_opened_total{scope="model",upstream="` + up + `"}`: 0,
		`ssegate_upstream_model_circuits{upstream="` + up + `"}`:                      0,
	} {
		if got := metricValue(t, s, series); got != want {
			t.Errorf("%s: got %v; want %v", series, got, want)
		}
	}
}

// TestCircuitModelBound: a burst of 300 distinct model names, each
// failing and opening its circuit, keeps at most BreakerModels circuits
// (long names as bounded keys), and a healthy model on the same upstream
// is served throughout.
func TestCircuitModelBound(t *testing.T) {
	t.Parallel()
	const bound, names = 16, 300
	ms := newModelServer(t, func(model string, _ int64, w http.ResponseWriter) {
		if model == "healthy" {
			okStream(w)
			return
		}
		unavailable(w)
	})
	e := retryEnv(t, []string{ms.url}, func(pc *Config) {
		pc.Retry.BreakerFailures = 1
		pc.Retry.BreakerOpen = 10 * time.Second
		pc.Retry.BreakerOpenMax = 10 * time.Second
		pc.Retry.BreakerModels = bound
		pc.Retry.Attempts = 1
	})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < names; i += 4 {
				model := fmt.Sprintf("hostile-%d", i)
				if i%3 == 0 {
					model += strings.Repeat("x", 16<<10)
				}
				if got := e.fetch(req{body: chatFor(model)}); got.status != 503 {
					t.Errorf("%.20s: got %d; want the upstream's 503", model, got.status)
				}
				if i%10 == 0 {
					if got := e.fetch(req{key: newKey("healthy"), body: chatFor("healthy")}); !clean(got) {
						t.Errorf("healthy model during the burst: got %d %s; want a clean stream", got.status, got.errType)
					}
				}
			}
		}()
	}
	wg.Wait()
	wantCount(t, "upstream calls for the hostile names", ms.total()-ms.callsFor("healthy"), names)
	s := e.scrape()
	up := e.proxy.ups[0].Name()
	kept := metricValue(t, s, `ssegate_upstream_model_circuits{upstream="`+up+`"}`)
	open := metricValue(t, s, `ssegate_upstream_model_circuits_open{upstream="`+up+`"}`)
	reclaimed := metricValue(t, s, `ssegate_upstream_model_circuits_reclaimed_total{upstream="`+up+`"}`)
	if kept != bound || open != bound || reclaimed != names-bound {
		t.Errorf("model circuits: got %v kept, %v open, %v reclaimed; want %d, %d, %d", kept, open, reclaimed, bound, bound, names-bound)
	}
}

// TestCircuitHungProbe: a probe whose answer is slow (its head comes only
// once the test has seen the next request served) does not hold an open
// circuit: the next wait ends, another probe finds the model serving and
// closes the circuit while the first is still out.
func TestCircuitHungProbe(t *testing.T) {
	t.Parallel()
	release := make(chan struct{}) // closed: the slow probe's answer goes
	ms := newModelServer(t, func(_ string, n int64, w http.ResponseWriter) {
		switch {
		case n <= 2:
			unavailable(w)
		case n == 3:
			<-release
			okStream(w)
		default:
			okStream(w)
		}
	})
	e := retryEnv(t, []string{ms.url}, func(pc *Config) {
		pc.Retry.BreakerFailures = 2
		pc.Retry.Attempts = 1
		pc.Retry.AttemptTimeout = 5 * time.Second
		pc.HeadTimeout = 5 * time.Second
	})
	var once sync.Once
	answerProbe := func() { once.Do(func() { close(release) }) }
	t.Cleanup(answerProbe) // first, should the test end before it
	b := e.proxy.ups[0].Breaker()
	for range 2 {
		if got := e.fetch(req{key: newKey("open")}); got.status != 503 {
			t.Fatalf("got %d; want the upstream's 503", got.status)
		}
	}
	if b.ModelState("gpt-4o-mini") != upstream.CircuitOpen {
		t.Fatalf("circuit: got %v; want open after 2 failures", b.ModelState("gpt-4o-mini"))
	}
	waitFor(t, func() bool { return admitsNow(b, "gpt-4o-mini") }) // the first wait (250ms) is over
	probe := make(chan result, 1)
	go func() { probe <- e.fetch(req{key: newKey("probe")}) }()
	waitFor(t, func() bool { return ms.total() == 3 })
	sent := time.Now()
	waitFor(t, func() bool { return admitsNow(b, "gpt-4o-mini") }) // the wait after that probe (250ms) is over
	if got := e.fetch(req{key: newKey("next")}); !clean(got) {
		t.Fatalf("%v after the slow probe went: got %d %s; want a clean stream", time.Since(sent).Round(time.Millisecond), got.status, got.errType)
	}
	select {
	case got := <-probe:
		t.Fatalf("the slow probe ended (%d %s) before its upstream answered", got.status, got.errType)
	default:
	}
	if got := b.ModelState("gpt-4o-mini"); got != upstream.CircuitClosed {
		t.Fatalf("circuit with the slow probe out: got %v; want closed", got)
	}
	answerProbe()
	if got := <-probe; !clean(got) {
		t.Fatalf("slow probe: got %d %s; want a clean stream", got.status, got.errType)
	}
	wantCount(t, "upstream calls", ms.total(), 4)
}

// admitsNow reports whether b lets a call for model through now: its
// circuits are closed, or open with their wait over.
func admitsNow(b *upstream.Breaker, model string) bool {
	return b.Admits(upstream.ModelKey(model))
}

// TestCircuitHostConnectErrors: connect failures are the host's, whatever
// the model: after BreakerFailures of them, for three models, requests for
// models never seen fail over without dialing. When the host listens
// again, requests go back to it within a second.
func TestCircuitHostConnectErrors(t *testing.T) {
	// Not parallel: it holds the recovery to within a second of the host
	// listening again, which other tests' load would skew.
	addr, release := refusedAddr(t)
	secondary := newModelServer(t, func(_ string, _ int64, w http.ResponseWriter) { okStream(w) })
	e := retryEnv(t, []string{"http://" + addr, secondary.url}, func(pc *Config) {
		pc.Retry.BreakerFailures = 3
		pc.Retry.Attempts = 2
	})
	get := func(model string) {
		t.Helper()
		if got := e.fetch(req{key: newKey("host"), body: chatFor(model)}); !clean(got) {
			t.Fatalf("%s: got %d %s; want a clean stream", model, got.status, got.errType)
		}
	}
	for i := range 10 {
		get(fmt.Sprint("model-", i))
	}
	connectErrors := func() float64 {
		return metricValue(t, e.scrape(), `ssegate_upstream_attempts_total{outcome="connect_error"}`)
	}
	if got := connectErrors(); got != 3 {
		t.Fatalf("connect errors: got %v; want 3 (then the host circuit is open for every model)", got)
	}
	wantCount(t, "secondary calls", secondary.total(), 10)
	// Down for another 0.8 s: the probes fail and back off.
	for end := time.Now().Add(800 * time.Millisecond); time.Now().Before(end); {
		get("model-again")
		time.Sleep(20 * time.Millisecond)
	}
	release()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the primary's port was taken meanwhile: %v", err)
	}
	up := time.Now()
	primary := serveModels(t, ln, func(_ string, _ int64, w http.ResponseWriter) { okStream(w) })
	for time.Since(up) < 1500*time.Millisecond {
		before, at := primary.total(), time.Since(up)
		get("model-back")
		if at > time.Second && primary.total() == before {
			t.Fatalf("a request %v after the primary listens again: got no call to it; want it served there", at.Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBreakerFailover: a failing primary's circuit opens after
// BreakerFailures consecutive failures and requests go to the secondary;
// after BreakerOpen a probe finds the primary healthy and closes it.
func TestBreakerFailover(t *testing.T) {
	// Not parallel: the five requests while the circuit is open must all go
	// within its 400 ms, which other tests' load could stretch.
	primary := newFaultServer(t, status(503))
	secondary := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { okStream(w) })
	e := retryEnv(t, []string{primary.url, secondary.url}, func(pc *Config) {
		pc.Retry.BreakerFailures = 3
		pc.Retry.BreakerOpen = 400 * time.Millisecond
		pc.Retry.BreakerOpenMax = 400 * time.Millisecond
		pc.Retry.Attempts = 2
	})
	get := func() {
		t.Helper()
		got := e.fetch(req{key: newKey("breaker")})
		if got.status != 200 || got.lastData() != "[DONE]" {
			t.Fatalf("got %d %q; want a clean stream", got.status, got.lastData())
		}
	}
	// Closed: each request tries the primary, then fails over.
	for range 3 {
		get()
	}
	wantCount(t, "primary calls while closed", primary.calls.Load(), 3)
	wantCount(t, "secondary calls while closed", secondary.calls.Load(), 3)
	// Open: the primary is skipped.
	for range 5 {
		get()
	}
	wantCount(t, "primary calls while open", primary.calls.Load(), 3)
	wantCount(t, "secondary calls while open", secondary.calls.Load(), 8)
	// Half-open after the open time: the primary recovered; one probe
	// closes the circuit and traffic returns to it.
	primary.set(func(_ int64, w http.ResponseWriter, _ *http.Request) { okStream(w) })
	waitFor(t, func() bool { return admitsNow(e.proxy.ups[0].Breaker(), "gpt-4o-mini") })
	for range 4 {
		get()
	}
	wantCount(t, "primary calls after recovery", primary.calls.Load(), 7)
	wantCount(t, "secondary calls after recovery", secondary.calls.Load(), 8)
	if got := e.proxy.ups[0].Breaker().ModelState("gpt-4o-mini"); got != upstream.CircuitClosed {
		t.Fatalf("primary circuit: got %v; want closed", got)
	}
}
