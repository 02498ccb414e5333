package proxy

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
)

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

// TestFalseEndNotRelayed: a terminal event that claims a whole answer when
// the stream is not ([DONE] with a choice unfinished, or missing; Anthropic
// message_stop without a stop_reason) is not relayed: a client that stops
// reading at it would take a half stream for a whole one. The client gets
// stream_aborted in its place.
func TestFalseEndNotRelayed(t *testing.T) {
	cases := []struct{ name, body, events, want string }{
		{"[DONE] with the finish_reason missing", chatBody, chatChunk(0, "Hi", "") + "data: [DONE]\n\n", chatChunk(0, "Hi", "")},
		{"[DONE] with a choice of n missing", `{"model":"m","stream":true,"n":2,"messages":[]}`, chatChunk(0, "Hi", "stop") + "data: [DONE]\n\n", chatChunk(0, "Hi", "stop")},
		{"message_stop without stop_reason", chatBody,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
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
