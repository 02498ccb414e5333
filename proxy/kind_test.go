package proxy

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/mcpmock"
)

// TestToolRetryBounds: a tool call goes through the one attempt loop, so
// the bounds that refuse a model's retry refuse its retry too, and count
// it in ssegate_retries_refused_total: a Retry-After longer than
// -retry-after-max, and a wait that would pass -retry-max-elapsed. The
// server's 503 is then the answer, and it was called once.
func TestToolRetryBounds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		why    string
		tune   func(*Config)
		script func(n int64, w http.ResponseWriter, r *http.Request)
	}{
		{"retry_after_too_long", func(pc *Config) { pc.Retry.RetryAfterMax = time.Second }, func(n int64, w http.ResponseWriter, r *http.Request) {
			if n == 1 {
				w.Header().Set("Retry-After", "60")
				status(http.StatusServiceUnavailable)(n, w, r)
				return
			}
			toolResult(w)
		}},
		{"max_elapsed", func(pc *Config) { pc.Retry.MaxElapsed = 20 * time.Millisecond }, func(n int64, w http.ResponseWriter, r *http.Request) {
			if n == 1 {
				time.Sleep(50 * time.Millisecond) // the server is slow to refuse: the elapsed bound is passed
				status(http.StatusServiceUnavailable)(n, w, r)
				return
			}
			toolResult(w)
		}},
	} {
		t.Run(c.why, func(t *testing.T) {
			t.Parallel()
			fs := newFaultServer(t, c.script)
			e := &mcpEnv{env: retryEnv(t, []string{fs.url}, func(pc *Config) {
				pc.MCPPaths = []string{mcpmock.Path}
				c.tune(pc)
			})}
			key := newKey("bound")
			r := e.call(callBody(1, "write", map[string]any{"target": key}, nil), "Idempotency-Key", key)
			if r.status != http.StatusServiceUnavailable {
				t.Fatalf("got %d; want the server's 503, not retried", r.status)
			}
			wantCount(t, "server calls", fs.calls.Load(), 1)
			series := fmt.Sprintf(`ssegate_retries_refused_total{why=%q}`, c.why)
			if got := metricValue(t, e.scrape(), series); got != 1 {
				t.Fatalf("%s: got %v; want 1", series, got)
			}
		})
	}
}

// toolResult answers a tools/call of id 1 with its result, as JSON.
func toolResult(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`)
}
