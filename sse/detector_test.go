package sse

import (
	"strings"
	"testing"
)

// judge runs body through Read and a Detector, as the proxy does.
func judge(tb testing.TB, body string, wantUsage bool) *Detector {
	tb.Helper()
	d := NewDetector(wantUsage)
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
	chat := fixture(t, "openai-chat-text")
	usage := fixture(t, "openai-chat-usage")
	resp := fixture(t, "openai-responses-completed")
	anth := fixture(t, "anthropic-messages-text")
	groq := fixture(t, "groq-chat-error-midstream")

	const chatChunk = `data: {"object":"chat.completion.chunk","choices":[{"index":%d,"delta":{"content":"x"},"finish_reason":%s}]}` + "\n\n"
	chunk := func(idx int, fin string) string {
		return strings.Replace(strings.Replace(chatChunk, "%d", string(rune('0'+idx)), 1), "%s", fin, 1)
	}
	const done = "data: [DONE]\n\n"

	tests := []struct {
		name      string
		body      string
		wantUsage bool
		dialect   Dialect
		terminal  bool
		ok        bool
		reason    string
	}{
		// The recorded streams.
		{"chat text", chat, false, DialectOpenAIChat, true, true, ""},
		{"chat usage", usage, true, DialectOpenAIChat, true, true, ""},
		{"responses completed", resp, false, DialectOpenAIResponses, true, true, ""},
		{"anthropic text", anth, false, DialectAnthropic, true, true, ""},
		{"groq error midstream", groq, false, DialectOpenAIChat, true, false, "error_event"},
		{"groq error midstream, usage wanted", groq, true, DialectOpenAIChat, true, false, "error_event"},

		// Truncated: the last event dropped, or cut before its blank line
		// (go-sse discards it silently, so the Detector must notice).
		{"chat truncated before [DONE]", strings.TrimSuffix(chat, done), false, DialectOpenAIChat, false, false, "no_terminal_event"},
		{"chat [DONE] without blank line", strings.TrimSuffix(chat, "\n"), false, DialectOpenAIChat, false, false, "no_terminal_event"},
		{"chat usage truncated before usage", drop(usage, func(b string) bool { return !strings.Contains(b, `"usage":null`) }), true, DialectOpenAIChat, false, false, "no_terminal_event"},
		{"responses truncated before completed", drop(resp, func(b string) bool { return strings.Contains(b, "response.completed") }), false, DialectOpenAIResponses, false, false, "no_terminal_event"},
		{"responses completed cut short", resp[:len(resp)-30], false, DialectOpenAIResponses, false, false, "no_terminal_event"},
		{"anthropic truncated before message_stop", drop(anth, func(b string) bool { return strings.Contains(b, "message_stop") }), false, DialectAnthropic, false, false, "no_terminal_event"},
		{"anthropic message_stop without blank line", strings.TrimSuffix(anth, "\n"), false, DialectAnthropic, false, false, "no_terminal_event"},

		// Chat rules.
		{"chat [DONE] after error object", insertBefore(chat, 1, `data: {"error":{"message":"boom","type":"server_error"}}`+"\n\n"), false, DialectOpenAIChat, true, false, "error_event"},
		{"chat [DONE] after event error", insertBefore(chat, 1, "event: error\ndata: {\"message\":\"boom\"}\n\n"), false, DialectOpenAIChat, true, false, "error_event"},
		{"chat error after [DONE]", chat + `data: {"error":{"message":"late"}}` + "\n\n", false, DialectOpenAIChat, true, false, "error_event"},
		{"chat null error is no error", replace(t, chat, `"system_fingerprint":null,`, `"system_fingerprint":null,"error":null,`, -1), false, DialectOpenAIChat, true, true, ""},
		{"chat usage requested but missing", chat, true, DialectOpenAIChat, true, false, "missing_usage"},
		{"chat usage requested, usage null", replace(t, usage, `"choices":[],"usage":{`, `"choices":[],"usage":null,"x":{`, 1), true, DialectOpenAIChat, true, false, "missing_usage"},
		{"chat missing finish_reason", replace(t, chat, `"finish_reason":"stop"`, `"finish_reason":null`, 1), false, DialectOpenAIChat, true, false, "missing_finish_reason"},
		{"chat empty finish_reason", replace(t, chat, `"finish_reason":"stop"`, `"finish_reason":""`, 1), false, DialectOpenAIChat, true, false, "missing_finish_reason"},
		{"chat length is clean", replace(t, chat, `"finish_reason":"stop"`, `"finish_reason":"length"`, 1), false, DialectOpenAIChat, true, true, ""},
		{"chat content_filter is clean", replace(t, chat, `"finish_reason":"stop"`, `"finish_reason":"content_filter"`, 1), false, DialectOpenAIChat, true, true, ""},
		{"chat without object field", strings.ReplaceAll(chat, `"object":"chat.completion.chunk",`, ""), false, DialectOpenAIChat, true, true, ""},
		{"chat without object field, unfinished", strings.ReplaceAll(replace(t, chat, `"finish_reason":"stop"`, `"finish_reason":null`, 1), `"object":"chat.completion.chunk",`, ""), false, DialectOpenAIChat, true, false, "missing_finish_reason"},
		{"chat only [DONE]", done, false, DialectOpenAIChat, true, false, "no_choices"},
		{"two choices, one finished", chunk(0, "null") + chunk(1, "null") + chunk(0, `"stop"`) + done, false, DialectOpenAIChat, true, false, "missing_finish_reason"},
		{"two choices, both finished", chunk(0, "null") + chunk(1, "null") + chunk(1, `"tool_calls"`) + chunk(0, `"stop"`) + done, false, DialectOpenAIChat, true, true, ""},
		{"finish is sticky", chunk(0, "null") + chunk(0, `"stop"`) + chunk(0, "null") + done, false, DialectOpenAIChat, true, true, ""},
		{"wide choice index unfinished", chunk(0, `"stop"`) + `data: {"object":"chat.completion.chunk","choices":[{"index":100,"finish_reason":null}]}` + "\n\n" + done, false, DialectOpenAIChat, true, false, "missing_finish_reason"},
		{"wide choice index finished", chunk(0, `"stop"`) + `data: {"object":"chat.completion.chunk","choices":[{"index":100,"finish_reason":"stop"}]}` + "\n\n" + done, false, DialectOpenAIChat, true, true, ""},
		{"legacy completions", `data: {"object":"text_completion","choices":[{"text":"hi","index":0,"finish_reason":null}]}` + "\n\n" + `data: {"object":"text_completion","choices":[{"text":"","index":0,"finish_reason":"length"}]}` + "\n\n" + done, false, DialectOpenAIChat, true, true, ""},

		// Responses rules.
		{"responses sequence gap", drop(resp, func(b string) bool { return strings.Contains(b, `"sequence_number":5}`) }), false, DialectOpenAIResponses, true, false, "sequence_gap"},
		{"responses sequence repeated", insertBefore(resp, 1, blocks(resp)[3]), false, DialectOpenAIResponses, true, false, "sequence_gap"},
		{"responses failed", strings.ReplaceAll(resp, "response.completed", "response.failed"), false, DialectOpenAIResponses, true, false, "response_failed"},
		{"responses failed, data type only", replace(t, resp, `"type":"response.completed"`, `"type":"response.failed"`, 1), false, DialectOpenAIResponses, true, false, "response_failed"},
		{"responses incomplete", strings.ReplaceAll(resp, "response.completed", "response.incomplete"), false, DialectOpenAIResponses, true, false, "response_incomplete"},
		{"responses error event", insertBefore(replace(t, resp, `"sequence_number":14}`, `"sequence_number":15}`, 1), 1, "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"x\",\"param\":null,\"sequence_number\":14}\n\n"), false, DialectOpenAIResponses, true, false, "error_event"},
		{"responses [DONE] after completed tolerated", resp + done, false, DialectOpenAIResponses, true, true, ""},
		{"responses error after completed", resp + "event: error\ndata: {\"type\":\"error\",\"sequence_number\":15}\n\n", false, DialectOpenAIResponses, true, false, "error_event"},

		// Anthropic rules.
		{"anthropic error then message_stop", insertBefore(anth, 1, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"), false, DialectAnthropic, true, false, "error_event"},
		{"anthropic error data type only", insertBefore(anth, 1, "data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n"), false, DialectAnthropic, true, false, "error_event"},
		{"anthropic missing stop_reason", replace(t, anth, `"stop_reason":"end_turn"`, `"stop_reason":null`, 1), false, DialectAnthropic, true, false, "missing_stop_reason"},
		{"anthropic no message_delta", drop(anth, func(b string) bool { return strings.Contains(b, "message_delta") }), false, DialectAnthropic, true, false, "missing_stop_reason"},
		{"anthropic unknown events and pings tolerated", insertBefore(anth, 2, "event: ping\ndata: {\"type\":\"ping\"}\n\nevent: future_thing\ndata: {\"type\":\"future_thing\"}\n\n"), false, DialectAnthropic, true, true, ""},
		{"anthropic usage wanted is ignored", anth, true, DialectAnthropic, true, true, ""},

		// No dialect.
		{"empty", "", false, DialectUnknown, false, false, "unknown_dialect"},
		{"plain text", "data: hello\n\n", false, DialectUnknown, false, false, "unknown_dialect"},
		{"error before anything", "event: error\ndata: {\"error\":{\"message\":\"overloaded\"}}\n\n", false, DialectUnknown, true, false, "error_event"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := judge(t, tt.body, tt.wantUsage)
			if got := d.Dialect(); got != tt.dialect {
				t.Errorf("Dialect: got %v; want %v", got, tt.dialect)
			}
			if got := d.Terminal(); got != tt.terminal {
				t.Errorf("Terminal: got %v; want %v", got, tt.terminal)
			}
			ok, reason := d.Clean()
			if ok != tt.ok || reason != tt.reason {
				t.Errorf("Clean: got %v, %q; want %v, %q", ok, reason, tt.ok, tt.reason)
			}
		})
	}
}

func TestDetectorUsage(t *testing.T) {
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
			in, out, ok := judge(t, fixture(t, tt.name), tt.wantUsageFlag).Usage()
			if in != tt.in || out != tt.out || ok != tt.ok {
				t.Errorf("got %d, %d, %v; want %d, %d, %v", in, out, ok, tt.in, tt.out, tt.ok)
			}
		})
	}
}

