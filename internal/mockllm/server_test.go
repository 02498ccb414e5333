package mockllm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/poll"
)

// start runs a Server on loopback for the test and closes it after.
func start(t testing.TB, cfg Config) (*Server, string) {
	t.Helper()
	s := New(cfg)
	url, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, url
}

// answer is a response read to its end (or to its first read error).
type answer struct {
	status  int
	header  http.Header
	body    []byte
	readErr error
}

// post sends body to base+path with the given headers ("Name: value").
func post(t testing.TB, base, path, body string, headers ...string) answer {
	t.Helper()
	return postWith(t, http.DefaultClient, base, path, body, headers...)
}

func postWith(t testing.TB, c *http.Client, base, path, body string, headers ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, rerr := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, readErr: rerr}
}

// event is one parsed SSE event.
type event struct {
	name string
	data string
	raw  string // the event's bytes, framing included
}

// parseEvents splits an SSE body into events.
func parseEvents(t testing.TB, body []byte) []event {
	t.Helper()
	var evs []event
	for len(body) > 0 {
		i := bytes.Index(body, []byte("\n\n"))
		if i < 0 {
			t.Fatalf("unterminated event %q", body)
		}
		raw := string(body[:i+2])
		body = body[i+2:]
		var ev event
		ev.raw = raw
		for _, line := range strings.Split(strings.TrimSuffix(raw, "\n\n"), "\n") {
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			default:
				t.Fatalf("unexpected line %q", line)
			}
		}
		if ev.data != "[DONE]" && !json.Valid([]byte(ev.data)) {
			t.Fatalf("event data is not JSON: %q", ev.data)
		}
		evs = append(evs, ev)
	}
	return evs
}

// decode unmarshals an event's or a body's JSON into a map.
func decode(t testing.TB, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	return m
}

// path walks m by keys and indexes, e.g. path(m, "choices", 0, "delta").
func path(m any, keys ...any) any {
	for _, k := range keys {
		switch k := k.(type) {
		case string:
			mm, ok := m.(map[string]any)
			if !ok {
				return nil
			}
			m = mm[k]
		case int:
			a, ok := m.([]any)
			if !ok || k >= len(a) {
				return nil
			}
			m = a[k]
		}
	}
	return m
}

const (
	chatStream      = `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	messagesStream  = `{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	responsesStream = `{"model":"gpt-4o-mini","stream":true,"input":"hi"}`
)

func TestChatStream(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{})
	a := post(t, url, "/v1/chat/completions", chatStream)
	if a.status != 200 {
		t.Fatalf("status: got %d; want 200", a.status)
	}
	if ct := a.header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type: got %q; want text/event-stream", ct)
	}
	evs := parseEvents(t, a.body)
	if got, want := len(evs), 16+3; got != want {
		t.Fatalf("events: got %d; want %d", got, want)
	}
	first := decode(t, evs[0].data)
	if got := path(first, "choices", 0, "delta", "role"); got != "assistant" {
		t.Errorf("first delta role: got %v; want assistant", got)
	}
	if got := path(first, "choices", 0, "delta", "content"); got != "" {
		t.Errorf("first delta content: got %v; want empty", got)
	}
	id := first["id"].(string)
	if !strings.HasPrefix(id, "chatcmpl-") || first["object"] != "chat.completion.chunk" || first["model"] != "gpt-4o-mini" {
		t.Errorf("first chunk: got %v", first)
	}
	for i, ev := range evs[1:17] {
		m := decode(t, ev.data)
		if m["id"] != id {
			t.Errorf("chunk %d id: got %v; want %v", i+1, m["id"], id)
		}
		if c, _ := path(m, "choices", 0, "delta", "content").(string); c == "" {
			t.Errorf("chunk %d: empty content", i+1)
		}
		if fr := path(m, "choices", 0, "finish_reason"); fr != nil {
			t.Errorf("chunk %d finish_reason: got %v; want null", i+1, fr)
		}
		if _, ok := m["usage"]; ok {
			t.Errorf("chunk %d has usage without include_usage", i+1)
		}
	}
	last := decode(t, evs[17].data)
	if got := path(last, "choices", 0, "finish_reason"); got != "stop" {
		t.Errorf("finish_reason: got %v; want stop", got)
	}
	if d, _ := path(last, "choices", 0, "delta").(map[string]any); len(d) != 0 {
		t.Errorf("last delta: got %v; want {}", d)
	}
	if evs[18].data != "[DONE]" {
		t.Errorf("terminal: got %q; want [DONE]", evs[18].data)
	}
}

