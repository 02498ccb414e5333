package sse

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// judge runs body through Read and a Detector, as the proxy does.
func judge(tb testing.TB, body string, e Expect) *Detector {
	tb.Helper()
	d := NewDetector(e)
	for _, ev := range readAll(tb, body, 0) {
		d.Observe(ev)
	}
	return d
}

// replace is strings.Replace that fails the test when old is not in s, so a
// derived case cannot silently stop testing what it says.
func replace(tb testing.TB, s, old, new string, n int) string {
	tb.Helper()
	if !strings.Contains(s, old) {
		tb.Fatalf("fixture: got no %q; want it present", old)
	}
	return strings.Replace(s, old, new, n)
}

// insertBefore puts block before the last n raw events of body.
func insertBefore(body string, n int, block string) string {
	bs := blocks(body)
	i := len(bs) - n
	return strings.Join(bs[:i], "") + block + strings.Join(bs[i:], "")
}

// drop removes the raw events of body for which match is true.
func drop(body string, match func(string) bool) string {
	var sb strings.Builder
	for _, b := range blocks(body) {
		if !match(b) {
			sb.WriteString(b)
		}
	}
	return sb.String()
}

func TestDetector(t *testing.T) {
	t.Parallel()
	chat := fixture(t, "openai-chat-text")
	usage := fixture(t, "openai-chat-usage")
	resp := fixture(t, "openai-responses-completed")
	anth := fixture(t, "anthropic-messages-text")
	groq := fixture(t, "groq-chat-error-midstream")
	failed := fixture(t, "openai-responses-error-failed")

	const chatChunk = `data: {"object":"chat.completion.chunk","choices":[{"index":%d,"delta":{"content":"x"},"finish_reason":%s}]}` + "\n\n"
	chunk := func(idx int, fin string) string {
		return strings.Replace(strings.Replace(chatChunk, "%d", string(rune('0'+idx)), 1), "%s", fin, 1)
	}
	const done = "data: [DONE]\n\n"
	wantUsage, two := Expect{Usage: true}, Expect{N: 2}

	tests := []struct {
		name     string
		body     string
		expect   Expect
		dialect  Dialect
		terminal bool
		ok       bool
		reason   string
	}{
		// The recorded streams.
		{"chat text", chat, Expect{}, DialectOpenAIChat, true, true, ""},
		{"chat usage", usage, wantUsage, DialectOpenAIChat, true, true, ""},
		{"responses completed", resp, Expect{}, DialectOpenAIResponses, true, true, ""},
		{"anthropic text", anth, Expect{}, DialectAnthropic, true, true, ""},
		{"groq error midstream", groq, Expect{}, DialectOpenAIChat, true, false, "error_event"},
		{"groq error midstream, usage wanted", groq, wantUsage, DialectOpenAIChat, true, false, "error_event"},
		// An event cut inside its JSON ends the stream, unclean, even when
		// the rest of it would be whole.
		{"chat, event cut inside its JSON", chunk(0, "null") + `data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tru` + "\n\n" + chunk(0, `"stop"`) + done,
			Expect{}, DialectOpenAIChat, true, false, "malformed_event"},
		{"chat, data not JSON", chunk(0, "null") + "data: hello\n\n" + chunk(0, `"stop"`) + done, Expect{}, DialectOpenAIChat, true, false, "malformed_event"},
		{"anthropic, event cut inside its JSON", "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_del\n\n",
			Expect{}, DialectAnthropic, true, false, "malformed_event"},
		{"no known dialect: plain text events mean nothing", "data: hello\n\ndata: world\n\n", Expect{}, DialectUnknown, false, false, "no_terminal_event"},

		// Truncated: the last event dropped, or cut before its blank line
		// (go-sse discards it silently, so the Detector must notice).
		{"chat truncated before [DONE]", strings.TrimSuffix(chat, done), Expect{}, DialectOpenAIChat, false, false, "no_terminal_event"},
		{"chat [DONE] without blank line", strings.TrimSuffix(chat, "\n"), Expect{}, DialectOpenAIChat, false, false, "no_terminal_event"},
		{"chat usage truncated before usage", drop(usage, func(b string) bool { return !strings.Contains(b, `"usage":null`) }), wantUsage, DialectOpenAIChat, false, false, "no_terminal_event"},
		{"responses truncated before completed", drop(resp, func(b string) bool { return strings.Contains(b, "response.completed") }), Expect{}, DialectOpenAIResponses, false, false, "no_terminal_event"},
		{"responses completed cut short", resp[:len(resp)-30], Expect{}, DialectOpenAIResponses, false, false, "no_terminal_event"},
		{"anthropic truncated before message_stop", drop(anth, func(b string) bool { return strings.Contains(b, "message_stop") }), Expect{}, DialectAnthropic, false, false, "no_terminal_event"},
		{"anthropic message_stop without blank line", strings.TrimSuffix(anth, "\n"), Expect{}, DialectAnthropic, false, false, "no_terminal_event"},

		// Chat rules.
		{"chat [DONE] after error object", insertBefore(chat, 1, `data: {"error":{"message":"boom","type":"server_error"}}`+"\n\n"), Expect{}, DialectOpenAIChat, true, false, "error_event"},
		{"chat [DONE] after event error", insertBefore(chat, 1, "event: error\ndata: {\"message\":\"boom\"}\n\n"), Expect{}, DialectOpenAIChat, true, false, "error_event"},
		{"chat error after [DONE] is past the end", chat + `data: {"error":{"message":"late"}}` + "\n\n", Expect{}, DialectOpenAIChat, true, true, ""},
		{"chat error object, then a null duplicate", insertBefore(chat, 1, `data: {"error":{"message":"boom"},"error":null}`+"\n\n"), Expect{}, DialectOpenAIChat, true, false, "error_event"},
		{"chat type error, then another type", insertBefore(chat, 1, `data: {"type":"error","type":"x","message":"boom"}`+"\n\n"), Expect{}, DialectOpenAIChat, true, false, "error_event"},
		{"chat null error is no error", replace(t, chat, `"system_fingerprint":null,`, `"system_fingerprint":null,"error":null,`, -1), Expect{}, DialectOpenAIChat, true, true, ""},
		{"chat usage requested but missing", chat, wantUsage, DialectOpenAIChat, true, false, "missing_usage"},
		{"chat usage requested, usage null", replace(t, usage, `"choices":[],"usage":{`, `"choices":[],"usage":null,"x":{`, 1), wantUsage, DialectOpenAIChat, true, false, "missing_usage"},
		{"chat missing finish_reason", replace(t, chat, `"finish_reason":"stop"`, `"finish_reason":null`, 1), Expect{}, DialectOpenAIChat, true, false, "missing_finish_reason"},
		{"chat empty finish_reason", replace(t, chat, `"finish_reason":"stop"`, `"finish_reason":""`, 1), Expect{}, DialectOpenAIChat, true, false, "missing_finish_reason"},
		{"chat length is clean", replace(t, chat, `"finish_reason":"stop"`, `"finish_reason":"length"`, 1), Expect{}, DialectOpenAIChat, true, true, ""},
		{"chat content_filter is clean", replace(t, chat, `"finish_reason":"stop"`, `"finish_reason":"content_filter"`, 1), Expect{}, DialectOpenAIChat, true, true, ""},
		{"chat without object field", strings.ReplaceAll(chat, `"object":"chat.completion.chunk",`, ""), Expect{}, DialectOpenAIChat, true, true, ""},
		{"chat without object field, unfinished", strings.ReplaceAll(replace(t, chat, `"finish_reason":"stop"`, `"finish_reason":null`, 1), `"object":"chat.completion.chunk",`, ""), Expect{}, DialectOpenAIChat, true, false, "missing_finish_reason"},
		{"chat only [DONE]", done, Expect{}, DialectOpenAIChat, true, false, "no_choices"},
		{"two choices, one finished", chunk(0, "null") + chunk(1, "null") + chunk(0, `"stop"`) + done, two, DialectOpenAIChat, true, false, "missing_finish_reason"},
		{"two choices, both finished", chunk(0, "null") + chunk(1, "null") + chunk(1, `"tool_calls"`) + chunk(0, `"stop"`) + done, two, DialectOpenAIChat, true, true, ""},
		{"two choices, one not asked for", chunk(0, "null") + chunk(1, "null") + chunk(1, `"tool_calls"`) + chunk(0, `"stop"`) + done, Expect{}, DialectOpenAIChat, true, false, "unexpected_choice"},
		{"finish is sticky", chunk(0, "null") + chunk(0, `"stop"`) + chunk(0, "null") + done, Expect{}, DialectOpenAIChat, true, true, ""},
		{"wide choice index not asked for", chunk(0, `"stop"`) + `data: {"object":"chat.completion.chunk","choices":[{"index":100,"finish_reason":"stop"}]}` + "\n\n" + done, Expect{}, DialectOpenAIChat, true, false, "unexpected_choice"},
		{"wide choice index, others missing", chunk(0, `"stop"`) + `data: {"object":"chat.completion.chunk","choices":[{"index":100,"finish_reason":"stop"}]}` + "\n\n" + done, Expect{N: 101}, DialectOpenAIChat, true, false, "missing_choice"},
		{"legacy completions", `data: {"object":"text_completion","choices":[{"text":"hi","index":0,"finish_reason":null}]}` + "\n\n" + `data: {"object":"text_completion","choices":[{"text":"","index":0,"finish_reason":"length"}]}` + "\n\n" + done, Expect{}, DialectOpenAIChat, true, true, ""},

		// Responses rules.
		{"responses sequence gap", drop(resp, func(b string) bool { return strings.Contains(b, `"sequence_number":5}`) }), Expect{}, DialectOpenAIResponses, true, false, "sequence_gap"},
		{"responses sequence repeated", insertBefore(resp, 1, blocks(resp)[3]), Expect{}, DialectOpenAIResponses, true, false, "sequence_gap"},
		{"responses failed", strings.ReplaceAll(resp, "response.completed", "response.failed"), Expect{}, DialectOpenAIResponses, true, false, "response_failed"},
		{"responses failed, data type only", replace(t, resp, `"type":"response.completed"`, `"type":"response.failed"`, 1), Expect{}, DialectOpenAIResponses, true, false, "response_failed"},
		{"responses incomplete is clean", strings.ReplaceAll(resp, "response.completed", "response.incomplete"), Expect{}, DialectOpenAIResponses, true, true, ""},
		{"responses incomplete with a sequence gap", strings.ReplaceAll(drop(resp, func(b string) bool { return strings.Contains(b, `"sequence_number":5}`) }), "response.completed", "response.incomplete"), Expect{}, DialectOpenAIResponses, true, false, "sequence_gap"},
		{"responses error event, then failed", failed, Expect{}, DialectOpenAIResponses, true, false, "error_event"},
		{"responses error event, not yet failed", drop(failed, func(b string) bool { return strings.Contains(b, "response.failed") }), Expect{}, DialectOpenAIResponses, false, false, "error_event"},
		{"responses error event", insertBefore(replace(t, resp, `"sequence_number":14}`, `"sequence_number":15}`, 1), 1, "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"x\",\"param\":null,\"sequence_number\":14}\n\n"), Expect{}, DialectOpenAIResponses, true, false, "error_event"},
		{"responses [DONE] after completed tolerated", resp + done, Expect{}, DialectOpenAIResponses, true, true, ""},
		{"responses error after completed is past the end", resp + "event: error\ndata: {\"type\":\"error\",\"sequence_number\":15}\n\n", Expect{}, DialectOpenAIResponses, true, true, ""},

		// Anthropic rules.
		{"anthropic error then message_stop", insertBefore(anth, 1, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"), Expect{}, DialectAnthropic, true, false, "error_event"},
		{"anthropic error data type only", insertBefore(anth, 1, "data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n"), Expect{}, DialectAnthropic, true, false, "error_event"},
		{"anthropic missing stop_reason", replace(t, anth, `"stop_reason":"end_turn"`, `"stop_reason":null`, 1), Expect{}, DialectAnthropic, true, false, "missing_stop_reason"},
		{"anthropic no message_delta", drop(anth, func(b string) bool { return strings.Contains(b, "message_delta") }), Expect{}, DialectAnthropic, true, false, "missing_stop_reason"},
		{"anthropic unknown events and pings tolerated", insertBefore(anth, 2, "event: ping\ndata: {\"type\":\"ping\"}\n\nevent: future_thing\ndata: {\"type\":\"future_thing\"}\n\n"), Expect{}, DialectAnthropic, true, true, ""},
		{"anthropic usage wanted is ignored", anth, wantUsage, DialectAnthropic, true, true, ""},

		// No dialect.
		{"empty", "", Expect{}, DialectUnknown, false, false, "no_terminal_event"},
		{"plain text", "data: hello\n\n", Expect{}, DialectUnknown, false, false, "no_terminal_event"},
		{"error before anything", "event: error\ndata: {\"error\":{\"message\":\"overloaded\"}}\n\n", Expect{}, DialectUnknown, true, false, "error_event"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := judge(t, tt.body, tt.expect)
			if got := d.Dialect(); got != tt.dialect {
				t.Errorf("Dialect: got %v; want %v", got, tt.dialect)
			}
			if got := d.Terminal(); got != tt.terminal {
				t.Errorf("Terminal: got %v; want %v", got, tt.terminal)
			}
			ok, reason := d.Clean(false)
			if ok != tt.ok || reason != tt.reason {
				t.Errorf("Clean: got %v, %q; want %v, %q", ok, reason, tt.ok, tt.reason)
			}
		})
	}
}

func TestDetectorUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		in, out       int64
		ok            bool
		wantUsageFlag bool
	}{
		{"openai-chat-text", 0, 0, false, false},
		{"openai-chat-usage", 14, 8, true, true},
		{"openai-responses-completed", 27, 8, true, false},
		{"anthropic-messages-text", 20, 5, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, out, ok := judge(t, fixture(t, tt.name), Expect{Usage: tt.wantUsageFlag}).Usage()
			if in != tt.in || out != tt.out || ok != tt.ok {
				t.Errorf("got %d, %d, %v; want %d, %d, %v", in, out, ok, tt.in, tt.out, tt.ok)
			}
		})
	}
}