func TestDetectorReset(t *testing.T) {
	d := judge(t, fixture(t, "groq-chat-error-midstream"), false)
	d.Observe(Event{Data: `{"object":"chat.completion.chunk","choices":[{"index":200,"finish_reason":null}]}`})
	d.Reset(false)
	for _, ev := range readAll(t, fixture(t, "anthropic-messages-text"), 0) {
		d.Observe(ev)
	}
	if ok, reason := d.Clean(); !ok {
		t.Errorf("after Reset: got not clean (%s); want clean", reason)
	}
	d.Reset(true)
	for _, ev := range readAll(t, fixture(t, "openai-chat-text"), 0) {
		d.Observe(ev)
	}
	if ok, reason := d.Clean(); ok || reason != "missing_usage" {
		t.Errorf("after Reset(true): got %v, %q; want false, missing_usage", ok, reason)
	}
}

func TestDetectorWideChoicesBounded(t *testing.T) {
	d := NewDetector(false)
	for i := range 5000 {
		d.Observe(Event{Data: `{"object":"chat.completion.chunk","choices":[{"index":` + itoa(1000+i) + `,"finish_reason":"stop"}]}`})
	}
	d.Observe(Event{Data: "[DONE]"})
	if len(d.wide) > maxWideChoices {
		t.Errorf("got %d tracked indexes; want at most %d", len(d.wide), maxWideChoices)
	}
	if ok, reason := d.Clean(); ok || reason != "too_many_choices" {
		t.Errorf("got %v, %q; want false, too_many_choices", ok, reason)
	}
}

