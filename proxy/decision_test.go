package proxy

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/sse"
)

// TestDecisionTable walks every row of the table in docs/design.md, Request decision.
func TestDecisionTable(t *testing.T) {
	t.Parallel()
	fresh := func(t *testing.T) *env { return newEnv(t, slowMock(10*time.Millisecond, 30)) }

	t.Run("miss then hit", func(t *testing.T) {
		t.Parallel()
		e := fresh(t)
		key := newKey("hit")
		first := e.fetch(req{key: key})
		if first.status != 200 || first.replayed || first.aborted {
			t.Fatalf("first: got status %d replayed %v aborted %v; want 200, false, false", first.status, first.replayed, first.aborted)
		}
		if got := first.lastData(); got != "[DONE]" {
			t.Fatalf("first: last event %q; want [DONE]", got)
		}
		second := e.fetch(req{key: key})
		if !second.replayed || !bytes.Equal(second.raw, first.raw) {
			t.Fatalf("hit: replayed %v, identical %v; want true, true", second.replayed, bytes.Equal(second.raw, first.raw))
		}
		e.wantCalls(1)
	})

	t.Run("join live", func(t *testing.T) {
		t.Parallel()
		e := fresh(t)
		key := newKey("join")
		first := e.do(req{key: key})
		defer first.Body.Close()
		e.waitState(key, "", cache.StateExecutionStarted) // its head came: the generation is live
		joined := e.fetch(req{key: key})
		if joined.status != 200 || !joined.replayed || joined.lastData() != "[DONE]" {
			t.Fatalf("join: got status %d replayed %v last %q; want 200, true, [DONE]", joined.status, joined.replayed, joined.lastData())
		}
		e.wantCalls(1)
	})

	t.Run("live key, other request: 422", func(t *testing.T) {
		t.Parallel()
		e := fresh(t)
		key := newKey("conflict-live")
		first := e.do(req{key: key})
		defer first.Body.Close()
		e.waitState(key, "", cache.StateExecutionStarted)
		other := e.fetch(req{key: key, body: strings.Replace(chatBody, "joke", "poem", 1)})
		if other.status != 422 || other.errType != "idempotency_conflict" {
			t.Fatalf("got %d %q; want 422 idempotency_conflict", other.status, other.errType)
		}
		e.wantCalls(1)
	})

	t.Run("committed key, other request: 422", func(t *testing.T) {
		t.Parallel()
		e := fresh(t)
		key := newKey("conflict-done")
		e.fetch(req{key: key})
		for _, r := range []req{
			{key: key, body: strings.Replace(chatBody, "joke", "poem", 1)},
			{key: key, path: "/v1/chat/completions?x=1"},
			{key: key, path: "/v1/messages"},
		} {
			other := e.fetch(r)
			if other.status != 422 || other.errType != "idempotency_conflict" {
				t.Fatalf("%s %s: got %d %q; want 422 idempotency_conflict", r.path, r.body, other.status, other.errType)
			}
		}
		e.wantCalls(1)
	})

	t.Run("invalid key: 400", func(t *testing.T) {
		t.Parallel()
		e := fresh(t)
		for _, key := range []string{strings.Repeat("k", 256), "has space", "tab\there", "é-accent"} {
			got := e.fetch(req{key: key})
			if got.status != 400 || got.errType != "invalid_idempotency_key" {
				t.Fatalf("key %q: got %d %q; want 400 invalid_idempotency_key", key, got.status, got.errType)
			}
		}
		e.wantCalls(0)
	})

	t.Run("aborted key is free: miss", func(t *testing.T) {
		t.Parallel()
		e := fresh(t)
		key := newKey("aborted")
		bad := e.fetch(req{key: key, header: map[string]string{"X-Mock-Fault": "eof-after=3"}})
		if !bad.aborted {
			t.Fatalf("got events %d aborted %v; want a stream_aborted end", len(bad.events), bad.aborted)
		}
		e.waitState(key, "", cache.StateFailedRetryable)
		good := e.fetch(req{key: key})
		if good.replayed || good.lastData() != "[DONE]" {
			t.Fatalf("after abort: replayed %v last %q; want a fresh generation ending [DONE]", good.replayed, good.lastData())
		}
		e.wantCalls(2)
	})

	t.Run("no key: relayed, never recorded", func(t *testing.T) {
		t.Parallel()
		e := fresh(t)
		a := e.fetch(req{})
		b := e.fetch(req{})
		if a.lastData() != "[DONE]" || b.replayed {
			t.Fatalf("got last %q replayed %v; want [DONE], false", a.lastData(), b.replayed)
		}
		for _, id := range a.ids {
			if id != "" {
				t.Fatalf("unkeyed stream carries id %q; want none", id)
			}
		}
		e.wantCalls(2)
	})
}

