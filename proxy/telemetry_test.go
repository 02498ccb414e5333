package proxy

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/redistest"
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
func privateRedis(t *testing.T) *cache.Redis {
	t.Helper()
	srv := redistest.Start(t)
	store, err := cache.NewRedis(cache.RedisConfig{URL: "redis://" + srv.Addr, Prefix: redistest.Prefix(t),
		Lease: 3 * time.Second, Timeout: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	return store
}

// TestCommitUnknownKeys: ssegate_commit_unknown_keys counts a key whose
// upstream took the request and hung up (its outcome unknown, not
// repeated), and no longer once the client's retry claimed the key again
// and committed it: on the memory store, and on Redis by the set its
// scripts keep.
func TestCommitUnknownKeys(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			up := newFaultServer(t, func(n int64, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					hangUp(n, w, r)
					return
				}
				okStream(w)
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
			if r = e.fetch(req{key: key, body: chatBody}); !clean(r) {
				t.Fatalf("the retry: got %d %q; want a whole stream", r.status, r.raw)
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
