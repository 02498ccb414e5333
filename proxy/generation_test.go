package proxy

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
)

// TestAborts: an upstream that fails mid-stream or ends uncleanly gives
// the client stream_aborted, unless the provider stated the failure itself
// (its error event, relayed as it came, ends the stream: stated); nothing
// is stored; the next request regenerates and the one after it is a hit.
func TestAborts(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, fault, path, body string
		stated                  bool
	}{
		{"reset mid-stream", "reset-after=5", "", "", false},
		{"EOF without end", "eof-after=5", "", "", false},
		{"[DONE] after error", "error-after=5", "", "", true},
		{"hang past idle timeout", "hang-after=3", "", "", false},
		// After the first text delta: before it (message_start, an empty
		// block's start, ping) the error is a failed attempt, retried.
		{"anthropic error event", "error-after=5", "/v1/messages", `{"model":"claude","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`, true},
		{"anthropic EOF", "eof-after=3", "/v1/messages", `{"model":"claude","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`, false},
		{"responses error", "error-after=3", "/v1/responses", `{"model":"gpt-4o","stream":true,"input":"hi"}`, true},
		{"responses EOF", "eof-after=3", "/v1/responses", `{"model":"gpt-4o","stream":true,"input":"hi"}`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, slowMock(0, 20), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
				pc.UpstreamIdleTimeout = 300 * time.Millisecond
			})
			key := newKey("abort")
			bad := e.fetch(req{key: key, path: c.path, body: c.body, header: map[string]string{"X-Mock-Fault": c.fault}})
			switch {
			case c.stated && (bad.status != 200 || bad.aborted || !strings.Contains(bad.lastData(), `"error"`)):
				t.Fatalf("got status %d, %d events, aborted %v, last %q; want 200 ending in the provider's error event", bad.status, len(bad.events), bad.aborted, bad.lastData())
			case !c.stated && (bad.status != 200 || !bad.aborted):
				t.Fatalf("got status %d, %d events, aborted %v, last %q; want 200 ending in stream_aborted", bad.status, len(bad.events), bad.aborted, bad.lastData())
			}
			ki := e.waitState(key, "", cache.StateFailedRetryable)
			if ki.BodyStored {
				t.Fatalf("an aborted stream was stored")
			}
			fresh := e.fetch(req{key: key, path: c.path, body: c.body})
			if fresh.replayed || fresh.aborted || fresh.status != 200 {
				t.Fatalf("next: got status %d replayed %v aborted %v; want a fresh clean stream", fresh.status, fresh.replayed, fresh.aborted)
			}
			e.waitState(key, "", cache.StateCommitted)
			hit := e.fetch(req{key: key, path: c.path, body: c.body})
			if !hit.replayed || string(eventBytes(hit.raw)) != string(eventBytes(fresh.raw)) {
				t.Fatalf("third: replayed %v, same as second %v; want a replay of the second", hit.replayed, string(hit.raw) == string(fresh.raw))
			}
			e.wantCalls(2)
		})
	}
}