func TestDetectorReset(t *testing.T) {
	t.Parallel()
	d := judge(t, fixture(t, "groq-chat-error-midstream"), Expect{N: 3})
	d.Reset(Expect{})
	for _, ev := range readAll(t, fixture(t, "anthropic-messages-text"), 0) {
		d.Observe(ev)
	}
	if ok, reason := d.Clean(false); !ok {
		t.Errorf("after Reset: got not clean (%s); want clean", reason)
	}
	d.Reset(Expect{Usage: true})
	for _, ev := range readAll(t, fixture(t, "openai-chat-text"), 0) {
		d.Observe(ev)
	}
	if ok, reason := d.Clean(false); ok || reason != "missing_usage" {
		t.Errorf("after Reset(Usage): got %v, %q; want false, missing_usage", ok, reason)
	}
	d.Reset(Expect{N: 2})
	for _, ev := range readAll(t, fixture(t, "openai-chat-text"), 0) {
		d.Observe(ev)
	}
	if ok, reason := d.Clean(false); ok || reason != "missing_choice" {
		t.Errorf("after Reset(N: 2): got %v, %q; want false, missing_choice", ok, reason)
	}
}

// BenchmarkDetectorObserve feeds one chat chunk again and again, as the
// middle of a long stream; BenchmarkObserve runs whole recorded streams.
func BenchmarkDetectorObserve(b *testing.B) {
	chunk := Event{Data: `{"id":"chatcmpl-B74aE2TDl9ZbKx2fXoVatoMDnErNm","object":"chat.completion.chunk","created":1741025614,"model":"gpt-3.5-turbo-0125","choices":[{"index":0,"delta":{"content":" joke"},"logprobs":null,"finish_reason":null}]}`}
	b.Run("chat", func(b *testing.B) {
		d := NewDetector(Expect{Usage: true})
		b.SetBytes(int64(len(chunk.Data)))
		b.ReportAllocs()
		for b.Loop() {
			d.Observe(chunk)
		}
	})
}

