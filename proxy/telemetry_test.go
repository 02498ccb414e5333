package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/redis"
	"github.com/ssegate/ssegate/internal/redistest"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// scrapeUntil polls the scrape until series reads want, and fails the
// test after 10 s with the last value read.
func (e *env) scrapeUntil(series string, want float64) {
	e.t.Helper()
	var got float64
	if !within(10*time.Second, func() bool {
		s := e.scrape()
		if !strings.Contains(s, series+" ") {
			got = -1
			return false
		}
		got = metricValue(e.t, s, series)
		return got == want
	}) {
		e.t.Fatalf("%s: got %v; want %v", series, got, want)
	}
}

// privateRedis is a Redis store on a private server of the test's own.
func privateRedis(t *testing.T) *redis.Store {
	t.Helper()
	srv := redistest.Start(t)
	store, err := redis.New(redis.Config{URL: "redis://" + srv.Addr, Prefix: redistest.Prefix(t),
		Lease: 3 * time.Second, Timeout: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	return store
}

// TestCommitUnknownKeys: ssegate_commit_unknown_keys counts a key whose
// upstream took the request and hung up (its outcome unknown, not
// repeated), and no longer once the client's retry claimed the key again,
// while that generation runs and after it committed: on the memory store,
// and on Redis by the set its scripts keep.
func TestCommitUnknownKeys(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			gate := make(chan struct{})
			retry := sseGated(chatChunk(0, "Hi", ""), chatChunk(0, "", "stop")+"data: [DONE]\n\n", gate)
			up := newFaultServer(t, func(n int64, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					hangUp(n, w, r)
					return
				}
				retry(n, w, r)
			})
			e := retryEnv(t, []string{up.url}, func(pc *Config) {
				if store == "redis" {
					pc.Store = privateRedis(t)
				}
			})
			const series = "ssegate_commit_unknown_keys"
			e.scrapeUntil(series, 0)
			key := newKey("unknown-keys")
			r := e.fetch(req{key: key, body: chatBody})
			if r.header.Get(outcomeHeader) != "unknown" {
				t.Fatalf("first answer %d %q: want the outcome-unknown answer", r.status, r.raw)
			}
			e.scrapeUntil(series, 1)
			resp := e.do(req{key: key, body: chatBody})
			defer resp.Body.Close()
			e.scrapeUntil(series, 0) // claimed again: live, its head relayed
			close(gate)
			if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
				t.Fatalf("the retry: got %d %q; want a whole stream", resp.StatusCode, b)
			}
			e.scrapeUntil(series, 0)
			wantCount(t, "upstream calls", up.calls.Load(), 2)
		})
	}
}

// anthropicBody is a streamed Messages request for model.
func anthropicBody(model string) string {
	return `{"model":"` + model + `","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Count"}]}`
}

// TestTokensLost: the tokens the upstream reported before a generation
// failed (Anthropic's message_start: 20 input, 1 output) are counted by
// what became of it: a stream cut after its first output (aborted), an
// overloaded_error before it that is retried, fallen back from, or,
// with neither left, relayed (failed). An answer that took more than one
// call adds a sample of ssegate_retry_added_seconds by what answered.
func TestTokensLost(t *testing.T) {
	t.Parallel()
	whole := fixtureBody(t, "anthropic-messages-text")
	start := whole[:strings.Index(whole, "\n\n")+2]
	overloaded := start + "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	firstOutput := whole[:strings.Index(whole, "event: content_block_stop")]
	cutAfter := func(w http.ResponseWriter, body string) {
		writeSSE(w, body)
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
	}
	cases := []struct {
		name   string
		script func(model string, n int64, w http.ResponseWriter)
		tune   func(*Config)
		calls  int64
		added  string // the label of the ssegate_retry_added_seconds sample, "" for none
	}{
		{"aborted", func(_ string, _ int64, w http.ResponseWriter) { cutAfter(w, firstOutput) }, nil, 1, ""},
		{"retried", func(_ string, n int64, w http.ResponseWriter) {
			if n == 1 {
				writeSSE(w, overloaded)
				return
			}
			writeSSE(w, whole)
		}, nil, 2, "retry"},
		{"fallback", func(model string, _ int64, w http.ResponseWriter) {
			if model == "claude-a" {
				writeSSE(w, overloaded)
				return
			}
			writeSSE(w, whole)
		}, func(pc *Config) {
			pc.Retry.Attempts = 1
			pc.Fallbacks = map[string][]string{"claude-a": {"claude-b"}}
		}, 2, "fallback"},
		{"failed", func(_ string, _ int64, w http.ResponseWriter) { writeSSE(w, overloaded) },
			func(pc *Config) { pc.Retry.Attempts = 1 }, 1, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ms := newModelServer(t, c.script)
			e := retryEnv(t, []string{ms.url}, c.tune)
			e.fetch(req{path: "/v1/messages", key: newKey("lost"), body: anthropicBody("claude-a")})
			wantCount(t, "upstream calls", ms.total(), c.calls)
			for _, kind := range []string{"input", "output"} {
				want := map[string]float64{"input": 20, "output": 1}[kind]
				e.scrapeUntil(fmt.Sprintf(`ssegate_tokens_lost_total{kind=%q,loss=%q}`, kind, c.name), want)
			}
			s := e.scrape()
			for _, by := range []string{"retry", "fallback"} {
				want := 0.0
				if by == c.added {
					want = 1
				}
				if got := metricValue(t, s, fmt.Sprintf(`ssegate_retry_added_seconds_count{by=%q}`, by)); got != want {
					t.Errorf("ssegate_retry_added_seconds_count{by=%q}: got %v; want %v", by, got, want)
				}
			}
		})
	}
}

