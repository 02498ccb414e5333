package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestOpenAISDK: the official OpenAI Go SDK streams a chat completion
// through ssegate with an Idempotency-Key; a second identical call is
// replayed without an upstream call.
func TestOpenAISDK(t *testing.T) {
	e := newEnv(t, slowMock(time.Millisecond, 24))
	client := openai.NewClient(
		option.WithBaseURL(e.url+"/v1/"),
		option.WithAPIKey("sk-test"),
		option.WithHeader("Idempotency-Key", newKey("sdk")),
		option.WithMaxRetries(0),
	)
	params := openai.ChatCompletionNewParams{
		Model:    "gpt-4o-mini",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a joke")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{
			IncludeUsage: openai.Bool(true),
		},
	}
	run := func() (string, string, int64) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stream := client.Chat.Completions.NewStreaming(ctx, params)
		acc := openai.ChatCompletionAccumulator{}
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		if len(acc.Choices) != 1 {
			t.Fatalf("got %d choices; want 1", len(acc.Choices))
		}
		return acc.Choices[0].Message.Content, acc.Choices[0].FinishReason, acc.Usage.CompletionTokens
	}
	content, finish, tokens := run()
	if strings.TrimSpace(content) == "" || finish != "stop" || tokens != 24 {
		t.Fatalf("got content %q finish %q tokens %d; want text, stop, 24", content, finish, tokens)
	}
	again, finish2, _ := run()
	if again != content || finish2 != finish {
		t.Fatalf("replay: got %q; want %q", again, content)
	}
	e.wantCalls(1)
}