// choiceChunk is a chat chunk carrying one choice; fin is its raw
// finish_reason.
func choiceChunk(idx int, fin string) string {
	return `data: {"object":"chat.completion.chunk","choices":[{"index":` + strconv.Itoa(idx) + `,"delta":{"content":"x"},"finish_reason":` + fin + `}]}` + "\n\n"
}

// finishAll is a chat body in which choices 0..n-1 each appear and finish.
func finishAll(n int) string {
	var sb strings.Builder
	for i := range n {
		sb.WriteString(choiceChunk(i, "null"))
	}
	for i := n - 1; i >= 0; i-- {
		sb.WriteString(choiceChunk(i, `"stop"`))
	}
	return sb.String()
}

// TestDetectorChoices: a chat stream is clean only when every choice
// 0..n-1 of the request appeared and finished, and no other one did.
func TestDetectorChoices(t *testing.T) {
	t.Parallel()
	chat := fixture(t, "openai-chat-text")
	usage := fixture(t, "openai-chat-usage")
	const done = "data: [DONE]\n\n"
	tests := []struct {
		name   string
		body   string
		expect Expect
		ok     bool
		reason string
	}{
		{"recorded, n=1", chat, Expect{N: 1}, true, ""},
		{"recorded, n absent", chat, Expect{}, true, ""},
		{"recorded, n=2: choice 1 never came", chat, Expect{N: 2}, false, "missing_choice"},
		{"recorded usage, n=2", usage, Expect{N: 2, Usage: true}, false, "missing_choice"},
		{"n=2, only choice 1", choiceChunk(1, "null") + choiceChunk(1, `"stop"`) + done, Expect{N: 2}, false, "missing_choice"},
		{"n=2, both", finishAll(2) + done, Expect{N: 2}, true, ""},
		{"n=2, choice 1 unfinished", choiceChunk(0, `"stop"`) + choiceChunk(1, "null") + done, Expect{N: 2}, false, "missing_finish_reason"},
		{"n=2, both in one chunk", `data: {"object":"chat.completion.chunk","choices":[{"index":0,"finish_reason":"stop"},{"index":1,"finish_reason":"length"}]}` + "\n\n" + done, Expect{N: 2}, true, ""},
		{"n=1, choice 1 too", finishAll(2) + done, Expect{N: 1}, false, "unexpected_choice"},
		{"n=3, choice 5", finishAll(3) + choiceChunk(5, `"stop"`) + done, Expect{N: 3}, false, "unexpected_choice"},
		{"negative index", finishAll(1) + choiceChunk(-1, `"stop"`) + done, Expect{}, false, "unexpected_choice"},
		{"huge index", finishAll(1) + choiceChunk(1<<40, `"stop"`) + done, Expect{}, false, "unexpected_choice"},
		{"n=0 means 1", finishAll(1) + done, Expect{N: 0}, true, ""},
		{"n=-3 means 1", finishAll(2) + done, Expect{N: -3}, false, "unexpected_choice"},
		{"n=64, all", finishAll(64) + done, Expect{N: 64}, true, ""},
		{"n=65, 64 missing", finishAll(64) + done, Expect{N: 65}, false, "missing_choice"},
		{"n=128, all", finishAll(128) + done, Expect{N: 128}, true, ""},
		{"n=128, 127 missing", finishAll(127) + done, Expect{N: 128}, false, "missing_choice"},
		{"n=1000 means 128", finishAll(128) + done, Expect{N: 1000}, true, ""},
		{"n=1000, choice 128", finishAll(129) + done, Expect{N: 1000}, false, "unexpected_choice"},
		{"usage chunk is no choice", choiceChunk(0, `"stop"`) + `data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}` + "\n\n" + done, Expect{N: 2, Usage: true}, false, "missing_choice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, reason := judge(t, tt.body, tt.expect).Clean(false)
			if ok != tt.ok || reason != tt.reason {
				t.Errorf("Clean: got %v, %q; want %v, %q", ok, reason, tt.ok, tt.reason)
			}
		})
	}
}