// TestInflightConflict: with -inflight=conflict a duplicate of a live
// request gets 409 with Retry-After, and no upstream call.
func TestInflightConflict(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(10*time.Millisecond, 30), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.Inflight = InflightConflict
	})
	key := newKey("inflight")
	first := e.do(req{key: key})
	defer first.Body.Close()
	e.waitState(key, "", cache.StateExecutionStarted)
	resp := e.do(req{key: key})
	resp.Body.Close()
	if resp.StatusCode != 409 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("got %d Retry-After %q; want 409 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	e.wantCalls(1)
}

// TestConcurrentDuplicates: 16 identical requests at once cause exactly
// one upstream generation, and all 16 receive the same bytes.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(2*time.Millisecond, 40))
	key := newKey("dup16")
	const n = 16
	results := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = e.fetch(req{key: key})
		}()
	}
	close(start)
	wg.Wait()
	e.wantCalls(1)
	want := eventBytes(results[0].raw)
	replayed := 0
	for i, r := range results {
		if r.status != 200 || r.lastData() != "[DONE]" {
			t.Fatalf("client %d: got status %d last %q; want 200 [DONE]", i, r.status, r.lastData())
		}
		if got := eventBytes(r.raw); !bytes.Equal(got, want) {
			t.Fatalf("client %d: events differ from client 0 (%d vs %d bytes)", i, len(got), len(want))
		}
		if r.replayed {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Fatalf("Idempotent-Replayed on %d answers; want %d", replayed, n-1)
	}
	if got := len(results[0].events); got != 40+3 { // role chunk, 40 tokens, finish chunk, [DONE]
		t.Fatalf("events: got %d; want 43", got)
	}
}

// TestNonStreaming: a keyed 2xx JSON answer is stored and replayed, and a
// concurrent duplicate waits for the first and gets the same answer.
func TestNonStreaming(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(5*time.Millisecond, 20))
	key := newKey("json")
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	var wg sync.WaitGroup
	results := make([]result, 4)
	for i := range results {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = e.fetch(req{key: key, body: body}) }()
	}
	wg.Wait()
	later := e.fetch(req{key: key, body: body})
	e.wantCalls(1)
	for i, r := range append(results, later) {
		if r.status != 200 || !bytes.Equal(r.raw, results[0].raw) || !strings.Contains(string(r.raw), `"chat.completion"`) {
			t.Fatalf("answer %d: got %d %q; want 200 and the first answer", i, r.status, r.raw)
		}
	}
	if !later.replayed {
		t.Fatalf("replay lacks Idempotent-Replayed")
	}
}

