package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/ssegate/ssegate/sse"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// fallbackEnv is ssegate in front of the mock with -fallback primary=backup
// (and claude-primary=claude-backup), retries quick, and faults set per
// model with e.mock.SetModelFault.
func fallbackEnv(t *testing.T, opts ...envOption) *env {
	t.Helper()
	base := func(pc *Config, _ *cache.Config, mc *mockllm.Config) {
		pc.Fallbacks = map[string][]string{"primary": {"backup"}, "claude-primary": {"claude-backup"}}
		pc.Retry.BaseBackoff = time.Millisecond
		pc.Retry.MaxBackoff = 5 * time.Millisecond
		pc.Retry.RetryAfterMax = 10 * time.Millisecond // the mock's 429 says Retry-After: 1
		pc.Retry.BreakerFailures = 3
		pc.Retry.BreakerOpen = time.Second
		pc.Retry.BreakerOpenMax = time.Second
		mc.ModelFaults = map[string]string{}
		mc.Tokens = 8
	}
	return newEnv(t, append([]envOption{base}, opts...)...)
}

func modelBody(model string) string {
	return `{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"hi"}]}`
}

// answeredBy is the model field of the stream's first chunk.
func answeredBy(t *testing.T, r result) string {
	t.Helper()
	m := modelOf(r)
	if m == "" {
		t.Fatalf("no event names a model: %q", r.raw)
	}
	return m
}

// modelOf is the model field of the stream's first chunk, or "".
func modelOf(r result) string {
	for _, ev := range r.events {
		if i := strings.Index(ev.Data, `"model":"`); i >= 0 {
			rest := ev.Data[i+len(`"model":"`):]
			return rest[:strings.IndexByte(rest, '"')]
		}
	}
	return ""
}

func wantWhole(t *testing.T, r result, model string) {
	t.Helper()
	if r.status != 200 || r.aborted || r.lastData() != "[DONE]" {
		t.Fatalf("got %d aborted=%v ending %q; want a whole stream", r.status, r.aborted, r.lastData())
	}
	if got := answeredBy(t, r); got != model {
		t.Fatalf("answered by %q; want %q", got, model)
	}
}

func wantModelCalls(t *testing.T, e *env, model string, want int64) {
	t.Helper()
	if got := e.mock.CallsFor(model); got != want {
		t.Fatalf("calls to %s: got %d; want %d", model, got, want)
	}
}

// TestFallbackOnRateLimit: a primary that answers 429 every time: the
// fallback answers each request, the ledger says which model answered and
// why the primary was given up on, and once the primary's circuit opened
// (three failures) no request calls it again during the open time.
func TestFallbackOnRateLimit(t *testing.T) {
	t.Parallel()
	e := fallbackEnv(t)
	e.mock.SetModelFault("primary", "status=429") //nolint:errcheck // a valid spec
	key := newKey("fallback-429")
	r := e.fetch(req{key: key, body: modelBody("primary")})
	wantWhole(t, r, "backup")
	wantModelCalls(t, e, "primary", 1) // Retry-After 1s is past -retry-after-max: no retry
	wantModelCalls(t, e, "backup", 1)
	ki := e.waitState(key, "", cache.StateCommitted)
	if ki.Model != "backup" || len(ki.Fallbacks) != 1 || ki.Fallbacks[0] != (cache.Fallback{Model: "primary", Reason: "upstream_status_429"}) {
		t.Fatalf("key info: model %q, fallbacks %+v; want backup after primary's upstream_status_429", ki.Model, ki.Fallbacks)
	}
	for range 5 {
		wantWhole(t, e.fetch(req{body: modelBody("primary")}), "backup")
	}
	wantModelCalls(t, e, "primary", 3) // the circuit opened at the third 429
	wantModelCalls(t, e, "backup", 6)
	m := string(e.fetch(req{method: http.MethodGet, path: "/metrics"}).raw)
	if v := metricValue(t, m, `ssegate_fallbacks_total{reason="upstream_status_429"}`); v != 3 {
		t.Errorf("fallbacks for 429: got %v; want 3", v)
	}
	if v := metricValue(t, m, `ssegate_fallbacks_total{reason="upstream_unavailable"}`); v != 3 {
		t.Errorf("fallbacks past an open circuit: got %v; want 3", v)
	}
}

