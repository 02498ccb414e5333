package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	openaiopt "github.com/openai/openai-go/v3/option"

	"github.com/ssegate/ssegate/client"
)

// An openai-go client through ssegate: the SDK's retries are off, the
// Transport retries and resumes under one key for the intent.
func Example_openai() {
	c := openai.NewClient(
		openaiopt.WithBaseURL("http://127.0.0.1:8080/v1/"),
		openaiopt.WithHTTPClient(&http.Client{Transport: &client.Transport{}}),
		openaiopt.WithMaxRetries(0),
	)
	ctx := client.WithIdempotencyKey(context.Background(), "order-42-summary")
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:    "gpt-4o-mini",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Summarize order 42")},
	})
	defer stream.Close()
	for stream.Next() {
		if ch := stream.Current().Choices; len(ch) > 0 {
			fmt.Print(ch[0].Delta.Content)
		}
	}
	var aborted *client.AbortedError
	switch err := stream.Err(); {
	case errors.Is(err, client.ErrStreamGone), errors.As(err, &aborted):
		// the generation failed: a new request (a new key) starts over
	case err != nil:
		// the request failed
	}
}

// An anthropic-sdk-go client through ssegate, with a pinned key so that
// the SDK's own retries join the first generation.
func Example_anthropic() {
	c := anthropic.NewClient(
		anthropicopt.WithBaseURL("http://127.0.0.1:8080/"),
		anthropicopt.WithHTTPClient(&http.Client{Transport: &client.Transport{}}),
	)
	ctx := client.WithIdempotencyKey(context.Background(), "ticket-7-reply")
	stream := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
		Model:     "claude-sonnet-4-5",
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Draft a reply"))},
	})
	defer stream.Close()
	for stream.Next() {
		if d, ok := stream.Current().AsAny().(anthropic.ContentBlockDeltaEvent); ok {
			fmt.Print(d.Delta.Text)
		}
	}
	if err := stream.Err(); err != nil {
		fmt.Println("\nerror:", err)
	}
}
