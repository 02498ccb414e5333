package sse

import (
	"testing"
)

func TestDialectString(t *testing.T) {
	t.Parallel()
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