func itoa(n int) string { return ID{Seq: uint64(n)}.String()[2:] }

func TestDialectString(t *testing.T) {
	tests := []struct {
		d    Dialect
		want string
	}{
		{DialectUnknown, "unknown"},
		{DialectOpenAIChat, "openai_chat"},
		{DialectOpenAIResponses, "openai_responses"},
		{DialectAnthropic, "anthropic"},
		{Dialect(9), "dialect(9)"},
	}
	for _, tt := range tests {
		if got := tt.d.String(); got != tt.want {
			t.Errorf("got %q; want %q", got, tt.want)
		}
	}
}

func BenchmarkDetectorObserve(b *testing.B) {
	chunk := Event{Data: `{"id":"chatcmpl-B74aE2TDl9ZbKx2fXoVatoMDnErNm","object":"chat.completion.chunk","created":1741025614,"model":"gpt-3.5-turbo-0125","choices":[{"index":0,"delta":{"content":" joke"},"logprobs":null,"finish_reason":null}]}`}
	b.Run("chat", func(b *testing.B) {
		d := NewDetector(true)
		b.SetBytes(int64(len(chunk.Data)))
		b.ReportAllocs()
		for b.Loop() {
			d.Observe(chunk)
		}
	})
	for _, name := range []string{"openai-responses-completed", "anthropic-messages-text"} {
		evs := readAll(b, fixture(b, name), 0)
		b.Run(name, func(b *testing.B) {
			d := NewDetector(false)
			b.ReportAllocs()
			for b.Loop() {
				d.Reset(false)
				for _, ev := range evs {
					d.Observe(ev)
				}
			}
		})
	}
}