// TestGenAIMetrics: a whole generation is a sample of each GenAI
// histogram, under the conventions' labels, its tokens as the upstream
// reported them; past -metrics-models the model's label is "other".
func TestGenAIMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withConfig(func(c *Config) { c.MetricsModels = 1 }))
	for _, model := range []string{"m1", "m2"} {
		body := `{"model":"` + model + `","stream":true,"stream_options":{"include_usage":true},"messages":[]}`
		if r := e.fetch(req{key: newKey("genai"), body: body}); !clean(r) {
			t.Fatalf("%s: got %d %q; want a whole stream", model, r.status, r.raw)
		}
	}
	e.wantCalls(2)
	for _, model := range []string{"m1", "other"} {
		l := `gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="` + model + `"`
		e.scrapeUntil(`gen_ai_server_request_duration_seconds_count{error_type="",`+l+`}`, 1)
		s := e.scrape()
		for series, want := range map[string]float64{
			`gen_ai_client_token_usage_count{` + l + `,gen_ai_token_type="output"}`:          1,
			`gen_ai_client_token_usage_sum{` + l + `,gen_ai_token_type="output"}`:            16, // the mock's tokens
			`gen_ai_client_token_usage_count{` + l + `,gen_ai_token_type="input"}`:           1,
			`gen_ai_server_time_to_first_token_seconds_count{` + l + `}`:                     1,
			`gen_ai_server_time_per_output_token_seconds_count{` + l + `}`:                   1,
			`gen_ai_client_token_usage_bucket{` + l + `,gen_ai_token_type="output",le="16"}`: 1,
			`gen_ai_client_token_usage_bucket{` + l + `,gen_ai_token_type="output",le="4"}`:  0,
		} {
			if got := metricValue(t, s, series); got != want {
				t.Errorf("%s: got %v; want %v", series, got, want)
			}
		}
	}
}

// tracedEnv is retryEnv with spans recorded in memory.
func tracedEnv(t *testing.T, upstreams []string, tune func(*Config)) (*env, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) }) //nolint:errcheck // in memory
	e := retryEnv(t, upstreams, func(pc *Config) {
		pc.Tracer = tp
		if tune != nil {
			tune(pc)
		}
	})
	return e, exp
}

// spansOf waits for n ended spans of kind and returns them, oldest first.
func spansOf(t *testing.T, exp *tracetest.InMemoryExporter, kind trace.SpanKind, n int) []tracetest.SpanStub {
	t.Helper()
	var got []tracetest.SpanStub
	if !within(10*time.Second, func() bool {
		got = got[:0]
		for _, s := range exp.GetSpans() {
			if s.SpanKind == kind {
				got = append(got, s)
			}
		}
		return len(got) >= n
	}) {
		t.Fatalf("%d %v spans ended; want %d", len(got), kind, n)
	}
	return got
}