// TestDetectorIntact: a chat stream without [DONE] is clean when its body
// ended intact and it is otherwise complete; cut, it is not. The other
// dialects still need their terminal events.
func TestDetectorIntact(t *testing.T) {
	t.Parallel()
	chat := fixture(t, "openai-chat-text")
	usage := fixture(t, "openai-chat-usage")
	resp := fixture(t, "openai-responses-completed")
	anth := fixture(t, "anthropic-messages-text")
	groq := fixture(t, "groq-chat-error-midstream")
	failed := fixture(t, "openai-responses-error-failed")
	const done = "data: [DONE]\n\n"
	noDone := func(body string) string {
		t.Helper()
		if !strings.HasSuffix(body, done) {
			t.Fatalf("fixture: got no trailing [DONE]; want one")
		}
		return strings.TrimSuffix(body, done)
	}
	noUsage := func(body string) string {
		return drop(body, func(b string) bool { return strings.Contains(b, `"choices":[],"usage":{`) })
	}
	usageTwo := Expect{N: 2, Usage: true}
	tests := []struct {
		name   string
		body   string
		expect Expect
		intact bool
		ok     bool
		reason string
	}{
		{"chat without [DONE], intact", noDone(chat), Expect{}, true, true, ""},
		{"chat without [DONE], cut", noDone(chat), Expect{}, false, false, "no_terminal_event"},
		{"chat usage without [DONE], intact", noDone(usage), Expect{Usage: true}, true, true, ""},
		{"chat usage without [DONE], cut", noDone(usage), Expect{Usage: true}, false, false, "no_terminal_event"},
		{"chat usage without [DONE] or usage, intact", noUsage(noDone(usage)), Expect{Usage: true}, true, false, "no_terminal_event"},
		{"chat without [DONE] or finish_reason, intact", replace(t, noDone(chat), `"finish_reason":"stop"`, `"finish_reason":null`, 1), Expect{}, true, false, "no_terminal_event"},
		{"chat without [DONE], n=2, intact", noDone(chat), Expect{N: 2}, true, false, "no_terminal_event"},
		{"two choices without [DONE], intact", finishAll(2), usageTwo, true, false, "no_terminal_event"},
		{"chat without [DONE], a choice not asked for, intact", finishAll(2), Expect{}, true, false, "unexpected_choice"},
		{"chat without [DONE], a choice not asked for, cut", finishAll(2), Expect{}, false, false, "no_terminal_event"},
		{"two choices and usage without [DONE], intact", finishAll(2) + `data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}` + "\n\n", usageTwo, true, true, ""},
		{"chat without [DONE], error object, intact", insertBefore(noDone(chat), 1, `data: {"error":{"message":"boom"}}`+"\n\n"), Expect{}, true, false, "error_event"},
		{"groq error midstream, intact", groq, Expect{}, true, false, "error_event"},
		{"chat with [DONE], intact", chat, Expect{}, true, true, ""},
		{"chat without object field or [DONE], intact", strings.ReplaceAll(noDone(chat), `"object":"chat.completion.chunk",`, ""), Expect{}, true, false, "unknown_dialect"},
		{"responses without completed, intact", drop(resp, func(b string) bool { return strings.Contains(b, "response.completed") }), Expect{}, true, false, "no_terminal_event"},
		{"responses completed, intact", resp, Expect{}, true, true, ""},
		{"anthropic without message_stop, intact", drop(anth, func(b string) bool { return strings.Contains(b, "message_stop") }), Expect{}, true, false, "no_terminal_event"},
		{"anthropic, intact", anth, Expect{}, true, true, ""},
		{"empty, intact", "", Expect{}, true, false, "unknown_dialect"},
		{"plain text, intact", "data: hello\n\n", Expect{}, true, false, "unknown_dialect"},
		{"plain text, cut", "data: hello\n\n", Expect{}, false, false, "no_terminal_event"},
		{"responses error event and failed, intact", failed, Expect{}, true, false, "error_event"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, reason := judge(t, tt.body, tt.expect).Clean(tt.intact)
			if ok != tt.ok || reason != tt.reason {
				t.Errorf("Clean(%v): got %v, %q; want %v, %q", tt.intact, ok, reason, tt.ok, tt.reason)
			}
		})
	}
}

