package proxy

import (
	"strings"
	"testing"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
)

// TestMaxKeysPerTenant: a credential at -max-keys-per-tenant gets 503
// capacity_exceeded, naming the bound, for a new key, with no upstream
// call; its committed keys still replay, and another credential's new
// keys are served.
func TestMaxKeysPerTenant(t *testing.T) {
	e := newEnv(t, func(_ *Config, cc *cache.Config, _ *mockllm.Config) { cc.MaxKeysPerTenant = 2 })
	const full, other = "Bearer sk-full", "Bearer sk-other"
	first := e.fetch(req{key: "a", auth: full})
	second := e.fetch(req{key: "b", auth: full})
	if first.status != 200 || second.status != 200 {
		t.Fatalf("the first two keys: got %d, %d; want 200, 200", first.status, second.status)
	}
	e.mock.ResetCalls()

	refused := e.fetch(req{key: "c", auth: full})
	if refused.status != 503 || refused.errType != "capacity_exceeded" || refused.header.Get("Retry-After") == "" {
		t.Errorf("a third key: got %d %q Retry-After %q; want 503 capacity_exceeded with Retry-After",
			refused.status, refused.errType, refused.header.Get("Retry-After"))
	}
	if !strings.Contains(string(refused.raw), "-max-keys-per-tenant") {
		t.Errorf("a third key: got message %s; want it to name -max-keys-per-tenant", refused.raw)
	}
	e.wantCalls(0)

	if hit := e.fetch(req{key: "a", auth: full}); hit.status != 200 || !hit.replayed {
		t.Errorf("a committed key of the full credential: got %d replayed %v; want a 200 replay", hit.status, hit.replayed)
	}
	e.wantCalls(0)
	if r := e.fetch(req{key: "c", auth: other}); r.status != 200 || r.replayed || r.lastData() != "[DONE]" {
		t.Errorf("another credential's new key: got %d replayed %v last %q; want a 200 generation", r.status, r.replayed, r.lastData())
	}
	e.wantCalls(1)
}
