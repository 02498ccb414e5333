package sse

import (
	"strconv"
	"strings"
)

// Dialect is the upstream API family, detected from the events themselves
// rather than from the request path, so that any OpenAI- or
// Anthropic-compatible upstream is judged by the rules of what it sends.
type Dialect uint8

// The dialects the Detector knows. DialectUnknown is also the answer until
// the first recognisable event arrives.
const (
	DialectUnknown         Dialect = iota // nothing recognisable seen yet
	DialectOpenAIChat                     // OpenAI chat/completions (and legacy completions) chunks, ended by [DONE]
	DialectOpenAIResponses                // OpenAI Responses API events, ended by response.completed
	DialectAnthropic                      // Anthropic Messages events, ended by message_stop
)

// String returns the dialect's name for logs and metrics: "unknown",
// "openai_chat", "openai_responses" or "anthropic".
func (d Dialect) String() string {
	switch d {
	case DialectUnknown:
		return "unknown"
	case DialectOpenAIChat:
		return "openai_chat"
	case DialectOpenAIResponses:
		return "openai_responses"
	case DialectAnthropic:
		return "anthropic"
	}
	return "dialect(" + strconv.Itoa(int(d)) + ")"
}

// detectDialect names the dialect one event belongs to, from its event name
// and the top-level fields of its data, or DialectUnknown. The [DONE]
// sentinel is handled by the caller.
func detectDialect(name string, f *fields) Dialect {
	for _, s := range [2]string{name, f.typ} {
		switch {
		case strings.HasPrefix(s, "message_"), strings.HasPrefix(s, "content_block_"):
			return DialectAnthropic
		case strings.HasPrefix(s, "response."):
			return DialectOpenAIResponses
		}
	}
	if f.object == "chat.completion.chunk" || f.object == "text_completion" {
		return DialectOpenAIChat
	}
	return DialectUnknown
}
