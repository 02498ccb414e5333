package sse

import "testing"

func TestContent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		events []Event
		want   []bool // Content after each event
	}{
		{"responses preamble then text", []Event{
			{Type: "response.created", Data: `{"type":"response.created","sequence_number":0,"response":{"error":null}}`},
			{Type: "response.in_progress", Data: `{"type":"response.in_progress","sequence_number":1,"response":{}}`},
			{Type: "response.output_text.delta", Data: `{"type":"response.output_text.delta","sequence_number":2,"delta":"Hi"}`},
		}, []bool{false, false, true}},
		{"responses preamble then error", []Event{
			{Type: "response.created", Data: `{"type":"response.created","sequence_number":0,"response":{}}`},
			{Type: "error", Data: `{"type":"error","sequence_number":1,"error":{"code":"insufficient_quota"}}`},
		}, []bool{false, false}},
		{"anthropic", []Event{
			{Type: "message_start", Data: `{"type":"message_start","message":{"usage":{"input_tokens":3}}}`},
			{Type: "ping", Data: `{"type": "ping"}`},
			{Type: "content_block_start", Data: `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`},
		}, []bool{false, false, false}},
		{"anthropic tool use", []Event{
			{Type: "message_start", Data: `{"type":"message_start","message":{}}`},
			{Type: "content_block_start", Data: `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"get","input":{}}}`},
		}, []bool{false, true}},
		{"anthropic text", []Event{
			{Type: "content_block_delta", Data: `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"2"}}`},
		}, []bool{true}},
		{"chat role only, then content", []Event{
			{Data: `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"finish_reason":null}]}`},
			{Data: `{"object":"chat.completion.chunk","choices":[]}`},
			{Data: `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"A"},"finish_reason":null}]}`},
		}, []bool{false, false, true}},
		{"chat tool call", []Event{
			{Data: `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0}]}}]}`},
		}, []bool{true}},
		{"chat finish", []Event{
			{Data: `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`},
		}, []bool{true}},
		{"chat error member", []Event{
			{Data: `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"}}]}`},
			{Data: `{"error":{"code":502,"message":"overloaded"}}`},
		}, []bool{false, false}},
		{"unknown events", []Event{{Type: "x", Data: `{"a":1}`}}, []bool{true}},
	}
	for _, tt := range tests {
		d := NewDetector(Expect{})
		for i, ev := range tt.events {
			d.Observe(ev)
			if got := d.Content(); got != tt.want[i] {
				t.Errorf("%s: event %d: Content() = %v, want %v", tt.name, i, got, tt.want[i])
			}
		}
	}
}