// TestDialects: each dialect's clean stream through ssegate is committed
// and replayed; requests that ask for usage are held to it.
func TestDialects(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, path, body, last string }{
		{"openai chat", "/v1/chat/completions", chatBody, "[DONE]"},
		{"openai chat with usage", "/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`, "[DONE]"},
		{"openai chat length", "/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":3,"messages":[]}`, "[DONE]"},
		{"openai responses", "/v1/responses", `{"model":"m","stream":true,"input":"hi"}`, "response.completed"},
		{"anthropic", "/v1/messages", `{"model":"claude","stream":true,"max_tokens":100,"messages":[]}`, "message_stop"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, slowMock(0, 12))
			key := newKey("dialect")
			first := e.fetch(req{key: key, path: c.path, body: c.body})
			if first.aborted || first.status != 200 {
				t.Fatalf("got %d aborted %v (%q); want a clean stream", first.status, first.aborted, first.lastData())
			}
			last := first.events[len(first.events)-1]
			if last.Data != c.last && last.Type != c.last {
				t.Fatalf("last event %q/%q; want %q", last.Type, last.Data, c.last)
			}
			e.waitState(key, "", cache.StateCommitted)
			second := e.fetch(req{key: key, path: c.path, body: c.body})
			if !second.replayed || string(second.raw) != string(first.raw) {
				t.Fatalf("replay differs or not flagged")
			}
			e.wantCalls(1)
		})
	}
}

// TestStreamBound: a stream over the per-stream bound is aborted with a
// message naming the bound, and nothing is stored.
func TestStreamBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(0, 200), func(_ *Config, cc *cache.Config, _ *mockllm.Config) { cc.MaxStreamBytes = 8 << 10 })
	key := newKey("bound")
	got := e.fetch(req{key: key})
	if !got.aborted || !strings.Contains(got.lastData(), "max_stream_bytes") {
		t.Fatalf("got aborted %v last %q; want stream_aborted naming max_stream_bytes", got.aborted, got.lastData())
	}
	e.waitState(key, "", cache.StateFailedRetryable)
}

// TestUpstreamErrorNotStored: a 4xx answer is relayed as it was, not
// stored, and the key is free.
func TestUpstreamErrorNotStored(t *testing.T) {
	t.Parallel()
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

// TestAbortWhileAwaitingHead: a generation cut short (shutdown) while its
// call waits for the head ends, with no read of the answer it then drops.
// The request went upstream: its client gets the outcome-unknown answer,
// not a 503 that says "try again".
func TestAbortWhileAwaitingHead(t *testing.T) {
	t.Parallel()
	fs := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
		time.Sleep(400 * time.Millisecond)
		okStream(w)
	})
	e := retryEnv(t, []string{fs.url}, func(pc *Config) { pc.HeadTimeout = 5 * time.Second })
	done := make(chan result, 1)
	go func() { done <- e.fetch(req{key: newKey("abort")}) }()
	waitFor(t, func() bool { return fs.calls.Load() == 1 }) // the request went: the call waits for the head
	e.proxy.Abort()
	select {
	case got := <-done:
		if got.status != http.StatusBadGateway || got.errType != "upstream_error" || got.header.Get(outcomeHeader) != "unknown" {
			t.Fatalf("got %d %q, %s %q; want 502 upstream_error, %s: unknown", got.status, got.errType, outcomeHeader, got.header.Get(outcomeHeader), outcomeHeader)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer 5 s after Abort")
	}
	if !within(2*time.Second, func() bool { return e.proxy.streams.Load() == 0 }) {
		t.Fatalf("live generations: %d; want 0", e.proxy.streams.Load())
	}
}

// chatChunk is a chat completion chunk event for choice idx.
func chatChunk(idx int, content, finish string) string {
	fin := "null"
	if finish != "" {
		fin = `"` + finish + `"`
	}
	return fmt.Sprintf("data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":%d,\"delta\":{\"content\":%q},\"finish_reason\":%s}]}\n\n", idx, content, fin)
}

const usageChunk = "data: {\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n"

// sseAnswer answers with events; end says how the body ends: "framed"
// (net/http's last chunk), "reset" (the connection cut after the events,
// no last chunk) or "close" (no framing: the body ends where the
// connection closes).
func sseAnswer(events string, end string) func(int64, http.ResponseWriter, *http.Request) {
	return func(_ int64, w http.ResponseWriter, _ *http.Request) {
		if end == "close" {
			conn, bw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + events)
			bw.Flush()
			conn.Close()
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, events)
		w.(http.Flusher).Flush()
		if end == "reset" {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		}
	}
}

// TestCleanEnd holds the rules of docs/design.md, Clean end, for chat streams that
// real providers send: complete without [DONE] when the framing is
// intact, every choice of n, and nothing after the terminal event.
func TestCleanEnd(t *testing.T) {
	t.Parallel()
	usageBody := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`
	n2Body := `{"model":"m","stream":true,"n":2,"messages":[]}`
	whole := chatChunk(0, "Hi", "") + chatChunk(0, "", "stop") + usageChunk
	cases := []struct {
		name   string
		body   string
		script func(int64, http.ResponseWriter, *http.Request)
		clean  bool
		want   string // the events the client gets (and a replay), before any abort
	}{
		{"whole without [DONE], framed", usageBody, sseAnswer(whole, "framed"), true, whole},
		{"whole without [DONE], cut", usageBody, sseAnswer(whole, "reset"), false, whole},
		{"whole without [DONE], close-delimited", usageBody, sseAnswer(whole, "close"), false, whole},
		{"without [DONE], usage missing", usageBody, sseAnswer(chatChunk(0, "Hi", "stop"), "framed"), false, chatChunk(0, "Hi", "stop")},
		{"n=2, one choice only", n2Body, sseAnswer(chatChunk(0, "Hi", "stop")+"data: [DONE]\n\n", "framed"), false, chatChunk(0, "Hi", "stop")}, // [DONE] not relayed: TestFalseEndNotRelayed
		{"n=2, both choices", n2Body, sseAnswer(chatChunk(0, "Hi", "stop")+chatChunk(1, "Yo", "stop")+"data: [DONE]\n\n", "framed"), true,
			chatChunk(0, "Hi", "stop") + chatChunk(1, "Yo", "stop") + "data: [DONE]\n\n"},
		{"chunks after [DONE] are not part of it", usageBody, sseAnswer(whole+"data: [DONE]\n\n"+chatChunk(0, "extra", "")+"data: {\"error\":{\"message\":\"late\"}}\n\n", "framed"), true,
			whole + "data: [DONE]\n\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fs := newFaultServer(t, c.script)
			e := retryEnv(t, []string{fs.url}, nil)
			key := newKey("clean")
			got := e.fetch(req{key: key, body: c.body})
			if got.status != 200 || got.aborted == c.clean {
				t.Fatalf("got %d aborted %v (%q); want 200 aborted %v", got.status, got.aborted, got.raw, !c.clean)
			}
			if evs := stripIDs(got.raw, got.aborted); evs != c.want {
				t.Fatalf("events:\n%s\nwant:\n%s", evs, c.want)
			}
			if !c.clean {
				e.waitState(key, "", cache.StateFailedRetryable)
				return
			}
			e.waitState(key, "", cache.StateCommitted)
			again := e.fetch(req{key: key, body: c.body})
			if !again.replayed || string(again.raw) != string(eventBytes(got.raw)) {
				t.Fatalf("replay: replayed %v\n%s\nwant the original's events:\n%s", again.replayed, again.raw, eventBytes(got.raw))
			}
			wantCount(t, "upstream calls", fs.calls.Load(), 1)
		})
	}
}

