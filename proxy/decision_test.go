package proxy

import (
	"bytes"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
)

func slowMock(delay time.Duration, tokens int) envOption {
	return func(_ *Config, _ *cache.Config, mc *mockllm.Config) {
		mc.Delay = delay
		mc.Tokens = tokens
	}
}

// TestDecisionTable walks every row of the table in docs/design.md, Request decision.
func TestDecisionTable(t *testing.T) {
	e := newEnv(t, slowMock(10*time.Millisecond, 30))

	t.Run("miss then hit", func(t *testing.T) {
		e.mock.ResetCalls()
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
		e.mock.ResetCalls()
		key := newKey("join")
		first := e.do(req{key: key})
		defer first.Body.Close()
		time.Sleep(50 * time.Millisecond) // the generation is live
		joined := e.fetch(req{key: key})
		if joined.status != 200 || !joined.replayed || joined.lastData() != "[DONE]" {
			t.Fatalf("join: got status %d replayed %v last %q; want 200, true, [DONE]", joined.status, joined.replayed, joined.lastData())
		}
		e.wantCalls(1)
	})

	t.Run("live key, other request: 422", func(t *testing.T) {
		e.mock.ResetCalls()
		key := newKey("conflict-live")
		first := e.do(req{key: key})
		defer first.Body.Close()
		time.Sleep(30 * time.Millisecond)
		other := e.fetch(req{key: key, body: strings.Replace(chatBody, "joke", "poem", 1)})
		if other.status != 422 || other.errType != "idempotency_conflict" {
			t.Fatalf("got %d %q; want 422 idempotency_conflict", other.status, other.errType)
		}
		e.wantCalls(1)
	})

	t.Run("committed key, other request: 422", func(t *testing.T) {
		e.mock.ResetCalls()
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
		e.mock.ResetCalls()
		for _, key := range []string{strings.Repeat("k", 256), "has space", "tab\there", "é-accent"} {
			got := e.fetch(req{key: key})
			if got.status != 400 || got.errType != "invalid_idempotency_key" {
				t.Fatalf("key %q: got %d %q; want 400 invalid_idempotency_key", key, got.status, got.errType)
			}
		}
		e.wantCalls(0)
	})

	t.Run("aborted key is free: miss", func(t *testing.T) {
		e.mock.ResetCalls()
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
		e.mock.ResetCalls()
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
	e := newEnv(t, slowMock(10*time.Millisecond, 30), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.Inflight = InflightConflict
	})
	key := newKey("inflight")
	first := e.do(req{key: key})
	defer first.Body.Close()
	time.Sleep(30 * time.Millisecond)
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

// TestTenantIsolation: another credential with the same key and body
// never sees, joins or resumes the first tenant's stream.
func TestTenantIsolation(t *testing.T) {
	e := newEnv(t, slowMock(5*time.Millisecond, 20))
	key := newKey("tenant")
	a := e.fetch(req{key: key, auth: "Bearer sk-tenant-a"})
	b := e.fetch(req{key: key, auth: "Bearer sk-tenant-b"})
	if b.replayed {
		t.Fatalf("tenant b got a replay of tenant a's stream")
	}
	e.wantCalls(2)
	// Resume and key lookups are scoped too.
	got := e.fetch(req{method: http.MethodGet, path: "/streams/" + key, auth: "Bearer sk-tenant-c"})
	if got.status != 404 {
		t.Fatalf("GET /streams by tenant c: got %d; want 404", got.status)
	}
	got = e.fetch(req{key: key, auth: "Bearer sk-tenant-c", lastEventID: a.ids[2]})
	if got.status != 410 {
		t.Fatalf("POST resume by tenant c: got %d; want 410", got.status)
	}
	got = e.fetch(req{method: http.MethodGet, path: "/keys/" + key, auth: "x"})
	if got.status != 404 {
		t.Fatalf("GET /keys by another tenant: got %d; want 404", got.status)
	}
	e.wantCalls(2)
}

// TestNonStreaming: a keyed 2xx JSON answer is stored and replayed, and a
// concurrent duplicate waits for the first and gets the same answer.
func TestNonStreaming(t *testing.T) {
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

// TestRelayWholeAnswers: without a key, an answer that is not an event
// stream is relayed as the upstream gave it, whether it comes after the
// client's connection was taken over (a completion that takes a while)
// or before (an immediate 400), and nothing is replayed: one upstream
// call per request.
func TestRelayWholeAnswers(t *testing.T) {
	e := newEnv(t, slowMock(5*time.Millisecond, 20))
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	for i := range 2 {
		r := e.fetch(req{body: body})
		if r.status != 200 || r.replayed || !strings.Contains(string(r.raw), `"chat.completion"`) {
			t.Fatalf("completion %d: got %d replayed %v %q; want the upstream's 200 JSON", i, r.status, r.replayed, r.raw)
		}
	}
	e.wantCalls(2)
	r := e.fetch(req{header: map[string]string{"X-Mock-Fault": "status=400"}})
	if r.status != 400 || r.errType == "" {
		t.Fatalf("got %d %q; want the upstream's own 400 with its error body", r.status, r.raw)
	}
	e.wantCalls(3)
}

// TestUpstreamErrorNotStored: a 4xx answer is relayed as it was, not
// stored, and the key is free.
func TestUpstreamErrorNotStored(t *testing.T) {
	e := newEnv(t)
	key := newKey("4xx")
	r := e.fetch(req{key: key, header: map[string]string{"X-Mock-Fault": "status=400"}})
	if r.status != 400 {
		t.Fatalf("got %d; want the upstream's 400", r.status)
	}
	e.waitState(key, "", cache.StateFailedTerminal)
	ok := e.fetch(req{key: key})
	if ok.status != 200 || ok.replayed {
		t.Fatalf("after 4xx: got %d replayed %v; want a fresh 200", ok.status, ok.replayed)
	}
	e.wantCalls(2)
}

// TestBodyTooLarge: a body over -max-body gets a JSON 413 and no upstream call.
func TestBodyTooLarge(t *testing.T) {
	e := newEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) { pc.MaxBodyBytes = 1024 })
	r := e.fetch(req{key: newKey("big"), body: `{"x":"` + strings.Repeat("a", 4096) + `"}`})
	if r.status != 413 || r.errType != "request_too_large" {
		t.Fatalf("got %d %q; want 413 request_too_large", r.status, r.errType)
	}
	e.wantCalls(0)
}

// TestWebhookRedelivery: with -key-header webhook-id, a redelivered
// webhook (same id, same body) relayed through ssegate is answered from
// the store and reaches the upstream once.
func TestWebhookRedelivery(t *testing.T) {
	e := newEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.KeyHeaders = []string{"webhook-id", "X-GitHub-Delivery"}
	})
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"summarize this event"}]}`
	hdr := map[string]string{"webhook-id": "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", "webhook-timestamp": "1674087231"}
	first := e.fetch(req{body: body, header: hdr})
	hdr["webhook-timestamp"] = "1674087299" // redeliveries carry a new timestamp header
	second := e.fetch(req{body: body, header: hdr})
	if first.status != 200 || !second.replayed || string(second.raw) != string(first.raw) {
		t.Fatalf("redelivery: got %d replayed %v same %v; want a replay of the first answer", second.status, second.replayed, string(second.raw) == string(first.raw))
	}
	github := map[string]string{"X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"}
	e.fetch(req{body: body, header: github})
	if got := e.fetch(req{body: body, header: github}); !got.replayed {
		t.Fatalf("GitHub redelivery was not replayed")
	}
	e.wantCalls(2)
}