// attrs reads a span's attributes as strings.
func attrs(s tracetest.SpanStub) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

// TestTraces: a keyed request whose first upstream call failed with 503
// and whose retry answered makes a server span, a child of the caller's
// traceparent, with its decision and the key's end state, and a client
// span per call with the GenAI attributes, the retry's reason on the
// first and the answer's model, usage and time to first token on the
// second; each call carried its own span's traceparent to the upstream.
// A repeat of the key (a hit) links to the generation's request span.
func TestTraces(t *testing.T) {
	t.Parallel()
	whole := fixtureBody(t, "openai-chat-usage")
	var seen [3]string // the traceparent of each upstream call
	up := newFaultServer(t, func(n int64, w http.ResponseWriter, r *http.Request) {
		if n <= int64(len(seen)) {
			seen[n-1] = r.Header.Get("traceparent")
		}
		if n == 1 {
			status(503)(n, w, r)
			return
		}
		writeSSE(w, whole)
	})
	e, exp := tracedEnv(t, []string{up.url}, nil)
	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	key := newKey("traced")
	body := `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[]}`
	r := e.fetch(req{key: key, body: body, header: map[string]string{"traceparent": "00-" + callerTrace + "-" + callerSpan + "-01"}})
	if r.status != 200 || r.lastData() != "[DONE]" {
		t.Fatalf("got %d %q; want the retry's whole stream", r.status, r.raw)
	}
	wantCount(t, "upstream calls", up.calls.Load(), 2)

	server := spansOf(t, exp, trace.SpanKindServer, 1)[0]
	if got := server.SpanContext.TraceID().String(); got != callerTrace {
		t.Errorf("server span trace %s; want the caller's %s", got, callerTrace)
	}
	if got := server.Parent.SpanID().String(); got != callerSpan {
		t.Errorf("server span parent %s; want the caller's span %s", got, callerSpan)
	}
	sa := attrs(server)
	for k, want := range map[string]string{"ssegate.decision": "miss", "ssegate.key.state": "committed",
		"http.request.method": "POST", "http.response.status_code": "200"} {
		if sa[k] != want {
			t.Errorf("server span %s = %q; want %q (all: %v)", k, sa[k], want, sa)
		}
	}
	calls := spansOf(t, exp, trace.SpanKindClient, 2)
	for i, c := range calls {
		if c.Parent.SpanID() != server.SpanContext.SpanID() {
			t.Errorf("call %d: parent %s; want the request's span %s", i+1, c.Parent.SpanID(), server.SpanContext.SpanID())
		}
		want := "00-" + callerTrace + "-" + c.SpanContext.SpanID().String() + "-01"
		if seen[i] != want {
			t.Errorf("call %d: the upstream got traceparent %q; want its span's %q", i+1, seen[i], want)
		}
		if c.Name != "chat gpt-4o" {
			t.Errorf("call %d: span name %q; want %q", i+1, c.Name, "chat gpt-4o")
		}
	}
	first, second := attrs(calls[0]), attrs(calls[1])
	for k, want := range map[string]string{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
		"gen_ai.request.model": "gpt-4o", "ssegate.attempt": "1", "http.response.status_code": "503",
		"error.type": "upstream_status_503", "ssegate.retry.reason": "upstream_status_503"} {
		if first[k] != want {
			t.Errorf("first call's span %s = %q; want %q (all: %v)", k, first[k], want, first)
		}
	}
	for k, want := range map[string]string{"gen_ai.request.model": "gpt-4o", "gen_ai.response.model": "gpt-4o-2024-08-06",
		"gen_ai.usage.input_tokens": "14", "gen_ai.usage.output_tokens": "8", "ssegate.attempt": "2",
		"http.response.status_code": "200", "error.type": ""} {
		if second[k] != want {
			t.Errorf("second call's span %s = %q; want %q (all: %v)", k, second[k], want, second)
		}
	}
	if second["ssegate.time_to_first_token"] == "" {
		t.Errorf("second call's span has no ssegate.time_to_first_token (all: %v)", second)
	}

	if r := e.fetch(req{key: key, body: body}); r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("repeat: got %d %q; want the replay", r.status, r.raw)
	}
	hit := spansOf(t, exp, trace.SpanKindServer, 2)[1]
	if a := attrs(hit); a["ssegate.decision"] != "hit" || a["ssegate.key.state"] != "committed" {
		t.Errorf("repeat's span: %v; want decision hit, state committed", a)
	}
	if len(hit.Links) != 1 || hit.Links[0].SpanContext.SpanID() != server.SpanContext.SpanID() {
		t.Errorf("repeat's span links %v; want one to the generation's request span %s", hit.Links, server.SpanContext.SpanID())
	}
	wantCount(t, "upstream calls", up.calls.Load(), 2)
}

