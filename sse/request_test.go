package sse

import "testing"

func TestWantsUsage(t *testing.T) {
	tests := []struct {
		body  string
		usage bool
	}{
		{`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}`, true},
		{`{"stream":true,"stream_options":{"include_usage":false}}`, false},
		{`{"stream":true}`, false},
		{`{"stream":false,"stream_options":{"include_usage":true}}`, true},
		{`{"stream":"true","stream_options":{"include_usage":"true"}}`, false},
		{`{"stream_options":null}`, false},
		{`{"stream":true,"stream_options":{"include_usage":true}`, false}, // malformed
		{`{"stream_options":{"include\u005fusage":true}}`, true},          // an escaped letter in the name
		{`{"messages":[{"content":"caf\u00e9 include_usage"}]}`, false},
		{`not json`, false},
		{``, false},
		{`[{"stream_options":{"include_usage":true}}]`, false},
		{`{"messages":[{"stream_options":{"include_usage":true}}]}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.body, func(t *testing.T) {
			if got := WantsUsage([]byte(tt.body)); got != tt.usage {
				t.Errorf("WantsUsage: got %v; want %v", got, tt.usage)
			}
		})
	}
}
