package proxy

import (
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/mcpmock"
)

// TestToolConcurrent: 16 concurrent re-issues of one keyed call, each
// with its own id, run the tool once and each get the result under its
// own id; a later one replays it. In SSE and in JSON mode.
func TestToolConcurrent(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"sse", "json"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := newMCPEnv(t, mcpmock.Config{Stateless: true, JSON: mode == "json", Delay: 300 * time.Millisecond}, nil)
			key := newKey("many")
			var wg sync.WaitGroup
			results := make([]rpc, 16)
			for i := range results {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[i] = e.call(callBody(100+i, "write", map[string]any{"target": key}, nil), "Idempotency-Key", key)
				}()
			}
			wg.Wait()
			for i, r := range results {
				wantResult(t, r, 100+i)
			}
			e.wantRuns(key, 1)
			r := e.call(callBody("later", "write", map[string]any{"target": key}, nil), "Idempotency-Key", key)
			wantResult(t, r, "later")
			if r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("the replay is not marked replayed: %v", r.header)
			}
			e.wantRuns(key, 1)
			if got := metricValue(t, e.scrape(), `ssegate_tool_duplicate_side_effects_suppressed_total`); got != 16 {
				t.Fatalf("side effects suppressed: %v; want 16", got)
			}
		})
	}
}
