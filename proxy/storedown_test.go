package proxy

import (
	"fmt"
	"testing"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/sse"
)

// downStore is a store that cannot be reached, as a Redis store answers
// while Redis is down. The proxy is what is under test here.
type downStore struct{}

func (downStore) Begin(cache.Scope, string) (cache.Begun, error) {
	return cache.Begun{}, fmt.Errorf("claim: %w", cache.ErrUnavailable)
}
func (downStore) Attach(cache.Scope, string, sse.ID, bool) (*cache.Flight, *cache.Result, error) {
	return nil, nil, fmt.Errorf("attach: %w", cache.ErrUnavailable)
}
func (downStore) Info(cache.Scope) (cache.KeyInfo, bool) { return cache.KeyInfo{}, false }

// TestStoreDown: keyed requests fail closed with 503 store_unavailable and
// Retry-After, unkeyed ones are unaffected; with RelayWhenStoreDown keyed
// requests are relayed unprotected instead.
func TestStoreDown(t *testing.T) {
	for _, relay := range []bool{false, true} {
		t.Run(fmt.Sprintf("relay=%v", relay), func(t *testing.T) {
			e := newEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
				pc.Store = downStore{}
				pc.RelayWhenStoreDown = relay
			})
			keyed := e.fetch(req{key: newKey("down")})
			if relay {
				if keyed.status != 200 || keyed.lastData() != "[DONE]" || keyed.replayed {
					t.Fatalf("keyed, relayed: got %d last %q; want a plain relay", keyed.status, keyed.lastData())
				}
			} else if keyed.status != 503 || keyed.errType != "store_unavailable" || keyed.header.Get("Retry-After") == "" {
				t.Fatalf("keyed: got %d %q Retry-After %q; want 503 store_unavailable with Retry-After", keyed.status, keyed.errType, keyed.header.Get("Retry-After"))
			}
			if plain := e.fetch(req{}); plain.status != 200 || plain.lastData() != "[DONE]" {
				t.Fatalf("unkeyed: got %d; want 200", plain.status)
			}
			if relay {
				e.wantCalls(2)
			} else {
				e.wantCalls(1)
			}
		})
	}
}