func TestChatIncludeUsage(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{Tokens: 5})
	a := post(t, url, "/v1/chat/completions", `{"stream":true,"stream_options":{"include_usage":true},"messages":[]}`)
	evs := parseEvents(t, a.body)
	if got, want := len(evs), 5+4; got != want {
		t.Fatalf("events: got %d; want %d", got, want)
	}
	for i, ev := range evs[:7] {
		if m := decode(t, ev.data); m["usage"] != nil || !hasKey(m, "usage") {
			t.Errorf("chunk %d: got usage %v; want null", i, m["usage"])
		}
	}
	u := decode(t, evs[7].data)
	if c, ok := u["choices"].([]any); !ok || len(c) != 0 {
		t.Errorf("usage chunk choices: got %v; want []", u["choices"])
	}
	if got := path(u, "usage", "completion_tokens"); got != 5.0 {
		t.Errorf("completion_tokens: got %v; want 5", got)
	}
	p, _ := path(u, "usage", "prompt_tokens").(float64)
	if tot := path(u, "usage", "total_tokens"); p < 1 || tot != p+5 {
		t.Errorf("usage: got %v", u["usage"])
	}
	if evs[8].data != "[DONE]" {
		t.Errorf("terminal: got %q; want [DONE]", evs[8].data)
	}
}

func hasKey(m map[string]any, k string) bool { _, ok := m[k]; return ok }

func TestChatMaxTokens(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{})
	tests := []struct {
		name   string
		body   string
		tokens int
		reason string
	}{
		{"cut", `{"stream":true,"max_tokens":4}`, 4, "length"},
		{"max_completion_tokens", `{"stream":true,"max_completion_tokens":3,"max_tokens":100}`, 3, "length"},
		{"not cut", `{"stream":true,"max_tokens":16}`, 16, "stop"},
		{"above", `{"stream":true,"max_tokens":100}`, 16, "stop"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs := parseEvents(t, post(t, url, "/v1/chat/completions", tt.body).body)
			if got, want := len(evs), tt.tokens+3; got != want {
				t.Fatalf("events: got %d; want %d", got, want)
			}
			fin := decode(t, evs[len(evs)-2].data)
			if got := path(fin, "choices", 0, "finish_reason"); got != tt.reason {
				t.Errorf("finish_reason: got %v; want %s", got, tt.reason)
			}
		})
	}
	t.Run("non-streaming", func(t *testing.T) {
		m := decode(t, string(post(t, url, "/v1/chat/completions", `{"max_tokens":2}`).body))
		if got := path(m, "choices", 0, "finish_reason"); got != "length" {
			t.Errorf("finish_reason: got %v; want length", got)
		}
		if got := path(m, "usage", "completion_tokens"); got != 2.0 {
			t.Errorf("completion_tokens: got %v; want 2", got)
		}
	})
}

func TestChatNonStreaming(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{Tokens: 7})
	a := post(t, url, "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	if a.status != 200 || a.header.Get("Content-Type") != "application/json" {
		t.Fatalf("got %d %q; want 200 application/json", a.status, a.header.Get("Content-Type"))
	}
	m := decode(t, string(a.body))
	if m["object"] != "chat.completion" || m["model"] != "gpt-4o" || !strings.HasPrefix(m["id"].(string), "chatcmpl-") {
		t.Errorf("body: got %s", a.body)
	}
	if c, _ := path(m, "choices", 0, "message", "content").(string); c == "" || c[0] == ' ' {
		t.Errorf("content: got %q", c)
	}
	if got := path(m, "choices", 0, "finish_reason"); got != "stop" {
		t.Errorf("finish_reason: got %v; want stop", got)
	}
	if got := path(m, "usage", "completion_tokens"); got != 7.0 {
		t.Errorf("completion_tokens: got %v; want 7", got)
	}
}

// TestStreamMatchesContent checks that a stream's deltas add up to the text
// its own closing events report.
func TestStreamMatchesContent(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{})
	evs := parseEvents(t, post(t, url, "/v1/responses", responsesStream).body)
	var text strings.Builder
	for _, ev := range evs {
		if ev.name == "response.output_text.delta" {
			text.WriteString(decode(t, ev.data)["delta"].(string))
		}
	}
	done := decode(t, evs[len(evs)-5+1].data) // output_text.done
	if done["text"] != text.String() {
		t.Errorf("output_text.done: got %q; want %q", done["text"], text.String())
	}
	final := decode(t, evs[len(evs)-1].data)
	if got := path(final, "response", "output", 0, "content", 0, "text"); got != text.String() {
		t.Errorf("completed text: got %q; want %q", got, text.String())
	}
}