// stripIDs is the body's events without the ids the proxy assigned (and
// without the closing stream_aborted event when aborted), in the
// upstream's own wire form.
func stripIDs(raw []byte, aborted bool) string {
	var out strings.Builder
	blocks := strings.Split(string(eventBytes(raw)), "\n\n")
	if aborted && len(blocks) > 1 {
		blocks = blocks[:len(blocks)-2] // the error event, then the empty rest
		blocks = append(blocks, "")
	}
	for _, b := range blocks {
		if b == "" {
			continue
		}
		for _, line := range strings.Split(b, "\n") {
			if !strings.HasPrefix(line, "id: ") {
				out.WriteString(line + "\n")
			}
		}
		out.WriteString("\n")
	}
	return out.String()
}

// TestUnprovenEndRelayed: a stream whose provider ended it with its
// terminal event, whole for what the request asked but which the proxy
// cannot prove whole otherwise ([DONE] after a choice the request did not
// ask for, or without the usage it asked for; Anthropic message_stop
// without a stop_reason; a stream of no dialect the proxy knows), is
// relayed as it came, its terminal event included, with no
// stream_aborted: the proxy turns nothing the upstream sent into an
// error. It is not stored (failed_retryable, the skipped metric says why),
// so the next request calls the upstream again.
func TestUnprovenEndRelayed(t *testing.T) {
	t.Parallel()
	n1Two := chatChunk(0, "Hi", "stop") + `data: {"object":"chat.completion.chunk","choices":[{"index":1,"delta":{"content":"Yo"},"finish_reason":"stop"}]}` + "\n\n" + "data: [DONE]\n\n"
	cases := []struct{ name, body, events, reason string }{
		{"[DONE] with a choice not asked for", chatBody, n1Two, "unexpected_choice"},
		{"[DONE] without the usage asked for", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`, chatChunk(0, "Hi", "stop") + "data: [DONE]\n\n", "missing_usage"},
		{"message_stop without stop_reason", chatBody,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", "missing_stop_reason"},
		{"no known dialect", chatBody, "data: hello\n\ndata: world\n\n", "unknown_dialect"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fs := newFaultServer(t, sseAnswer(c.events, "framed"))
			e := retryEnv(t, []string{fs.url}, nil)
			key := newKey("unproven")
			for i, k := range []string{key, "", key} {
				got := e.fetch(req{key: k, body: c.body})
				if got.status != 200 || got.aborted || got.replayed {
					t.Fatalf("request %d (key %q): got %d aborted %v replayed %v (%q); want 200, no stream_aborted, not a replay", i, k, got.status, got.aborted, got.replayed, got.raw)
				}
				if evs := stripIDs(got.raw, false); evs != c.events {
					t.Fatalf("request %d (key %q): events:\n%s\nwant them as the upstream sent them:\n%s", i, k, evs, c.events)
				}
				if k != "" {
					ki := e.waitState(key, "", cache.StateFailedRetryable)
					if ki.BodyStored || ki.Reason != c.reason {
						t.Fatalf("key: stored %v, reason %q; want not stored, %q", ki.BodyStored, ki.Reason, c.reason)
					}
				}
			}
			wantCount(t, "upstream calls", fs.calls.Load(), 3) // the repeat of the key is a new generation
			scrape := e.scrape()
			if got := metricValue(t, scrape, `ssegate_cache_skipped_total{reason="`+c.reason+`"}`); got != 2 {
				t.Fatalf("skipped{%s}: got %v; want 2", c.reason, got)
			}
			if strings.Contains(scrape, `ssegate_streams_aborted_total{cause="`+c.reason+`"}`) {
				t.Fatalf("aborted{%s}: counted; want it not counted as an abort", c.reason)
			}
		})
	}
}

// TestFalseEndNotRelayed: a terminal event that claims a whole answer when
// what reached the client is not one ([DONE] with a choice of n unfinished
// or missing, or with no choice at all; response.completed after a
// sequence_number gap: events are missing) is not relayed: a client that
// stops reading at it would take a half stream for a whole one. The client
// gets stream_aborted in its place, keyed or not.
func TestFalseEndNotRelayed(t *testing.T) {
	t.Parallel()
	resp := fixtureBody(t, "openai-responses-completed")
	gap := strings.Replace(resp, `"sequence_number":5}`, `"sequence_number":50}`, 1)
	last := strings.LastIndex(gap, "event: response.completed\n")
	if gap == resp || last < 0 {
		t.Fatal("fixture: no sequence_number 5, or no response.completed")
	}
	cases := []struct{ name, body, events, want string }{
		{"[DONE] with the finish_reason missing", chatBody, chatChunk(0, "Hi", "") + "data: [DONE]\n\n", chatChunk(0, "Hi", "")},
		{"[DONE] with a choice of n missing", `{"model":"m","stream":true,"n":2,"messages":[]}`, chatChunk(0, "Hi", "stop") + "data: [DONE]\n\n", chatChunk(0, "Hi", "stop")},
		{"[DONE] with no choice", chatBody, usageChunk + "data: [DONE]\n\n", usageChunk},
		{"response.completed after a sequence gap", `{"model":"m","stream":true,"input":"hi"}`, gap, gap[:last]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fs := newFaultServer(t, sseAnswer(c.events, "framed"))
			e := retryEnv(t, []string{fs.url}, nil)
			for _, key := range []string{newKey("false-end"), ""} {
				got := e.fetch(req{key: key, body: c.body})
				if got.status != 200 || !got.aborted {
					t.Fatalf("key %q: got %d aborted %v (%q); want 200 and stream_aborted", key, got.status, got.aborted, got.raw)
				}
				if evs := stripIDs(got.raw, true); evs != c.want {
					t.Fatalf("key %q: events before the abort:\n%s\nwant:\n%s", key, evs, c.want)
				}
			}
		})
	}
}

// TestDrainAfterEndIsBounded: an upstream that keeps its body open after
// the terminal event, trickling comments, does not hold the generation
// (nor its -max-streams slot): the client has its whole answer, and the
// next request is served.
func TestDrainAfterEndIsBounded(t *testing.T) {
	// Not parallel: it times each request's end after [DONE] against a
	// second, which other tests' load would skew.
	fs := newFaultServer(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, chatChunk(0, "Hi", "stop")+"data: [DONE]\n\n")
		w.(http.Flusher).Flush()
		for range 100 { // 5 s of comments
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			fmt.Fprint(w, ": ping\n\n")
			w.(http.Flusher).Flush()
		}
	})
	e := retryEnv(t, []string{fs.url}, func(pc *Config) { pc.MaxStreams = 1 })
	for i := range 3 {
		start := time.Now()
		got := e.fetch(req{key: newKey("drain")})
		if !clean(got) {
			t.Fatalf("request %d: got %d %q; want a clean stream", i, got.status, got.errType)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("request %d took %v; want its end at once after [DONE]", i, d)
		}
		if !within(time.Second, func() bool { return e.proxy.streams.Load() == 0 }) {
			t.Fatalf("request %d: the -max-streams slot still taken a second after its end", i)
		}
	}
	wantCount(t, "upstream calls", fs.calls.Load(), 3)
}

// TestNonStreamingFraming: framing decides whether a non-streaming 2xx
// body is whole. A body with a Content-Length or chunked framing is
// stored only when the framing was met; one that ends where the
// connection closes only when it parses as the JSON its Content-Type
// says. Otherwise the client gets 502, nothing is stored, and a repeat
// is a new generation.
func TestNonStreamingFraming(t *testing.T) {
	t.Parallel()
	half := plainJSON[:len(plainJSON)/2]
	cases := []struct {
		name   string
		raw    string
		stored bool
	}{
		{"close-delimited, whole JSON", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + plainJSON, true},
		{"close-delimited, cut JSON", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + half, false},
		{"close-delimited, not JSON", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nhello there", false},
		{"shorter than Content-Length", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(plainJSON), half), false},
		{"chunked, last chunk missing", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(half), half), false},
		{"chunked, whole", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(plainJSON), plainJSON), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			u := newRawUpstream(t, answerRaw(c.raw))
			e := retryEnv(t, []string{u.url}, nil)
			key := newKey("framing")
			body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
			got := e.fetch(req{key: key, body: body})
			if c.stored {
				if got.status != 200 || string(got.raw) != plainJSON {
					t.Fatalf("got %d %q; want 200 and the whole body", got.status, got.raw)
				}
				e.waitState(key, "", cache.StateCommitted)
				again := e.fetch(req{key: key, body: body})
				if !again.replayed || string(again.raw) != plainJSON {
					t.Fatalf("repeat: got replayed %v %q; want the stored body", again.replayed, again.raw)
				}
				wantCount(t, "upstream calls", u.calls.Load(), 1)
				return
			}
			if got.status != http.StatusBadGateway || got.errType != "upstream_error" {
				t.Fatalf("got %d %q %q; want 502 upstream_error", got.status, got.errType, got.raw)
			}
			e.waitState(key, "", cache.StateFailedRetryable)
			again := e.fetch(req{key: key, body: body})
			if again.replayed {
				t.Fatalf("repeat was replayed; want a new generation")
			}
			wantCount(t, "upstream calls", u.calls.Load(), 2)
		})
	}
}

// TestStoredCompact: a committed stream is kept compressed: at most 0.35×
// its raw SSE bytes, for the mock's stream and for a recorded real one.
func TestStoredCompact(t *testing.T) {
	t.Parallel()
	recorded, err := os.ReadFile("../sse/testdata/openai-chat-text.sse")
	if err != nil {
		t.Fatal(err)
	}
	fs := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write(recorded)
	})
	for _, c := range []struct {
		name     string
		upstream string
	}{{"mock, 200 tokens", ""}, {"recorded OpenAI stream", fs.url}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var e *env
			if c.upstream == "" {
				e = newEnv(t, slowMock(0, 200))
			} else {
				e = newEnvUpstream(t, c.upstream, nil, Config{}, cache.Config{})
			}
			key := newKey("compact")
			got := e.fetch(req{key: key})
			ki := e.waitState(key, "", cache.StateCommitted)
			stored := e.store.Stats().StoredBytes
			ratio := float64(stored) / float64(len(got.raw))
			t.Logf("raw %d bytes, stored %d bytes: %.3f×", len(got.raw), stored, ratio)
			if !ki.BodyStored || ratio > 0.35 {
				t.Fatalf("stored %d of %d raw bytes (%.3f×); want at most 0.35×", stored, len(got.raw), ratio)
			}
			if again := e.fetch(req{key: key}); !again.replayed || string(again.raw) != string(got.raw) {
				t.Fatalf("the replay of the compressed body differs from the original")
			}
		})
	}
}

// TestEndAfterAmbiguousStaysUnknown: an upstream known to deduplicate
// (-retry-ambiguous) takes the request and hangs up, so the call may still
// be generating there; its pinned repeat then ends the flight otherwise
// than committed. Whatever that end (a stream cut after its first event,
// a 2xx error body, a 4xx, a body cut short), the first call's outcome is
// still unknown: the key ends commit_unknown, counted, and a whole answer
// carries the marker, so that no client or ssegate in front repeats it
// as one the upstream did not run.
func TestEndAfterAmbiguousStaysUnknown(t *testing.T) {
	t.Parallel()
	cut := func(w http.ResponseWriter) {
		w.(http.Flusher).Flush()
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
	}
	cases := []struct {
		name   string
		second func(w http.ResponseWriter)
		stream bool  // the second answer is a stream: its head went out before the end
		calls  int64 // upstream calls: a failure that is safe to repeat is repeated on the pinned upstream
	}{
		{"stream cut after its first event", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t\"},\"finish_reason\":null}]}\n\n")
			cut(w)
		}, true, 2},
		{"error after a preamble", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n")
			fmt.Fprint(w, "data: {\"object\":\"chat.completion.chunk\",\"error\":{\"type\":\"server_error\",\"message\":\"overloaded\"},\"choices\":[]}\n\n")
		}, false, 3},
		{"2xx error body", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"error":{"type":"server_error","message":"it broke"}}`)
		}, false, 2},
		{"4xx", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			fmt.Fprint(w, `{"error":{"type":"invalid_request","message":"no"}}`)
		}, false, 2},
		{"whole body cut short", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "1000")
			fmt.Fprint(w, `{"id":"chatcmpl-1",`)
			cut(w)
		}, false, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			up := newFaultServer(t, func(n int64, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					hangUp(n, w, r)
					return
				}
				c.second(w)
			})
			e := retryEnv(t, []string{up.url}, func(pc *Config) { pc.RetryAmbiguous = []string{up.url} })
			key := newKey("end-after-ambiguous")
			body := chatBody
			if !c.stream {
				body = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
			}
			r := e.fetch(req{key: key, body: body})
			wantCount(t, "upstream calls", up.calls.Load(), c.calls)
			if c.name == "error after a preamble" && r.status < 500 {
				// Relayed as a 200 stream, its head goes out before the end
				// can mark it: the answer must be the marked error instead.
				t.Fatalf("answer %d %q: want the outcome-unknown error answer", r.status, r.raw)
			}
			if !c.stream && r.header.Get(outcomeHeader) != "unknown" {
				t.Fatalf("answer %d %q: got %s %q; want unknown", r.status, r.raw, outcomeHeader, r.header.Get(outcomeHeader))
			}
			e.waitState(key, "", cache.StateCommitUnknown)
			var n float64
			if !within(5*time.Second, func() bool { n = metricValue(t, e.scrape(), "ssegate_commit_unknown_total"); return n == 1 }) {
				t.Fatalf("ssegate_commit_unknown_total: got %v; want 1", n)
			}
		})
	}
}

// TestOneWayToEnd: a generation's flight ends only through gen.fail and
// gen.commit, which decide its state (mayRun, the abort after the head)
// and count and log the end; no other code of the package ends a flight
// (Flight.Fail, Deny or Commit), but for the one flight that has no
// generation: a miss refused for -max-streams before any call.
func TestOneWayToEnd(t *testing.T) {
	t.Parallel()
	allowed := map[string]bool{"gen.fail": true, "gen.commit": true, "Proxy.claimSlot": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			where := fn.Name.Name
			if fn.Recv != nil {
				recv := fn.Recv.List[0].Type
				if st, ok := recv.(*ast.StarExpr); ok {
					recv = st.X
				}
				where = recv.(*ast.Ident).Name + "." + where
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && !allowed[where] {
					switch sel.Sel.Name {
					case "Fail", "Deny", "Commit":
						t.Errorf("%s: %s calls %s; a generation's flight ends through gen.fail and gen.commit only", fset.Position(call.Pos()), where, sel.Sel.Name)
					}
				}
				return true
			})
		}
	}
}