// TestFallbackWhileDownThenBack: the primary answers 503 for a while,
// then is healthy again; requests spread over both times are all answered,
// and the primary answers again within about a second (the circuit's
// open time) of its recovery.
func TestFallbackWhileDownThenBack(t *testing.T) {
	t.Parallel()
	e := fallbackEnv(t)
	e.mock.SetModelFault("primary", "status=503") //nolint:errcheck // a valid spec
	const down, step, n = 2 * time.Second, 200 * time.Millisecond, 20
	start := time.Now()
	var recovered time.Time
	var backOn time.Duration = -1
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * step)))
		if recovered.IsZero() && time.Since(start) >= down {
			e.mock.SetModelFault("primary", "") //nolint:errcheck // clears it
			recovered = time.Now()
		}
		r := e.fetch(req{key: newKey("down-then-back"), body: modelBody("primary")})
		if r.status != 200 || r.aborted || r.lastData() != "[DONE]" {
			t.Fatalf("request %d: got %d aborted=%v; want a whole stream", i, r.status, r.aborted)
		}
		by := answeredBy(t, r)
		if recovered.IsZero() && by != "backup" {
			t.Fatalf("request %d while the primary is down: answered by %s", i, by)
		}
		if !recovered.IsZero() && by == "primary" && backOn < 0 {
			backOn = time.Since(recovered)
		}
	}
	if backOn < 0 || backOn > 1500*time.Millisecond {
		t.Fatalf("back on the primary %v after its recovery; want within about a second", backOn)
	}
	t.Logf("back on the primary %v after its recovery; primary calls %d, backup %d", backOn, e.mock.CallsFor("primary"), e.mock.CallsFor("backup"))
}

