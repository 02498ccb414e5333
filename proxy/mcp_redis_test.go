package proxy

import (
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache/redis"
	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mcpmock"
	"github.com/ssegate/ssegate/internal/redistest"
)

// TestToolRedis: two replicas on one Redis share tool calls: a call
// committed on one replays on the other, and one whose server died on
// one answers "unknown" on the other until DELETE /keys/{key} there.
func TestToolRedis(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	srv := mcpmock.New(mcpmock.Config{Stateless: true, Delay: 2 * time.Second})
	var logs gatetest.LogBuffer
	prefix := redistest.Prefix(t)
	replica := func() *mcpEnv {
		store, err := redis.New(redis.Config{URL: "redis://" + rs.Addr, Prefix: prefix,
			Lease: 3 * time.Second, Timeout: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(store.Close)
		return newMCPEnvOn(t, srv, func(pc *Config) { pc.Store = store })
	}
	a, b := replica(), replica()
	key := newKey("redis")
	wantResult(t, a.call(callBody(1, "write", map[string]any{"target": key, "ms": 50}, nil), "Idempotency-Key", key), 1)
	r := b.call(callBody(2, "write", map[string]any{"target": key, "ms": 50}, nil), "Idempotency-Key", key)
	wantResult(t, r, 2)
	if r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the other replica's answer is not a replay: %v", r.header)
	}
	a.wantRuns(key, 1)

	dies := newKey("redis-dies")
	args := map[string]any{"target": dies, "die": true}
	wantUnknown(t, a.call(callBody(3, "write", args, nil), "Idempotency-Key", dies), 3)
	wantUnknown(t, b.call(callBody(4, "write", args, nil), "Idempotency-Key", dies), 4)
	a.wantRuns(dies, 1)
	if got := metricValue(t, a.scrape(), `ssegate_tool_calls_unknown`); got != 1 {
		t.Fatalf("replica a's tool calls unknown: %v; want 1", got)
	}
	if d := b.del(dies); d != http.StatusNoContent {
		t.Fatalf("DELETE on the other replica: %d; want 204", d)
	}
	wantResult(t, a.call(callBody(5, "write", map[string]any{"target": dies, "ms": 50}, nil), "Idempotency-Key", dies), 5)
	a.wantRuns(dies, 2)
}