// TestDetectorTerminal: Terminal turns true right after the event that ends
// the stream, never before, and nothing observed after it changes the
// verdict, so the proxy can record up to that event and stop.
func TestDetectorTerminal(t *testing.T) {
	t.Parallel()
	chat := fixture(t, "openai-chat-text")
	usage := fixture(t, "openai-chat-usage")
	resp := fixture(t, "openai-responses-completed")
	anth := fixture(t, "anthropic-messages-text")
	groq := fixture(t, "groq-chat-error-midstream")
	const done = "data: [DONE]\n\n"
	last := func(body string) string { bs := blocks(body); return bs[len(bs)-1] }
	tests := []struct {
		name   string
		body   string
		expect Expect
		at     string // the raw event after which Terminal must be true; "" for never
		ok     bool   // Clean(true) of the whole body
		reason string
	}{
		{"chat text", chat, Expect{}, done, true, ""},
		{"chat usage: [DONE], not the finish or usage chunk", usage, Expect{Usage: true}, done, true, ""},
		{"chat usage without [DONE]: never", strings.TrimSuffix(usage, done), Expect{Usage: true}, "", true, ""},
		{"responses", resp, Expect{}, last(resp), true, ""},
		{"anthropic", anth, Expect{}, last(anth), true, ""},
		{"groq: the error event", groq, Expect{}, last(groq), false, "error_event"},
		{"responses: response.failed after the error event", fixture(t, "openai-responses-error-failed"), Expect{}, last(fixture(t, "openai-responses-error-failed")), false, "error_event"},
		{"chat: error object", insertBefore(chat, 3, "data: {\"error\":{\"message\":\"boom\"}}\n\n"), Expect{}, "data: {\"error\":{\"message\":\"boom\"}}\n\n", false, "error_event"},

		// After the terminal event: not part of the stream.
		{"chat, then an error", chat + "data: {\"error\":{\"message\":\"late\"}}\n\n", Expect{}, done, true, ""},
		{"chat, then event: error", chat + "event: error\ndata: {\"message\":\"late\"}\n\n", Expect{}, done, true, ""},
		{"chat, then another choice", chat + choiceChunk(1, "null"), Expect{}, done, true, ""},
		{"responses, then failed", resp + "event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":15}\n\n", Expect{}, last(resp), true, ""},
		{"responses, then a sequence gap", resp + "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":99}\n\n", Expect{}, last(resp), true, ""},
		{"anthropic, then an error", anth + "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n", Expect{}, last(anth), true, ""},
		{"groq, then [DONE]", groq + done, Expect{}, last(groq), false, "error_event"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs := blocks(tt.body)
			want := -1
			if tt.at != "" {
				want = slices.Index(bs, tt.at)
				if want < 0 {
					t.Fatalf("got no event %q in the body; want it", tt.at)
				}
			}
			d := NewDetector(tt.expect)
			got := -1
			for i, b := range bs {
				for _, ev := range readAll(t, b, 0) {
					d.Observe(ev)
				}
				if d.Terminal() && got < 0 {
					got = i
				}
				if got >= 0 && !d.Terminal() {
					t.Fatalf("Terminal: got false after event %d; want it to stay true from event %d", i, got)
				}
			}
			if got != want {
				t.Errorf("Terminal: first true after event %d of %d; want %d", got, len(bs), want)
			}
			if ok, reason := d.Clean(true); ok != tt.ok || reason != tt.reason {
				t.Errorf("Clean(true): got %v, %q; want %v, %q", ok, reason, tt.ok, tt.reason)
			}
		})
	}
}