func TestMessagesStream(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{Tokens: 4})
	a := post(t, url, "/v1/messages", messagesStream)
	if a.status != 200 || a.header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("got %d %q; want 200 text/event-stream", a.status, a.header.Get("Content-Type"))
	}
	evs := parseEvents(t, a.body)
	want := []string{"message_start", "content_block_start", "ping",
		"content_block_delta", "content_block_delta", "content_block_delta", "content_block_delta",
		"content_block_stop", "message_delta", "message_stop"}
	if got := names(evs); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("events: got %v; want %v", got, want)
	}
	for _, ev := range evs {
		if m := decode(t, ev.data); m["type"] != ev.name {
			t.Errorf("event %s: data type %v", ev.name, m["type"])
		}
	}
	start := decode(t, evs[0].data)
	if id, _ := path(start, "message", "id").(string); !strings.HasPrefix(id, "msg_") {
		t.Errorf("message id: got %q", id)
	}
	if got := path(decode(t, evs[3].data), "delta", "type"); got != "text_delta" {
		t.Errorf("delta type: got %v; want text_delta", got)
	}
	md := decode(t, evs[8].data)
	if got := path(md, "delta", "stop_reason"); got != "end_turn" {
		t.Errorf("stop_reason: got %v; want end_turn", got)
	}
	if got := path(md, "usage", "output_tokens"); got != 4.0 {
		t.Errorf("output_tokens: got %v; want 4", got)
	}

	t.Run("max_tokens", func(t *testing.T) {
		evs := parseEvents(t, post(t, url, "/v1/messages", `{"max_tokens":2,"stream":true}`).body)
		md := decode(t, evs[len(evs)-2].data)
		if got := path(md, "delta", "stop_reason"); got != "max_tokens" {
			t.Errorf("stop_reason: got %v; want max_tokens", got)
		}
		if got := path(md, "usage", "output_tokens"); got != 2.0 {
			t.Errorf("output_tokens: got %v; want 2", got)
		}
	})
	t.Run("non-streaming", func(t *testing.T) {
		m := decode(t, string(post(t, url, "/v1/messages", `{"max_tokens":1024,"messages":[]}`).body))
		if m["type"] != "message" || m["role"] != "assistant" || m["stop_reason"] != "end_turn" {
			t.Errorf("body: got %v", m)
		}
		if txt, _ := path(m, "content", 0, "text").(string); txt == "" {
			t.Errorf("text: empty")
		}
		if got := path(m, "usage", "output_tokens"); got != 4.0 {
			t.Errorf("output_tokens: got %v; want 4", got)
		}
	})
}

func names(evs []event) []string {
	var n []string
	for _, ev := range evs {
		n = append(n, ev.name)
	}
	return n
}

func TestResponsesStream(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{Tokens: 3})
	a := post(t, url, "/v1/responses", responsesStream)
	evs := parseEvents(t, a.body)
	want := []string{"response.created", "response.in_progress", "response.output_item.added",
		"response.content_part.added", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.delta", "response.output_text.done", "response.content_part.done",
		"response.output_item.done", "response.completed"}
	if got := names(evs); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("events: got %v; want %v", got, want)
	}
	for i, ev := range evs {
		m := decode(t, ev.data)
		if m["type"] != ev.name {
			t.Errorf("event %d: type %v; want %s", i, m["type"], ev.name)
		}
		if m["sequence_number"] != float64(i) {
			t.Errorf("event %d: sequence_number %v; want %d", i, m["sequence_number"], i)
		}
	}
	final := decode(t, evs[10].data)
	if got := path(final, "response", "status"); got != "completed" {
		t.Errorf("status: got %v; want completed", got)
	}
	if got := path(final, "response", "usage", "output_tokens"); got != 3.0 {
		t.Errorf("output_tokens: got %v; want 3", got)
	}
	if bytes.Contains(a.body, []byte("[DONE]")) {
		t.Error("Responses stream has [DONE]")
	}

	t.Run("max_output_tokens", func(t *testing.T) {
		evs := parseEvents(t, post(t, url, "/v1/responses", `{"stream":true,"max_output_tokens":2}`).body)
		final := decode(t, evs[len(evs)-1].data)
		if evs[len(evs)-1].name != "response.incomplete" || path(final, "response", "incomplete_details", "reason") != "max_output_tokens" {
			t.Errorf("final event: got %s", evs[len(evs)-1].raw)
		}
	})
	t.Run("non-streaming", func(t *testing.T) {
		m := decode(t, string(post(t, url, "/v1/responses", `{"input":"hi"}`).body))
		if m["object"] != "response" || m["status"] != "completed" {
			t.Errorf("body: got %v", m)
		}
		if txt, _ := path(m, "output", 0, "content", 0, "text").(string); txt == "" {
			t.Error("text: empty")
		}
	})
}

