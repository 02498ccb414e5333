package observe_test

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// chat is a streamed chat completion of model with its usage asked for.
func chat(model, content string) string {
	return fmt.Sprintf(`{"model":%q,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":%q}]}`, model, content)
}

// mockFlags run ssegate in front of its embedded mock as make run does:
// the mock's failing models fall back to one that answers, and retries
// wait little.
var mockFlags = []string{"-upstream", "mock", "-log-level", "warn", "-mock-delay", "20ms",
	"-fallback", "mock-down=gpt-4o-mini;mock-rate-limited=gpt-4o-mini;mock-small=gpt-4o-mini",
	"-retry-backoff", "10ms", "-retry-max-backoff", "50ms", "-retry-after-max", "100ms"}

// runLoad sends, at once, what the dashboard and the rules watch: a keyed
// stream with a duplicate that joins it, a repeat that replays it and a
// resume from its third event; a request without a key; streams the mock
// cuts after their first output (chat and Anthropic, which has said its input tokens by then); a
// background Responses stream it cuts, which ssegate heals; models that
// fail (503, 429, a context-length 400) and fall back; and a 504, whose
// outcome is unknown. tag makes its keys and bodies its own.
func runLoad(t *testing.T, base, tag string) {
	t.Helper()
	var wg sync.WaitGroup
	go1 := func(r request) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(t, base, r)
		}()
	}
	dup := request{path: "/v1/chat/completions", key: tag + "-dup", body: chat("gpt-4o-mini", tag+" dup")}
	go1(request{path: "/v1/chat/completions", body: chat("gpt-4o-mini", tag+" relay")})
	go1(request{path: "/v1/chat/completions", key: tag + "-cut", fault: "reset-after=6", body: chat("gpt-4o-mini", tag+" cut")})
	go1(request{path: "/v1/messages", key: tag + "-cut-anthropic", fault: "reset-after=6",
		body: fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"messages":[{"role":"user","content":%q}]}`, tag+" cut")})
	go1(request{path: "/v1/responses", key: tag + "-background", fault: "reset-after=6",
		body: fmt.Sprintf(`{"model":"gpt-4o-mini","stream":true,"background":true,"input":%q}`, tag+" background")})
	for _, m := range []string{"mock-down", "mock-rate-limited", "mock-small"} {
		go1(request{path: "/v1/chat/completions", key: tag + "-" + m, body: chat(m, tag+" fallback")})
	}
	go1(request{path: "/v1/chat/completions", key: tag + "-unknown", fault: "status=504", body: chat("gpt-4o-mini", tag+" unknown")})
	join := dup
	join.delay = 100 * time.Millisecond
	go1(join)
	first := send(t, base, dup)
	wg.Wait()
	if first.status != 200 || len(first.ids) < 4 {
		t.Fatalf("the keyed stream: got status %d with %d events; want 200 and a whole stream", first.status, len(first.ids))
	}
	if a := send(t, base, dup); a.status != 200 {
		t.Errorf("the repeat: got status %d; want 200", a.status)
	}
	dup.lastEventID = first.ids[2]
	if a := send(t, base, dup); a.status != 200 || len(a.ids) != len(first.ids)-3 {
		t.Errorf("the resume: got status %d with %d events; want 200 and %d", a.status, len(a.ids), len(first.ids)-3)
	}
}