// FuzzDetector reads arbitrary bytes as a stream and checks the Detector's
// verdicts against what the events say, judged independently with gjson:
// Terminal turns true only at an event that can end a stream and stays
// true; nothing after it changes the verdict; Clean is deterministic,
// survives Reset, and is never kinder to a cut body than to an intact one;
// an error means never clean; and a clean verdict means the dialect's end
// is really there (for chat: every choice 0..n-1 finished, no other one,
// the usage chunk when asked, and [DONE] unless the body was intact).
func FuzzDetector(f *testing.F) {
	const done = "data: [DONE]\n\n"
	for _, s := range []string{
		"", done, "data: {}\n\n" + done,
		"data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":1,\"finish_reason\":\"stop\"},{\"finish_reason\":\"length\"}]}\n\n" + done,
		"data: {\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n",
		"event: error\ndata: {\"message\":\"x\"}\n\n" + done,
		"data: {\"type\":\"response.completed\",\"sequence_number\":0,\"response\":{\"usage\":{}}}\n\n",
		"event: message_delta\ndata: {\"delta\":{\"stop_reason\":\"end_turn\"}}\n\nevent: message_stop\ndata: {}\n\n",
	} {
		f.Add(uint8(2), true, []byte(s))
	}
	f.Fuzz(func(t *testing.T, n uint8, usage bool, body []byte) {
		e := Expect{N: int(n), Usage: usage}
		evs := readUntilError(body)
		d := NewDetector(e)
		end := len(evs) // the events up to the terminal one
		for i, ev := range evs {
			was := d.Terminal()
			d.Observe(ev)
			switch {
			case was && !d.Terminal():
				t.Fatalf("Terminal: got false after event %d; want it to stay true", i)
			case !was && d.Terminal():
				end = i + 1
				// A malformed event ends a stream of a known dialect: at
				// it, or at the event that made the dialect known.
				if _, why := d.Clean(false); why == "malformed_event" {
					break
				}
				if ends, known := mayEnd(ev); known && !ends {
					t.Fatalf("Terminal: got true after %+v; want it only after an event that can end a stream", ev)
				}
			}
		}
		okCut, whyCut := d.Clean(false)
		okWhole, whyWhole := d.Clean(true)
		if ok, why := d.Clean(false); ok != okCut || why != whyCut {
			t.Fatalf("Clean(false) twice: got %v %q, then %v %q; want the same", okCut, whyCut, ok, why)
		}
		if okCut && !okWhole {
			t.Fatalf("Clean: got clean when cut, %q when intact; want intact at least as clean", whyWhole)
		}
		if okCut != (whyCut == "") || okWhole != (whyWhole == "") {
			t.Fatalf("Clean: got %v %q / %v %q; want a reason exactly when not clean", okCut, whyCut, okWhole, whyWhole)
		}

		// A used Detector, Reset, given only the events up to the terminal
		// one, must judge alike.
		r := NewDetector(Expect{N: 7})
		for _, ev := range evs {
			r.Observe(ev)
		}
		r.Reset(e)
		for _, ev := range evs[:end] {
			r.Observe(ev)
		}
		ok1, why1 := r.Clean(false)
		ok2, why2 := r.Clean(true)
		in1, out1, u1 := d.Usage()
		in2, out2, u2 := r.Usage()
		if r.Dialect() != d.Dialect() || r.Terminal() != d.Terminal() || ok1 != okCut || why1 != whyCut ||
			ok2 != okWhole || why2 != whyWhole || in1 != in2 || out1 != out2 || u1 != u2 {
			t.Fatalf("after Reset, up to the terminal event: got %v %v %v %q %v %q; want %v %v %v %q %v %q",
				r.Dialect(), r.Terminal(), ok1, why1, ok2, why2, d.Dialect(), d.Terminal(), okCut, whyCut, okWhole, whyWhole)
		}

		o := judgeEvents(evs[:end], min(max(int(n), 1), MaxChoices))
		if o.err {
			// A Responses stream goes on to its response.failed.
			if okWhole || whyWhole != "error_event" || whyCut != "error_event" || !d.Terminal() && d.Dialect() != DialectOpenAIResponses {
				t.Fatalf("with an error: got Terminal %v, Clean %v %q / %v %q; want terminal, error_event", d.Terminal(), okCut, whyCut, okWhole, whyWhole)
			}
		}
		if !okWhole {
			return
		}
		switch d.Dialect() {
		case DialectOpenAIChat:
			if okCut && !o.done {
				t.Fatalf("Clean(false): got clean without [DONE]; want not clean")
			}
			if !o.valid {
				return
			}
			if o.unexpected {
				t.Fatalf("Clean: got clean with a choice outside 0..%d", n)
			}
			for i, fin := range o.finished {
				if !fin {
					t.Fatalf("Clean: got clean with choice %d unfinished", i)
				}
			}
			if usage && !o.usage {
				t.Fatalf("Clean: got clean without the usage chunk asked for")
			}
		case DialectOpenAIResponses:
			if o.valid && (!o.completed || o.failed || o.incomplete || o.seqGap) {
				t.Fatalf("Clean: got clean with %+v", o)
			}
		case DialectAnthropic:
			if o.valid && !o.stopped {
				t.Fatalf("Clean: got clean without message_stop")
			}
		default:
			t.Fatalf("Clean: got clean for dialect %v", d.Dialect())
		}
	})
}