// TestFallbackOnContextLength: a 400 context_length_exceeded (OpenAI) or
// "prompt is too long" (Anthropic) falls back after exactly one call,
// each on its own API shape.
func TestFallbackOnContextLength(t *testing.T) {
	t.Parallel()
	e := fallbackEnv(t)
	e.mock.SetModelFault("primary", "context-length")        //nolint:errcheck // a valid spec
	e.mock.SetModelFault("claude-primary", "context-length") //nolint:errcheck // a valid spec
	wantWhole(t, e.fetch(req{key: newKey("ctx"), body: modelBody("primary")}), "backup")
	wantModelCalls(t, e, "primary", 1)
	wantModelCalls(t, e, "backup", 1)

	body := `{"model":"claude-primary","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	r := e.fetch(req{key: newKey("ctx-anthropic"), path: "/v1/messages", body: body})
	if r.status != 200 || r.aborted || len(r.events) == 0 || r.events[len(r.events)-1].Type != "message_stop" {
		t.Fatalf("anthropic: got %d aborted=%v; want a whole messages stream", r.status, r.aborted)
	}
	if got := answeredBy(t, r); got != "claude-backup" {
		t.Fatalf("anthropic: answered by %q; want claude-backup", got)
	}
	wantModelCalls(t, e, "claude-primary", 1)
	wantModelCalls(t, e, "claude-backup", 1)

	e.mock.SetModelFault("primary", "status=503") //nolint:errcheck // a valid spec
	body = `{"model":"primary","stream":true,"input":"hi"}`
	r = e.fetch(req{key: newKey("responses"), path: "/v1/responses", body: body})
	if r.status != 200 || r.aborted || len(r.events) == 0 || r.events[len(r.events)-1].Type != "response.completed" {
		t.Fatalf("responses: got %d aborted=%v; want a whole Responses stream", r.status, r.aborted)
	}
	if got := answeredBy(t, r); got != "backup" {
		t.Fatalf("responses: answered by %q; want backup", got)
	}
}

// TestNoFallback: what never falls back. Another 400 (a content filter's)
// goes back to the client as it came; a stream cut after its first event
// ends with stream_aborted; an upstream that took the request and did not
// answer in time gets 504. The backup is never called.
func TestNoFallback(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, fault string
		status      int
		errType     string
		aborted     bool
	}{
		{"content filter", "content-filter", 400, "invalid_request_error", false},
		{"cut after the first event", "reset-after=3", 200, "", true},
		{"timeout after the request was written", "hang", 504, "upstream_timeout", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := fallbackEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) { pc.HeadTimeout = 200 * time.Millisecond })
			e.mock.SetModelFault("primary", c.fault) //nolint:errcheck // a valid spec
			key := newKey("no-fallback")
			r := e.fetch(req{key: key, body: modelBody("primary")})
			if r.status != c.status || r.aborted != c.aborted || r.errType != c.errType {
				t.Fatalf("got %d %q aborted=%v (%q); want %d %q aborted=%v", r.status, r.errType, r.aborted, r.raw, c.status, c.errType, c.aborted)
			}
			if c.status == 400 && !strings.Contains(string(r.raw), `"code":"content_filter"`) {
				t.Fatalf("got %s; want the upstream's own answer, with its code", r.raw)
			}
			wantModelCalls(t, e, "primary", 1)
			wantModelCalls(t, e, "backup", 0)
		})
	}
}

// TestFallbackJoinAndReplay: a keyed duplicate sent while the request is
// falling back joins it (one generation in all: the primary's attempts and
// one backup call), and a repeat after the commit replays the backup's
// answer, byte for byte, with no call.
func TestFallbackJoinAndReplay(t *testing.T) {
	t.Parallel()
	e := fallbackEnv(t, func(pc *Config, _ *cache.Config, mc *mockllm.Config) {
		pc.Retry.BaseBackoff = 50 * time.Millisecond
		pc.Retry.MaxBackoff = 50 * time.Millisecond
		mc.Delay = 5 * time.Millisecond
	})
	e.mock.SetModelFault("primary", "status=503") //nolint:errcheck // a valid spec
	key := newKey("fallback-join")
	stream := fetchStaggered(t, e, req{key: key, body: modelBody("primary")}, 4)
	wantModelCalls(t, e, "primary", 3) // -retry-attempts
	wantModelCalls(t, e, "backup", 1)
	e.waitState(key, "", cache.StateCommitted)
	r := e.fetch(req{key: key, body: modelBody("primary")})
	if !r.replayed || string(eventBytes(r.raw)) != stream {
		t.Fatalf("repeat after the commit: replayed=%v; want the backup's answer replayed", r.replayed)
	}
	wantModelCalls(t, e, "primary", 3)
	wantModelCalls(t, e, "backup", 1)
}

// fetchStaggered sends n copies of r, 20 ms apart (during the primary's
// retries), and checks that every one got the same whole stream of the
// backup; it returns that stream's events.
func fetchStaggered(t *testing.T, e *env, r req, n int) string {
	t.Helper()
	var wg sync.WaitGroup
	results := make([]result, n)
	for i := range results {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 20 * time.Millisecond)
			results[i] = e.fetch(r)
		})
	}
	wg.Wait()
	for i, got := range results {
		wantWhole(t, got, "backup")
		if i > 0 && string(eventBytes(got.raw)) != string(eventBytes(results[0].raw)) {
			t.Fatalf("client %d got another stream than client 0", i)
		}
	}
	return string(eventBytes(results[0].raw))
}

// TestFallbackRules: a model's own rule, "*" for the others, no fallback
// to the model itself, and none for a request that names no model.
func TestFallbackRules(t *testing.T) {
	t.Parallel()
	p := &Proxy{cfg: Config{Fallbacks: map[string][]string{"a": {"b", "a", "c", "b"}, "*": {"z"}}}}
	for body, want := range map[string]string{
		`{"model":"a"}`:        "a b c",
		`{"model":"q"}`:        "q z",
		`{"model":"z"}`:        "z",
		`{"messages":[]}`:      "",
		`{"model":{"id":"a"}}`: "",
	} {
		g := &gen{p: p}
		g.req = sse.ParseRequest([]byte(body))
		if got := strings.Join(g.models([]byte(body)), " "); got != want {
			t.Errorf("%s: models %q; want %q", body, got, want)
		}
	}
	for body, model := range map[string]string{
		`{"model":"a","stream":true}`:    `{"model":"b","stream":true}`,
		`{"stream":true, "model" : "a"}`: `{"stream":true, "model" : "b"}`,
		`{"model":"a","x":"\"model\""}`:  `{"model":"b","x":"\"model\""}`,
	} {
		r := fasthttp.AcquireRequest()
		r.SetBodyString(body)
		out := withModel(r, "b")
		if string(out.Body()) != model {
			t.Errorf("withModel(%s): %s; want %s", body, out.Body(), model)
		}
	}
}

// TestNoFallbackAfterAmbiguous: an upstream known to deduplicate
// (-retry-ambiguous) takes the request and hangs up, then answers 503 to
// the pinned repeat: the first call may still be generating, so there is
// no fallback (no other upstream, no other model is called) and the key
// stays commit_unknown.
func TestNoFallbackAfterAmbiguous(t *testing.T) {
	t.Parallel()
	first := newFaultServer(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			hangUp(n, w, r)
			return
		}
		status(503)(n, w, r)
	})
	second := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { okStream(w) })
	e := retryEnv(t, []string{first.url, second.url}, func(pc *Config) {
		pc.RetryAmbiguous = []string{first.url}
		pc.Fallbacks = map[string][]string{"primary": {"backup"}}
	})
	key := newKey("ambiguous-then-503")
	got := e.fetch(req{key: key, body: modelBody("primary")})
	if got.status < 500 {
		t.Fatalf("got %d; want an error: nothing may answer while the first call may be running", got.status)
	}
	wantCount(t, "first upstream calls", first.calls.Load(), 3) // the call and its pinned repeats, no backup
	wantCount(t, "second upstream calls", second.calls.Load(), 0)
	e.waitState(key, "", cache.StateCommitUnknown)
}

// TestNoFallbackAfterHangUp: the primary reads the request and closes the
// connection with no answer (non-streaming), or sends a stream's head and
// resets it before any event: either way the model may be generating. No
// other model is called; the primary is called once, or -retry-attempts
// times on the same upstream with the same key under -retry-ambiguous; the
// key ends commit_unknown (its outcome unknown), not failed_retryable.
func TestNoFallbackAfterHangUp(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, fault, body string
	}{
		{"closed before any answer", "eof-after=0", `{"model":"primary","messages":[{"role":"user","content":"hi"}]}`},
		{"head then reset", "reset-after=0", modelBody("primary")},
	} {
		for _, dedup := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/retry-ambiguous=%v", c.name, dedup), func(t *testing.T) {
				t.Parallel()
				e := fallbackEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
					if dedup {
						pc.RetryAmbiguous = []string{"*"}
					}
				})
				e.mock.SetModelFault("primary", c.fault) //nolint:errcheck // a valid spec
				key := newKey("hang-up")
				r := e.fetch(req{key: key, body: c.body})
				if r.status != 502 || r.errType != "upstream_error" || !strings.Contains(string(r.raw), "unknown") {
					t.Fatalf("got %d %q (%s); want 502 upstream_error saying the outcome is unknown", r.status, r.errType, r.raw)
				}
				want := int64(1)
				if dedup {
					want = 3 // -retry-attempts, all on the one upstream
				}
				wantModelCalls(t, e, "primary", want)
				wantModelCalls(t, e, "backup", 0)
				ki := e.waitState(key, "", cache.StateCommitUnknown)
				if ki.Model != "primary" || len(ki.Fallbacks) != 0 {
					t.Fatalf("key info: model %q, fallbacks %+v; want primary and none", ki.Model, ki.Fallbacks)
				}
			})
		}
	}
}

// TestFallbackClientLeaves: the client closes its connection while the
// primary is being retried (503s, 50 ms apart). With a key the generation
// outlives it: it falls back and commits, and a repeat replays that with
// no call. Without one it ends with no more calls than the fallback's.
// Either way the slot of -max-streams comes back and no goroutine is left.
func TestFallbackClientLeaves(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyed=%v", keyed), func(t *testing.T) {
			t.Parallel()
			goroutines := ownGoroutines(t)
			e := fallbackEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
				pc.Retry.BaseBackoff = 50 * time.Millisecond
				pc.Retry.MaxBackoff = 50 * time.Millisecond
			})
			addr := strings.TrimPrefix(e.url, "http://")
			rawStream(t, addr, "", 3, 2).Close() // what lives as long as the server
			within(time.Second, func() bool { return e.proxy.streams.Load() == 0 })
			before, _ := goroutines()
			base := e.mock.CallsFor("backup")
			e.mock.SetModelFault("primary", "status=503") //nolint:errcheck // a valid spec
			key := ""
			if keyed {
				key = newKey("fallback-leave")
			}
			body := modelBody("primary")
			conn := rawPost(t, addr, "/v1/chat/completions", keyHeader(key), body, 0)
			if !within(2*time.Second, func() bool { return e.mock.CallsFor("primary") >= 1 }) {
				t.Fatal("the primary was never called")
			}
			conn.Close() // during the primary's retries
			if keyed {
				e.waitState(key, "", cache.StateCommitted)
			}
			if !within(3*time.Second, func() bool { return e.proxy.streams.Load() == 0 }) {
				t.Fatalf("live generations: got %d after the client left; want 0", e.proxy.streams.Load())
			}
			if !within(5*time.Second, func() bool { n, _ := goroutines(); return n <= before+2 }) {
				n, stacks := goroutines()
				t.Fatalf("goroutines: got %d; want at most %d (before the request + 2)\n%s", n, before+2, stacks)
			}
			wantModelCalls(t, e, "primary", 3)
			if got := e.mock.CallsFor("backup") - base; got > 1 || (keyed && got != 1) {
				t.Fatalf("backup calls: got %d; want 1 (at most 1 without a key)", got)
			}
			if keyed {
				r := e.fetch(req{key: key, body: body})
				wantWhole(t, r, "backup")
				if !r.replayed {
					t.Fatal("repeat after the commit: not replayed; want the fallback's answer replayed")
				}
				wantModelCalls(t, e, "primary", 3)
				wantModelCalls(t, e, "backup", base+1)
			}
		})
	}
}

// TestFallbackJoinByAPIKey: keyed duplicates whose credential is in
// x-api-key (not Authorization) join the one generation that is falling
// back; the same key under another x-api-key is another tenant's, and
// gets a generation of its own.
func TestFallbackJoinByAPIKey(t *testing.T) {
	t.Parallel()
	e := fallbackEnv(t, func(pc *Config, _ *cache.Config, mc *mockllm.Config) {
		pc.Retry.BaseBackoff = 50 * time.Millisecond
		pc.Retry.MaxBackoff = 50 * time.Millisecond
		pc.Retry.BreakerFailures = 100 // every generation calls the primary
		mc.Delay = 5 * time.Millisecond
	})
	e.mock.SetModelFault("primary", "status=503") //nolint:errcheck // a valid spec
	key := newKey("fallback-x-api-key")
	fetchStaggered(t, e, req{key: key, body: modelBody("primary"), header: map[string]string{"x-api-key": "tenant-one"}}, 3)
	wantModelCalls(t, e, "primary", 3)
	wantModelCalls(t, e, "backup", 1)
	r := e.fetch(req{key: key, body: modelBody("primary"), header: map[string]string{"x-api-key": "tenant-two"}})
	wantWhole(t, r, "backup")
	if r.replayed {
		t.Fatal("another tenant's request was replayed the first tenant's answer")
	}
	wantModelCalls(t, e, "primary", 6)
	wantModelCalls(t, e, "backup", 2)
}

// TestCutAfterAmbiguousStaysUnknown: an upstream known to deduplicate
// (-retry-ambiguous) takes the request and hangs up; the proxy shuts down
// while the repeat waits out its backoff. The first call may still be
// generating, so the key ends commit_unknown, not free as failed_retryable.
func TestCutAfterAmbiguousStaysUnknown(t *testing.T) {
	t.Parallel()
	up := newFaultServer(t, hangUp)
	e := retryEnv(t, []string{up.url}, func(pc *Config) {
		pc.RetryAmbiguous = []string{up.url}
		pc.Retry.BaseBackoff = 5 * time.Second
		pc.Retry.MaxBackoff = 5 * time.Second
		pc.Retry.Attempts = 2
		pc.Fallbacks = map[string][]string{"primary": {"backup"}}
	})
	key := newKey("cut-after-ambiguous")
	done := make(chan result, 1)
	go func() { done <- e.fetch(req{key: key, body: modelBody("primary")}) }()
	if !within(2*time.Second, func() bool { return up.calls.Load() == 1 }) {
		t.Fatal("the upstream was never called")
	}
	time.Sleep(50 * time.Millisecond) // into the backoff (the draw may be short: then the repeat is made)
	e.proxy.Abort()
	if r := <-done; r.status < 500 {
		t.Fatalf("got %d; want an error", r.status)
	}
	e.waitState(key, "", cache.StateCommitUnknown)
	if n := up.calls.Load(); n > 2 {
		t.Fatalf("upstream calls: got %d; want at most 2", n)
	}
}

// TestNoFallbackAfterGarbage: an upstream known to deduplicate
// (-retry-ambiguous) answers 200 text/event-stream with no event in it,
// then 503s to the pinned repeats. The first answer may have been a
// generation, so no other model is called.
func TestNoFallbackAfterGarbage(t *testing.T) {
	t.Parallel()
	up := newFaultServer(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			garbage(n, w, r)
			return
		}
		status(503)(n, w, r)
	})
	e := retryEnv(t, []string{up.url}, func(pc *Config) {
		pc.RetryAmbiguous = []string{up.url}
		pc.Fallbacks = map[string][]string{"primary": {"backup"}}
	})
	key := newKey("garbage-then-503")
	if r := e.fetch(req{key: key, body: modelBody("primary")}); r.status < 500 {
		t.Fatalf("got %d; want an error", r.status)
	}
	wantCount(t, "upstream calls", up.calls.Load(), 3) // the first and the pinned repeats, none for the backup
	// failed_retryable, as for any answer that came and was not a stream
	// (docs/design.md, Retries).
	if ki := e.waitState(key, "", cache.StateFailedRetryable); ki.Model != "primary" || len(ki.Fallbacks) != 0 {
		t.Fatalf("key info: model %q, fallbacks %+v; want primary and none", ki.Model, ki.Fallbacks)
	}
}

// TestDuplicateMembers: a body that holds a member the proxy acts on
// ("model", "stream", "n", "stream_options" and its include_usage,
// "background") more than once, in any spelling, is refused with 400
// invalid_request before any upstream work, keyed or not: parsers differ
// on which duplicate counts, so the proxy cannot know which model the
// upstream would run (a -fallback would rewrite one and send the other
// again) or how to judge its answer. The key stays free: the same key with
// a well-formed body is then a miss as usual.
func TestDuplicateMembers(t *testing.T) {
	t.Parallel()
	fs := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"type":"rate_limit","message":"slow down"}}`) //nolint:errcheck // the test reads what arrived
	})
	e := retryEnv(t, []string{fs.url}, func(pc *Config) {
		pc.Retry.Attempts = 1
		pc.Fallbacks = map[string][]string{"gpt-4o": {"gpt-4o-mini"}}
	})
	for _, c := range []struct{ name, body, member string }{
		{"model twice", `{"model":"x","model":"gpt-4o","stream":true,"messages":[]}`, "model"},
		{"model, escaped", `{"model":"gpt-4o","mod\u0065l":"x","stream":true,"messages":[]}`, "model"},
		{"stream twice", `{"model":"gpt-4o","stream":false,"messages":[],"stream":true}`, "stream"},
		{"n twice", `{"model":"gpt-4o","n":1,"stream":true,"n":2,"messages":[]}`, "n"},
		{"stream_options twice", `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"stream_options":{},"messages":[]}`, "stream_options"},
		{"include_usage twice", `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true,"include_usage":false},"messages":[]}`, "stream_options.include_usage"},
		{"background twice", `{"model":"gpt-4o","stream":true,"background":true,"input":"hi","background":false}`, "background"},
	} {
		for _, key := range []string{newKey("dup"), ""} {
			got := e.fetch(req{key: key, body: c.body})
			if got.status != http.StatusBadRequest || got.errType != "invalid_request" || !strings.Contains(gjson.GetBytes(got.raw, "error.message").String(), strconv.Quote(c.member)) {
				t.Fatalf("%s, key %q: got %d %q %s; want 400 invalid_request naming %q", c.name, key, got.status, got.errType, got.raw, c.member)
			}
			if key != "" {
				if info := e.fetch(req{method: http.MethodGet, path: "/keys/" + key}); info.status != http.StatusNotFound {
					t.Fatalf("%s: GET /keys after the refusal: got %d; want 404, the key never claimed", c.name, info.status)
				}
			}
		}
	}
	wantCount(t, "upstream calls", fs.calls.Load(), 0)
	// Without the duplicate the same key is decided as usual: the model,
	// then its fallback.
	key := newKey("dup")
	got := e.fetch(req{key: key, body: `{"model":"gpt-4o","stream":true,"messages":[]}`})
	if got.status != http.StatusTooManyRequests {
		t.Fatalf("well-formed: got %d; want the upstream's 429", got.status)
	}
	wantCount(t, "upstream calls", fs.calls.Load(), 2)
}

