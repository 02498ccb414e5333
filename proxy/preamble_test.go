package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/ssegate/ssegate/cache"
)

// writeSSE answers body as an event stream, flushed.
func writeSSE(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, body) //nolint:errcheck // the test reads what arrived
	w.(http.Flusher).Flush()
}

// failingModel is an upstream that streams failure to every call for
// model, and whole to every call for another.
func failingModel(t *testing.T, model, failure, whole string) *modelServer {
	return newModelServer(t, func(m string, _ int64, w http.ResponseWriter) {
		if m == model {
			writeSSE(w, failure)
			return
		}
		writeSSE(w, whole)
	})
}

// TestPreambleErrorFallsBack: the recorded Responses failure
// (response.created, response.in_progress, then an insufficient_quota
// error and response.failed) is a failed attempt, not an answer: the
// request falls back, and openai-go reads the fallback model's whole
// stream, nothing of the primary's. The primary is called once (a quota
// does not come back within a retry), the fallback once.
func TestPreambleErrorFallsBack(t *testing.T) {
	t.Parallel()
	failed := fixtureBody(t, "openai-responses-error-failed")
	completed := fixtureBody(t, "openai-responses-completed")
	ms := failingModel(t, "gpt-5-nano", failed, completed)
	e := retryEnv(t, []string{ms.url}, func(pc *Config) {
		pc.Fallbacks = map[string][]string{"gpt-5-nano": {"gpt-5-mini"}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl := openai.NewClient(option.WithBaseURL(e.url+"/v1/"), option.WithAPIKey("sk-a"), option.WithMaxRetries(0),
		option.WithHTTPClient(e.client), option.WithHeader("Idempotency-Key", newKey("preamble-fallback")))
	s := cl.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "gpt-5-nano",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
	defer s.Close()
	var types []string
	text := ""
	for s.Next() {
		ev := s.Current()
		types = append(types, ev.Type)
		if ev.Type == "response.output_text.delta" {
			text += ev.Delta
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("stream: %v (events %v); want the fallback's whole stream", err, types)
	}
	if len(types) == 0 || types[0] != "response.created" || types[len(types)-1] != "response.completed" || text == "" {
		t.Fatalf("events %v, text %q; want the fallback's stream, response.created to response.completed", types, text)
	}
	for _, typ := range types {
		if typ == "error" || typ == "response.failed" {
			t.Fatalf("events %v: the primary's failure reached the client", types)
		}
	}
	wantCount(t, "primary calls", ms.callsFor("gpt-5-nano"), 1)
	wantCount(t, "fallback calls", ms.callsFor("gpt-5-mini"), 1)
}

// TestPreambleOverloadedRetried: Anthropic's overloaded_error after
// message_start and a ping is a failed attempt (as a 503): the request is
// made again, and anthropic-sdk-go reads the second call's whole message.
func TestPreambleOverloadedRetried(t *testing.T) {
	t.Parallel()
	whole := fixtureBody(t, "anthropic-messages-text")
	start := whole[:strings.Index(whole, "\n\n")+2]
	overloaded := start + "event: ping\ndata: {\"type\": \"ping\"}\n\n" +
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	ms := newModelServer(t, func(_ string, n int64, w http.ResponseWriter) {
		if n == 1 {
			writeSSE(w, overloaded)
			return
		}
		writeSSE(w, whole)
	})
	e := retryEnv(t, []string{ms.url}, nil)
	c := anthropic.NewClient(anthropicopt.WithBaseURL(e.url+"/"), anthropicopt.WithAPIKey("sk-ant"),
		anthropicopt.WithHTTPClient(e.client), anthropicopt.WithMaxRetries(0),
		anthropicopt.WithHeader("Idempotency-Key", newKey("preamble-overloaded")))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
		Model: "claude-sonnet-4-5", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Count"))},
	})
	defer stream.Close()
	text, stop := "", ""
	for stream.Next() {
		switch ev := stream.Current().AsAny().(type) {
		case anthropic.ContentBlockDeltaEvent:
			text += ev.Delta.Text
		case anthropic.MessageDeltaEvent:
			stop = string(ev.Delta.StopReason)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v; want the retry's whole message", err)
	}
	if stop == "" || text == "" {
		t.Fatalf("message: stop_reason %q, text %q; want a whole message", stop, text)
	}
	wantCount(t, "upstream calls", ms.total(), 2)
}

// routerFailure is a model server whose first call is an
// OpenRouter-style chat stream that fails before any output: a role-only
// chunk, a processing comment, then a chunk whose error member has code,
// and [DONE]. Every later call answers whole.
func routerFailure(t *testing.T, code int, whole string) *modelServer {
	const role = `data: {"id":"gen-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
	failure := fmt.Sprintf(`data: {"id":"gen-1","object":"chat.completion.chunk","created":1,"model":"m","error":{"code":%d,"message":"Provider returned error"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}`, code) + "\n\n"
	return newModelServer(t, func(_ string, n int64, w http.ResponseWriter) {
		if n == 1 {
			writeSSE(w, role+": OPENROUTER PROCESSING\n\n"+failure+"data: [DONE]\n\n")
			return
		}
		writeSSE(w, whole)
	})
}

// TestPreambleErrorMemberRetried: an OpenRouter-style chat stream, a
// role-only chunk and then a chunk with an error member (a 502 of the
// provider behind), is a failed attempt: the repeat's whole stream is
// the answer, with nothing of the first.
func TestPreambleErrorMemberRetried(t *testing.T) {
	t.Parallel()
	whole := fixtureBody(t, "openai-chat-text")
	ms := routerFailure(t, 502, whole)
	e := retryEnv(t, []string{ms.url}, nil)
	got := e.fetch(req{key: newKey("preamble-member")})
	if got.status != 200 || got.aborted || got.lastData() != "[DONE]" {
		t.Fatalf("got %d aborted %v (%q); want the repeat's whole stream", got.status, got.aborted, got.raw)
	}
	if s := stripIDs(got.raw, false); s != whole {
		t.Fatalf("events:\n%s\nwant exactly the repeat's:\n%s", s, whole)
	}
	wantCount(t, "upstream calls", ms.total(), 2)
}

// TestPreambleGatewayTimeoutNotRetried: an error member whose code is
// one of -ambiguous-status (504: a gateway behind timed out, and the
// request may be running there) is ambiguous, as that status's answer
// is: not repeated, and the answer says the outcome is unknown.
func TestPreambleGatewayTimeoutNotRetried(t *testing.T) {
	t.Parallel()
	ms := routerFailure(t, 504, fixtureBody(t, "openai-chat-text"))
	e := retryEnv(t, []string{ms.url}, nil)
	key := newKey("preamble-504")
	got := e.fetch(req{key: key})
	wantCount(t, "upstream calls", ms.total(), 1)
	if got.status != 504 || got.header.Get(outcomeHeader) != "unknown" {
		t.Fatalf("got %d %s=%q (%q); want the outcome-unknown 504", got.status, outcomeHeader, got.header.Get(outcomeHeader), got.raw)
	}
	e.waitState(key, "", cache.StateCommitUnknown)
}

// TestErrorAfterContentNotRetried: an error after the first text delta
// ends an answer that began: it is not made again (one call), the client
// gets the provider's error as it came, and the key is free: the repeat
// is a new call.
func TestErrorAfterContentNotRetried(t *testing.T) {
	t.Parallel()
	const body = `data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n" +
		`data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}` + "\n\n" +
		`data: {"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}` + "\n\n"
	ms := newModelServer(t, func(_ string, _ int64, w http.ResponseWriter) { writeSSE(w, body) })
	e := retryEnv(t, []string{ms.url}, nil)
	key := newKey("after-content")
	got := e.fetch(req{key: key})
	if got.status != 200 || !strings.Contains(got.lastData(), "server_error") {
		t.Fatalf("got %d (%q); want 200 and the provider's error", got.status, got.raw)
	}
	if s := stripIDs(got.raw, false); s != body {
		t.Fatalf("events:\n%s\nwant exactly the provider's:\n%s", s, body)
	}
	wantCount(t, "upstream calls", ms.total(), 1)
	e.waitState(key, "", cache.StateFailedRetryable)
	again := e.fetch(req{key: key})
	if again.replayed {
		t.Fatal("repeat: a replay; want a new generation")
	}
	wantCount(t, "upstream calls", ms.total(), 2)
}

// TestPreambleHoldBound: a preamble followed by a silence longer than
// -preamble-hold is relayed at the bound, to the caller and to a joiner,
// before the content comes; the content follows on the same id sequence.
func TestPreambleHoldBound(t *testing.T) {
	t.Parallel()
	whole := fixtureBody(t, "anthropic-messages-text")
	i := strings.Index(whole, "\n\n") + 2 // message_start
	gate := make(chan struct{})
	ms := newModelServer(t, func(_ string, _ int64, w http.ResponseWriter) {
		writeSSE(w, whole[:i])
		select {
		case <-gate:
		case <-time.After(10 * time.Second):
		}
		writeSSE(w, whole[i:])
	})
	const hold = 300 * time.Millisecond
	e := retryEnv(t, []string{ms.url}, func(pc *Config) { pc.PreambleHold = hold })
	key := newKey("preamble-hold")
	body := `{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Count"}]}`
	start := time.Now()
	firstEvent := func(name string, resp *http.Response) *bufio.Reader {
		t.Helper()
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		for err == nil && !strings.HasPrefix(line, "event: message_start") {
			line, err = br.ReadString('\n')
		}
		if err != nil {
			t.Fatalf("%s: %v before message_start", name, err)
		}
		// The content waits for gate (closed once both have their
		// message_start, or 10 s): a message_start before then came at
		// the hold's bound, however late a loaded machine ran it.
		if took := time.Since(start); took < hold-50*time.Millisecond || took > hold+5*time.Second {
			t.Fatalf("%s: message_start after %v; want it at -preamble-hold (%v)", name, took, hold)
		}
		return br
	}
	origin := e.do(req{key: key, path: "/v1/messages", body: body})
	defer origin.Body.Close()
	joiner := e.do(req{key: key, path: "/v1/messages", body: body})
	defer joiner.Body.Close()
	ob := firstEvent("origin", origin)
	jb := firstEvent("joiner", joiner)
	close(gate)
	for name, br := range map[string]*bufio.Reader{"origin": ob, "joiner": jb} {
		rest, err := io.ReadAll(br)
		if err != nil || !strings.Contains(string(rest), "message_stop") || strings.Contains(string(rest), "stream_aborted") {
			t.Fatalf("%s: rest %q (%v); want the whole message", name, rest, err)
		}
	}
	e.waitState(key, "", cache.StateCommitted)
	wantCount(t, "upstream calls", ms.total(), 1)
}

// TestPreambleBytesBound: a preamble past -max-event-bytes is relayed
// rather than held further, so an error after it is the provider's
// answer, as it came (one call, not retried).
func TestPreambleBytesBound(t *testing.T) {
	t.Parallel()
	pad := strings.Repeat("x", 600)
	body := `event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"` + pad + `"}}` + "\n\n" +
		"event: ping\ndata: {\"type\": \"ping\",\"pad\":\"" + pad + "\"}\n\n" +
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	ms := newModelServer(t, func(_ string, _ int64, w http.ResponseWriter) { writeSSE(w, body) })
	e := retryEnv(t, []string{ms.url}, func(pc *Config) { pc.MaxEventBytes = 1000 })
	got := e.fetch(req{key: newKey("preamble-bytes"), path: "/v1/messages",
		body: `{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Count"}]}`})
	if got.status != 200 || stripIDs(got.raw, false) != body {
		t.Fatalf("got %d (%q); want 200 and the provider's events as they came", got.status, got.raw)
	}
	wantCount(t, "upstream calls", ms.total(), 1)
}

// TestPreambleErrorOpensCircuit: errors in the preamble count against the
// model's circuit like the statuses they stand for: once it opened, a
// request goes to the fallback with no call to the primary.
func TestPreambleErrorOpensCircuit(t *testing.T) {
	t.Parallel()
	whole := fixtureBody(t, "anthropic-messages-text")
	overloaded := whole[:strings.Index(whole, "\n\n")+2] +
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	ms := failingModel(t, "claude-primary", overloaded, whole)
	e := retryEnv(t, []string{ms.url}, func(pc *Config) {
		pc.Fallbacks = map[string][]string{"claude-primary": {"claude-backup"}}
		pc.Retry.BreakerFailures = 3
		pc.Retry.BreakerOpen = time.Minute
		pc.Retry.BreakerOpenMax = time.Minute
	})
	const n = 5
	for i := range n {
		got := e.fetch(req{path: "/v1/messages", body: `{"model":"claude-primary","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Count"}]}`})
		if got.status != 200 || !strings.Contains(string(got.raw), "message_stop") || strings.Contains(string(got.raw), "overloaded_error") {
			t.Fatalf("request %d: got %d (%q); want the fallback's whole message", i, got.status, got.raw)
		}
	}
	if got := ms.callsFor("claude-primary"); got != 3 {
		t.Fatalf("primary calls: got %d; want 3, then its circuit open", got)
	}
	wantCount(t, "fallback calls", ms.callsFor("claude-backup"), n)
}

// TestFirstEventAtOnce: a whole short stream that comes in one read of the
// upstream's socket (its role chunk, its output, its end) reaches the
// client's first event in a write of its own, not after the rest of the
// read is recorded and the stream committed.
func TestFirstEventAtOnce(t *testing.T) {
	t.Parallel()
	const role = `data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
	stream := role + chatChunk(0, "Hello", "") + chatChunk(0, " there", "") + chatChunk(0, "", "stop") + "data: [DONE]\n\n"
	raw := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(stream), stream)
	var proxy atomic.Pointer[Proxy]
	up := newRawUpstream(t, func(_ *rawUpstream, c net.Conn) {
		readRequest(c)
		// The answer comes once the client's connection is taken over:
		// one that comes before finds no client to write, and the client
		// gets everything journaled by then at once.
		within(5*time.Second, func() bool { return originsAttached(proxy.Load()) })
		io.WriteString(c, raw) //nolint:errcheck // the test reads what arrived
	})
	e := retryEnv(t, []string{up.url}, nil)
	proxy.Store(e.proxy)
	for _, key := range []string{"", newKey("at-once")} {
		conn := sendChat(t, strings.TrimPrefix(e.url, "http://"), "HTTP/1.1", key)
		defer conn.Close()
		br := bufio.NewReader(conn)
		for { // the head
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("key %q: reading the head: %v", key, err)
			}
			if line == "\r\n" {
				break
			}
		}
		var chunks []string
		for { // the chunks, up to the last
			size, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("key %q: reading chunk %d: %v", key, len(chunks), err)
			}
			n, err := strconv.ParseInt(strings.TrimSpace(size), 16, 64)
			if err != nil {
				t.Fatalf("key %q: chunk size %q: %v", key, size, err)
			}
			b := make([]byte, n+2)
			if _, err := io.ReadFull(br, b); err != nil {
				t.Fatalf("key %q: reading chunk %d: %v", key, len(chunks), err)
			}
			if n == 0 {
				break
			}
			chunks = append(chunks, string(b[:n]))
		}
		if first := chunks[0]; !strings.Contains(first, `"Hello"`) || strings.Contains(first, "[DONE]") {
			t.Errorf("key %q: first chunk %q; want the preamble and the first output, without the end", key, first)
		}
		if all := strings.Join(chunks, ""); !strings.Contains(all, "[DONE]") || strings.Count(all, "data:") != 5 {
			t.Errorf("key %q: got %q; want the whole stream", key, all)
		}
		conn.Close()
	}
	if got := up.calls.Load(); got != 2 {
		t.Errorf("upstream calls: got %d; want 2", got)
	}
}

// originsAttached reports whether p has live generations and each one's
// client connection is taken over.
func originsAttached(p *Proxy) bool {
	p.liveMu.Lock()
	defer p.liveMu.Unlock()
	for g := range p.live {
		g.o.mu.Lock()
		waiting := g.o.mode == originWaiting
		g.o.mu.Unlock()
		if waiting {
			return false
		}
	}
	return len(p.live) > 0
}