// verdict is what a list of events says, read with gjson rather than the
// Detector's own walker. Where data is not valid JSON it claims nothing
// (valid is false), except for what the event name and [DONE] say.
type verdict struct {
	valid                         bool // every data is [DONE] or valid JSON
	err, done                     bool
	finished                      []bool
	unexpected, usage             bool
	completed, failed, incomplete bool
	haveSeq, seqGap               bool
	lastSeq                       int64
	stopped                       bool
}

func judgeEvents(evs []Event, n int) verdict {
	o := verdict{valid: true, finished: make([]bool, n)}
	for _, ev := range evs {
		o.err = o.err || ev.Type == "error"
		o.completed = o.completed || ev.Type == "response.completed"
		o.failed = o.failed || ev.Type == "response.failed"
		o.incomplete = o.incomplete || ev.Type == "response.incomplete"
		o.stopped = o.stopped || ev.Type == "message_stop"
		if ev.Data == "[DONE]" {
			o.done = true
			continue
		}
		if !gjson.Valid(ev.Data) {
			o.valid = false
			continue
		}
		top := lastMembers(gjson.Parse(ev.Data))
		if ty := top["type"]; ty.Type == gjson.String {
			o.err = o.err || ty.Str == "error"
			o.completed = o.completed || ty.Str == "response.completed"
			o.failed = o.failed || ty.Str == "response.failed"
			o.incomplete = o.incomplete || ty.Str == "response.incomplete"
			o.stopped = o.stopped || ty.Str == "message_stop"
		}
		gjson.Parse(ev.Data).ForEach(func(k, v gjson.Result) bool {
			o.err = o.err || k.Str == "error" && v.Type != gjson.Null || k.Str == "type" && v.Type == gjson.String && v.Str == "error"
			return true
		})
		if seq := top["sequence_number"]; seq.Type == gjson.Number {
			if o.haveSeq && seq.Int() != o.lastSeq+1 {
				o.seqGap = true
			}
			o.haveSeq, o.lastSeq = true, seq.Int()
		}
		if top["usage"].IsObject() {
			o.usage = true
		}
		if choices := top["choices"]; choices.IsArray() {
			for _, c := range choices.Array() {
				if !c.IsObject() {
					continue
				}
				m := lastMembers(c)
				idx := m["index"].Int()
				fr := m["finish_reason"]
				fin := fr.Exists() && fr.Type != gjson.Null && !(fr.Type == gjson.String && fr.Str == "")
				if idx < 0 || idx >= int64(n) {
					o.unexpected = true
					continue
				}
				o.finished[idx] = o.finished[idx] || fin
			}
		}
	}
	return o
}

// lastMembers returns the members of a JSON object, the last of each name.
func lastMembers(obj gjson.Result) map[string]gjson.Result {
	m := map[string]gjson.Result{}
	if obj.IsObject() {
		obj.ForEach(func(k, v gjson.Result) bool {
			m[k.Str] = v
			return true
		})
	}
	return m
}

// mayEnd reports whether ev is one that can end a stream in some dialect;
// known is false when its data is not valid JSON, so that only the walker
// could say what it holds.
func mayEnd(ev Event) (ends, known bool) {
	if ev.Data == "[DONE]" {
		return true, true
	}
	switch ev.Type {
	case "error", "response.completed", "response.failed", "response.incomplete", "message_stop":
		return true, true
	}
	if !gjson.Valid(ev.Data) {
		return false, false
	}
	o := judgeEvents([]Event{ev}, 1)
	return o.err || o.completed || o.failed || o.incomplete || o.stopped, true
}