func TestDeterminism(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{})
	for _, tt := range []struct{ path, body, other string }{
		{"/v1/chat/completions", chatStream, strings.Replace(chatStream, "hi", "hello", 1)},
		{"/v1/chat/completions", `{"messages":[]}`, `{"messages":[ ]}`},
		{"/v1/messages", messagesStream, strings.Replace(messagesStream, "hi", "hello", 1)},
		{"/v1/responses", responsesStream, strings.Replace(responsesStream, "hi", "hello", 1)},
	} {
		t.Run(tt.path, func(t *testing.T) {
			a := post(t, url, tt.path, tt.body).body
			b := post(t, url, tt.path, tt.body).body
			if !bytes.Equal(a, b) {
				t.Errorf("same body, different output:\n%s\n%s", a, b)
			}
			c := post(t, url, tt.path, tt.other).body
			if bytes.Equal(a, c) {
				t.Error("different bodies, same output")
			}
		})
	}
}

func TestChunkSize(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{Tokens: 200})
	t.Run("default", func(t *testing.T) {
		evs := parseEvents(t, post(t, url, "/v1/chat/completions", chatStream).body)
		for i, ev := range evs[1:201] {
			if n := len(ev.raw); n < 150 || n > 250 {
				t.Errorf("chunk %d: got %d bytes; want 150..250", i+1, n)
			}
		}
	})
	for _, p := range []string{"/v1/chat/completions", "/v1/messages", "/v1/responses"} {
		t.Run("padded"+p, func(t *testing.T) {
			evs := parseEvents(t, post(t, url, p, `{"stream":true}`, "X-Mock-Chunk-Bytes: 1024").body)
			n := 0
			for _, ev := range evs {
				if ev.name == "content_block_delta" || ev.name == "response.output_text.delta" ||
					(ev.name == "" && strings.Contains(ev.data, `"content":"`) && !strings.Contains(ev.data, `"role"`)) {
					n++
					if l := len(ev.raw); l < 1000 || l > 1050 {
						t.Errorf("event: got %d bytes; want about 1024", l)
					}
				}
			}
			if n != 200 {
				t.Errorf("content events: got %d; want 200", n)
			}
		})
	}
}

func TestOverrides(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{})
	evs := parseEvents(t, post(t, url, "/v1/chat/completions", chatStream, "X-Mock-Tokens: 40").body)
	if len(evs) != 43 {
		t.Errorf("X-Mock-Tokens 40: got %d events; want 43", len(evs))
	}
	began := time.Now()
	post(t, url, "/v1/chat/completions", chatStream, "X-Mock-Tokens: 2", "X-Mock-Delay: 20ms")
	if d := time.Since(began); d < 100*time.Millisecond {
		t.Errorf("X-Mock-Delay 20ms, 5 events: took %v; want >= 100ms", d)
	}
}

func TestInvalidOverride(t *testing.T) {
	t.Parallel()
	s, url := start(t, Config{})
	for _, h := range []string{
		"X-Mock-Tokens: 0", "X-Mock-Tokens: 100001", "X-Mock-Tokens: x",
		"X-Mock-Delay: 11s", "X-Mock-Delay: -1ms", "X-Mock-Delay: soon",
		"X-Mock-Chunk-Bytes: -1", "X-Mock-Chunk-Bytes: 2000000",
		"X-Mock-Fault: status=200", "X-Mock-Fault: status=abc", "X-Mock-Fault: explode",
		"X-Mock-Fault: reset-after=-1", "X-Mock-Fault: hang=1", "X-Mock-Fault: eof-after",
	} {
		t.Run(h, func(t *testing.T) {
			a := post(t, url, "/v1/chat/completions", chatStream, h)
			if a.status != 400 {
				t.Fatalf("status: got %d; want 400", a.status)
			}
			m := decode(t, string(a.body))
			if path(m, "error", "type") != "invalid_request_error" {
				t.Errorf("body: got %s", a.body)
			}
		})
	}
	a := post(t, url, "/v1/messages", messagesStream, "X-Mock-Tokens: 0")
	if m := decode(t, string(a.body)); a.status != 400 || m["type"] != "error" || path(m, "error", "type") != "invalid_request_error" {
		t.Errorf("messages: got %d %s", a.status, a.body)
	}
	a = post(t, url, "/v1/chat/completions", `{"stream":tru`)
	if a.status != 400 {
		t.Errorf("malformed body: got %d; want 400", a.status)
	}
	if got := s.Calls(); got != 16 {
		t.Errorf("Calls: got %d; want 16 (400s count)", got)
	}
}