// TestMissingBody: when the body store no longer holds a committed body,
// a duplicate regenerates (the default, counted) or gets 410 (policy).
func TestMissingBody(t *testing.T) {
	t.Parallel()
	for _, policy := range []cache.MissingBody{cache.Regenerate, cache.Refuse} {
		t.Run(fmt.Sprint(policy), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, slowMock(0, 10), func(_ *Config, cc *cache.Config, _ *mockllm.Config) { cc.MissingBody = policy })
			key := newKey("evicted")
			e.fetch(req{key: key})
			e.waitState(key, "", cache.StateCommitted)
			e.store.DropBody(cache.Scope{Tenant: "anonymous", Key: key})
			got := e.fetch(req{key: key})
			if policy == cache.Regenerate {
				if got.status != 200 || got.replayed || got.lastData() != "[DONE]" {
					t.Fatalf("got %d replayed %v; want a fresh generation", got.status, got.replayed)
				}
				e.wantCalls(2)
			} else {
				if got.status != 410 || got.errType != "stream_gone" {
					t.Fatalf("got %d %q; want 410 stream_gone", got.status, got.errType)
				}
				e.wantCalls(1)
			}
			if s := e.store.Stats(); s.BodyMissing != 1 {
				t.Fatalf("BodyMissing: got %d; want 1", s.BodyMissing)
			}
		})
	}
	// A body the store refused outright (larger than the whole store).
	e := newEnv(t, slowMock(0, 10), func(_ *Config, cc *cache.Config, _ *mockllm.Config) { cc.MaxStoreBytes = 100 }) // less than one compressed body
	key := newKey("refused")
	e.fetch(req{key: key})
	ki := e.waitState(key, "", cache.StateCommitted)
	if ki.BodyStored {
		t.Fatalf("a body larger than the store is reported stored")
	}
	again := e.fetch(req{key: key})
	if again.replayed || again.status != 200 {
		t.Fatalf("got %d replayed %v; want a fresh generation", again.status, again.replayed)
	}
	e.wantCalls(2)
}

// TestMaxKeysPerTenant: a credential at -max-keys-per-tenant gets 503
// capacity_exceeded, naming the bound, for a new key, with no upstream
// call; its committed keys still replay, and another credential's new
// keys are served.
func TestMaxKeysPerTenant(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
	for _, relay := range []bool{false, true} {
		t.Run(fmt.Sprintf("relay=%v", relay), func(t *testing.T) {
			t.Parallel()
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

// TestServerHeader: every answer says Server: ssegate, the first answer
// of a key as its replay does, and none relays the upstream's own
// (mockllm): streams and whole answers, first and replayed, joined and
// resumed, an upstream's error relayed, the proxy's own errors and the
// health check.
func TestServerHeader(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const whole = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	stream, plain := newKey("server"), newKey("server")
	first := e.fetch(req{key: stream})
	cases := []struct {
		name string
		res  result
	}{
		{"stream, first", first},
		{"stream, replayed", e.fetch(req{key: stream})},
		{"stream, resumed past its end", e.fetch(req{key: stream, lastEventID: first.ids[len(first.ids)-1]})},
		{"stream, resumed", e.fetch(req{key: stream, lastEventID: first.ids[0]})},
		{"whole, first", e.fetch(req{key: plain, body: whole})},
		{"whole, replayed", e.fetch(req{key: plain, body: whole})},
		{"unkeyed", e.fetch(req{})},
		{"unkeyed, whole", e.fetch(req{body: whole})},
		{"upstream error", e.fetch(req{key: newKey("server"), header: map[string]string{"X-Mock-Fault": "status=400"}})},
		{"conflict", e.fetch(req{key: plain})},
		{"invalid key", e.fetch(req{key: strings.Repeat("k", 1000)})},
		{"health", e.fetch(req{method: "GET", path: "/healthz"})},
	}
	for _, c := range cases {
		if c.res.status == 0 || c.res.status >= 500 {
			t.Errorf("%s: status %d; want an answer", c.name, c.res.status)
		}
		if got := c.res.header.Values("Server"); len(got) != 1 || got[0] != "ssegate" {
			t.Errorf("%s (%d): Server %q; want ssegate alone", c.name, c.res.status, got)
		}
	}
}