// outageEnv is ssegate with -fallback primary=fb and otherwise the
// default retries, budget and circuits, in front of the mock: "primary"
// fails as the test sets it, and "limited" always answers 429 with
// Retry-After: 1, so that its requests are retried and spend the retry
// budget every model shares.
func outageEnv(t *testing.T, opts ...envOption) *env {
	t.Helper()
	return newEnv(t, append([]envOption{func(pc *Config, _ *cache.Config, mc *mockllm.Config) {
		pc.Fallbacks = map[string][]string{"primary": {"fb"}}
		mc.ModelFaults = map[string]string{"limited": "status=429"}
		mc.Tokens = 8
	}}, opts...)...)
}

// post sends body with key (none when empty) from any goroutine, and
// reads the whole answer.
func (e *env) post(key, body string) (result, error) {
	hr, err := http.NewRequest(http.MethodPost, e.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return result{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	if key != "" {
		hr.Header.Set("Idempotency-Key", key)
	}
	resp, err := e.client.Do(hr)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return parseResult(resp, raw, err), nil
}

// wholeBy says how r falls short of a whole stream answered by model,
// or "" when it does not.
func wholeBy(r result, model string) string {
	if r.status != 200 || r.aborted || r.lastData() != "[DONE]" {
		return fmt.Sprintf("got %d aborted=%v ending %q; want a whole stream", r.status, r.aborted, r.lastData())
	}
	if by := modelOf(r); by != model {
		return fmt.Sprintf("answered by %q; want %q", by, model)
	}
	return ""
}

// TestOutageAnsweredByFallback: the primary model answers 503 for 10.5 s
// while another model's 429s spend the retry budget. Every request for the
// primary, a keyed and an unkeyed one every 1.5 s, is answered whole by the
// fallback; once its circuit is open the primary sees at most its probe,
// one call per -breaker-open-max (500ms here), never a retry; and after it
// recovers, requests are back on it within about -breaker-open-max,
// although it recovers just after a failed probe.
func TestOutageAnsweredByFallback(t *testing.T) {
	t.Parallel()
	const openMax = 500 * time.Millisecond
	e := outageEnv(t, withConfig(func(pc *Config) { pc.Retry.BreakerOpenMax = openMax }))
	e.mock.SetModelFault("primary", "status=503") //nolint:errcheck // a valid spec
	// Eight ticks, each three times -breaker-open-max: the circuit opens
	// within the first, and the rest show it probing, not retrying.
	const step = 3 * openMax
	const outage = 7 * step
	body := modelBody("primary")

	// Retries to a rate-limited model, as other tenants would make them.
	stop := make(chan struct{})
	var side sync.WaitGroup
	side.Add(1)
	go func() {
		defer side.Done()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			side.Add(1)
			go func() {
				defer side.Done()
				e.post("", modelBody("limited")) //nolint:errcheck // only its retries matter
			}()
		}
	}()
	defer func() {
		close(stop)
		side.Wait()
	}()

	start := time.Now()
	var fbAnswers int64
	var opened time.Time
	var callsAtOpen int64
	var mu sync.Mutex
	var failures []string
	ticks := 0
	for at := time.Duration(0); at <= outage; at += step {
		time.Sleep(time.Until(start.Add(at)))
		ticks++
		var wg sync.WaitGroup
		for _, key := range []string{newKey("outage"), ""} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := e.post(key, body)
				mu.Lock()
				defer mu.Unlock()
				switch why := wholeBy(r, "fb"); {
				case err != nil:
					failures = append(failures, fmt.Sprintf("at %v (key %q): %v", at, key, err))
				case why != "":
					failures = append(failures, fmt.Sprintf("at %v (key %q): %s", at, key, why))
				default:
					fbAnswers++
				}
			}()
		}
		wg.Wait()
		if opened.IsZero() && e.proxy.ups[0].Breaker().ModelState("primary") != upstream.CircuitClosed {
			opened, callsAtOpen = time.Now(), e.mock.CallsFor("primary")
		}
	}
	// The last tick's probe failed just now: the primary recovers at the
	// worst moment for the circuit, a whole -breaker-open-max before its
	// next probe.
	e.mock.SetModelFault("primary", "") //nolint:errcheck // clears it
	recovered := time.Now()
	primaryDuring := e.mock.CallsFor("primary")
	for _, f := range failures {
		t.Error(f)
	}
	if opened.IsZero() {
		t.Fatal("the primary's circuit never opened")
	}
	// Each tick after the opening probes the primary at most once (its
	// -breaker-open-max is a third of a tick): no retries, and one of each
	// tick's two requests goes to the fallback with no call at all.
	if probes, limit := primaryDuring-callsAtOpen, int64(ticks); probes > limit {
		t.Errorf("primary calls while its circuit was open: got %d; want at most %d (one probe a tick)", probes, limit)
	}
	if got := e.mock.CallsFor("fb"); got != fbAnswers {
		t.Errorf("fallback calls: got %d; want %d, one per answer", got, fbAnswers)
	}

	var backOn time.Duration = -1
	for time.Since(recovered) < 5*time.Second {
		sent := time.Since(recovered) // not when answered: the machine's load would add to it
		r, err := e.post(newKey("recovered"), body)
		if err != nil {
			t.Fatal(err)
		}
		if wholeBy(r, "primary") == "" {
			backOn = sent
			break
		}
		if why := wholeBy(r, "fb"); why != "" {
			t.Fatalf("after the recovery: %s", why)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if backOn < 0 || backOn > openMax+500*time.Millisecond {
		t.Fatalf("the first request served by the primary was sent %v after its recovery; want within about -breaker-open-max (%v)", backOn, openMax)
	}
	t.Logf("%d requests over the outage; primary calls %d (%d before its circuit opened); back on the primary %v after its recovery",
		2*ticks, primaryDuring, callsAtOpen, backOn)
}

// TestFallbackPastSpentBudget: with the retry budget spent, a request
// whose model fails is not retried, and goes on to its fallback, which
// answers: the budget bounds repeats to a failing model, never a first
// call to another.
func TestFallbackPastSpentBudget(t *testing.T) {
	t.Parallel()
	e := outageEnv(t)
	e.mock.SetModelFault("primary", "status=503") //nolint:errcheck // a valid spec
	// Spent with a margin: the request itself adds a tenth of a retry.
	e.proxy.budget.Request(time.Now())
	for e.proxy.budget.Retry(time.Now()) {
	}
	r, err := e.post(newKey("spent"), modelBody("primary"))
	if err != nil {
		t.Fatal(err)
	}
	if why := wholeBy(r, "fb"); why != "" {
		t.Fatal(why)
	}
	wantModelCalls(t, e, "primary", 1)
	wantModelCalls(t, e, "fb", 1)
}

// TestFallbackPastOpenedCircuit: a 503 with Retry-After that opens the
// model's circuit sends the request on to its fallback at once, rather
// than after the wait to probe the primary again.
func TestFallbackPastOpenedCircuit(t *testing.T) {
	t.Parallel()
	ms := newModelServer(t, func(model string, _ int64, w http.ResponseWriter) {
		if model == "primary" {
			w.Header().Set("Retry-After", "1")
			unavailable(w)
			return
		}
		okStream(w)
	})
	e := retryEnv(t, []string{ms.url}, func(pc *Config) {
		pc.Fallbacks = map[string][]string{"primary": {"fb"}}
		pc.Retry.BreakerFailures = 1
	})
	start := time.Now()
	r, err := e.post(newKey("opened"), chatFor("primary"))
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if !clean(r) {
		t.Fatalf("got %d ending %q; want a whole stream", r.status, r.lastData())
	}
	if got := ms.callsFor("primary"); got != 1 {
		t.Errorf("primary calls: got %d; want 1, the one that opened its circuit", got)
	}
	if got := ms.callsFor("fb"); got != 1 {
		t.Errorf("fallback calls: got %d; want 1", got)
	}
	if took >= time.Second {
		t.Errorf("answered in %v; want the fallback's answer without the primary's Retry-After", took)
	}
}