func TestRoutes(t *testing.T) {
	t.Parallel()
	s, url := start(t, Config{})
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if m := decode(t, string(b)); resp.StatusCode != 200 || m["object"] != "list" || len(m["data"].([]any)) == 0 {
		t.Errorf("models: got %d %s", resp.StatusCode, b)
	}
	a := post(t, url, "/v2/nothing", "{}")
	if m := decode(t, string(a.body)); a.status != 404 || path(m, "error", "type") != "not_found" {
		t.Errorf("unknown path: got %d %s", a.status, a.body)
	}
	resp, err = http.Get(url + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("GET chat: got %d; want 405", resp.StatusCode)
	}
	if got := s.Calls(); got != 0 {
		t.Errorf("Calls: got %d; want 0", got)
	}
}

func TestCalls(t *testing.T) {
	t.Parallel()
	s, url := start(t, Config{Tokens: 2})
	post(t, url, "/v1/chat/completions", chatStream)
	post(t, url, "/v1/chat/completions", `{}`)
	post(t, url, "/v1/messages", messagesStream)
	post(t, url, "/v1/responses", responsesStream, "X-Mock-Fault: status=503")
	post(t, url, "/v1/responses", responsesStream, "X-Mock-Fault: eof-after=1")
	post(t, url, "/v1/models", "")
	if got := s.Calls(); got != 5 {
		t.Errorf("Calls: got %d; want 5", got)
	}
	s.ResetCalls()
	if got := s.Calls(); got != 0 {
		t.Errorf("Calls after ResetCalls: got %d; want 0", got)
	}
	post(t, url, "/v1/chat/completions", chatStream)
	if got := s.Calls(); got != 1 {
		t.Errorf("Calls: got %d; want 1", got)
	}
}

// readEvents reads SSE events from r until it ends or fails, returning the
// events read and the error that ended reading (nil at a clean EOF).
func readEvents(r io.Reader) (evs []string, err error) {
	br := bufio.NewReader(r)
	var cur strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				return evs, nil
			}
			return evs, err
		}
		if line == "\n" {
			evs = append(evs, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteString(line)
	}
}

func TestCloseEndsStreams(t *testing.T) {
	t.Parallel()
	s := New(Config{Delay: 10 * time.Millisecond, Tokens: 10000})
	url, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		evs []string
		err error
	}
	got := make(chan result, 3)
	for _, p := range []string{"/v1/chat/completions", "/v1/messages"} {
		resp, err := http.Post(url+p, "application/json", strings.NewReader(`{"stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer resp.Body.Close()
			evs, err := readEvents(resp.Body)
			got <- result{evs, err}
		}()
	}
	go func() { // a hang, which has sent nothing
		resp, err := http.Post(url+"/v1/responses", "application/json", strings.NewReader(`{"stream":true}`))
		if err == nil {
			resp.Body.Close()
		}
		got <- result{err: err}
	}()
	waitActive(t, s, 3, 5*time.Second) // both streams and the hang have started
	began := time.Now()
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("Close took %v", d)
	}
	for range 3 {
		select {
		case r := <-got:
			if n := len(r.evs); n > 0 && (strings.Contains(r.evs[n-1], "[DONE]") || strings.Contains(r.evs[n-1], "message_stop")) {
				t.Errorf("stream cut by Close ended with its terminal event")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a client still waits after Close")
		}
	}
	if _, err := s.Start("127.0.0.1:0"); !errors.Is(err, ErrClosed) {
		t.Errorf("Start after Close: got %v; want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestClientDisconnect(t *testing.T) {
	t.Parallel()
	s, url := start(t, Config{Tokens: 100000, Delay: time.Millisecond})
	for _, fault := range []string{"", "hang", "hang-after=2"} {
		t.Run("fault="+fault, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatStream))
			if fault != "" {
				req.Header.Set("X-Mock-Fault", fault)
			}
			go func() { // the client leaves once its stream is being written
				poll.Until(2*time.Second, func() bool { return s.Active() == 1 })
				cancel()
			}()
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			waitActive(t, s, 0, 2*time.Second) // its client left
		})
	}
}

// waitActive polls until s writes n streams (and stalls), and fails the
// test if it does not within d.
func waitActive(t *testing.T, s *Server, n int64, d time.Duration) {
	t.Helper()
	if !poll.Until(d, func() bool { return s.Active() == n }) {
		t.Fatalf("streams being written: got %d after %v; want %d", s.Active(), d, n)
	}
}