// TestTraceJoinLinked: a duplicate that joins a live generation links
// its span to the span of the request that started the generation, in
// another trace; the generation made one upstream call, whose span is a
// child of the first request's.
func TestTraceJoinLinked(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	up := newFaultServer(t, sseGated(chatChunk(0, "Hi", ""), chatChunk(0, "", "stop")+"data: [DONE]\n\n", gate))
	e, exp := tracedEnv(t, []string{up.url}, nil)
	key := newKey("traced-join")
	first := e.do(req{key: key, body: chatBody})
	defer first.Body.Close()
	e.waitState(key, "", cache.StateExecutionStarted)
	joined := make(chan result, 1)
	go func() { joined <- e.fetch(req{key: key, body: chatBody}) }()
	waitFor(t, func() bool { return metricValue(t, e.scrape(), `ssegate_requests_total{decision="join"}`) == 1 })
	close(gate)
	io.Copy(io.Discard, first.Body) //nolint:errcheck // read to its end
	if r := <-joined; !clean(r) {
		t.Fatalf("joiner: got %d %q; want the whole stream", r.status, r.raw)
	}
	wantCount(t, "upstream calls", up.calls.Load(), 1)
	servers := spansOf(t, exp, trace.SpanKindServer, 2)
	byDecision := map[string]tracetest.SpanStub{}
	for _, s := range servers {
		byDecision[attrs(s)["ssegate.decision"]] = s
	}
	miss, join := byDecision["miss"], byDecision["join"]
	if !miss.SpanContext.IsValid() || !join.SpanContext.IsValid() {
		t.Fatalf("server spans by decision: %v; want a miss and a join", byDecision)
	}
	if len(join.Links) != 1 || join.Links[0].SpanContext.SpanID() != miss.SpanContext.SpanID() {
		t.Errorf("join's links %v; want one to the miss's span %s", join.Links, miss.SpanContext.SpanID())
	}
	if join.SpanContext.TraceID() == miss.SpanContext.TraceID() {
		t.Errorf("join in the miss's trace %s; want a trace of its own", miss.SpanContext.TraceID())
	}
	if s := attrs(join)["ssegate.key.state"]; s != "committed" {
		t.Errorf("join's key state %q; want committed", s)
	}
	if c := spansOf(t, exp, trace.SpanKindClient, 1); len(c) != 1 || c[0].Parent.SpanID() != miss.SpanContext.SpanID() {
		t.Errorf("call spans %d, parent %v; want one, a child of the miss's span", len(c), c[0].Parent.SpanID())
	}
}

// TestTokensLostOnce: a call that failed in its stream is retried, the
// retry finds nothing to connect to, and the first call's failure is what
// the client gets: its tokens count once, as retried, not again as failed.
func TestTokensLostOnce(t *testing.T) {
	t.Parallel()
	whole := fixtureBody(t, "anthropic-messages-text")
	start := whole[:strings.Index(whole, "\n\n")+2]
	overloaded := start + "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	ms := newModelServer(t, func(_ string, _ int64, w http.ResponseWriter) { writeSSE(w, overloaded) })
	down, _ := refusedAddr(t)
	dead := "http://" + down
	e := retryEnv(t, []string{ms.url, dead}, func(pc *Config) { pc.Retry.Attempts = 2 })
	e.fetch(req{path: "/v1/messages", key: newKey("once"), body: anthropicBody("claude-a")})
	wantCount(t, "upstream calls", ms.total(), 1)
	e.scrapeUntil(`ssegate_tokens_lost_total{kind="input",loss="retried"}`, 20)
	if got := metricValue(t, e.scrape(), `ssegate_tokens_lost_total{kind="input",loss="failed"}`); got != 0 {
		t.Fatalf(`tokens lost as failed: got %v; want 0 (counted as retried)`, got)
	}
}
