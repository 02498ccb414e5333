package sse

import "testing"

func TestWantsUsageAndStream(t *testing.T) {
	tests := []struct {
		body          string
		usage, stream bool
	}{
		{`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}`, true, true},
		{`{"stream":true,"stream_options":{"include_usage":false}}`, false, true},
		{`{"stream":true}`, false, true},
		{`{"stream":false,"stream_options":{"include_usage":true}}`, true, false},
		{`{"stream":"true","stream_options":{"include_usage":"true"}}`, false, false},
		{`{"stream_options":null}`, false, false},
		{`{"stream":true,"stream_options":{"include_usage":true}`, false, false}, // malformed
		{`not json`, false, false},
		{``, false, false},
		{`[{"stream":true}]`, false, false},
		{`{"messages":[{"stream":true}]}`, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.body, func(t *testing.T) {
			if got := WantsUsage([]byte(tt.body)); got != tt.usage {
				t.Errorf("WantsUsage: got %v; want %v", got, tt.usage)
			}
			if got := WantsStream([]byte(tt.body)); got != tt.stream {
				t.Errorf("WantsStream: got %v; want %v", got, tt.stream)
			}
		})
	}
}
