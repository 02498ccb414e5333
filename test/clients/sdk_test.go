package clients_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	openaiopt "github.com/openai/openai-go/v3/option"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/proxy"
)

// startMock runs the mock LLM that `ssegate -upstream mock` embeds, here in
// the test process so that its calls can be counted.
func startMock(t *testing.T, cfg mockllm.Config) (*mockllm.Server, string) {
	t.Helper()
	m := mockllm.New(cfg)
	u, err := m.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, u
}

// startInProcess serves ssegate through its public API (proxy.New with an
// in-memory store) on a loopback port, in front of upstream.
func startInProcess(t *testing.T, upstream string) string {
	t.Helper()
	store, err := cache.NewMemory(cache.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.New(proxy.Config{
		Upstreams: []string{upstream},
		Store:     store,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := p.Server()
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	}()
	t.Cleanup(func() {
		p.Abort()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.ShutdownWithContext(ctx) //nolint:errcheck // bounded by ctx
		<-served
		store.Close()
	})
	return "http://" + ln.Addr().String()
}

// TestAnthropicSDK: the official Anthropic Go SDK streams a Messages
// completion through ssegate with an Idempotency-Key; an identical second
// call is answered from the store with the same text and no upstream call.
func TestAnthropicSDK(t *testing.T) {
	mock, upstream := startMock(t, mockllm.Config{Tokens: 24, Delay: time.Millisecond})
	base := startInProcess(t, upstream)
	key := fmt.Sprintf("anthropic-%d", time.Now().UnixNano())
	client := anthropic.NewClient(
		anthropicopt.WithBaseURL(base+"/"),
		anthropicopt.WithAPIKey("sk-ant-e2e"),
		anthropicopt.WithHeader("Idempotency-Key", key),
		// A retry would be a second request the test did not make.
		anthropicopt.WithMaxRetries(0),
	)
	params := anthropic.MessageNewParams{
		Model:     "claude-sonnet-5-5",
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Tell me a joke"))},
	}
	type answer struct {
		text     string
		stop     string
		tokens   int64
		replayed string
	}
	call := func() answer {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var resp *http.Response
		stream := client.Messages.NewStreaming(ctx, params, anthropicopt.WithResponseInto(&resp))
		defer stream.Close()
		var msg anthropic.Message
		for stream.Next() {
			if err := msg.Accumulate(stream.Current()); err != nil {
				t.Fatalf("accumulate: %v", err)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		var text strings.Builder
		for _, b := range msg.Content {
			if b.Type == "text" {
				text.WriteString(b.Text)
			}
		}
		a := answer{text: text.String(), stop: string(msg.StopReason), tokens: msg.Usage.OutputTokens}
		if resp != nil {
			a.replayed = resp.Header.Get("Idempotent-Replayed")
		}
		return a
	}
	first := call()
	if strings.TrimSpace(first.text) == "" || first.stop != "end_turn" || first.tokens != 24 {
		t.Fatalf("first call: got text %q, stop_reason %q, output_tokens %d; want text, end_turn, 24", first.text, first.stop, first.tokens)
	}
	if first.replayed == "true" {
		t.Errorf("first call: got Idempotent-Replayed %q; want it absent", first.replayed)
	}
	second := call()
	if second.text != first.text || second.stop != first.stop || second.tokens != first.tokens {
		t.Errorf("second call: got %+v; want %+v", second, first)
	}
	if second.replayed != "true" {
		t.Errorf("second call: got Idempotent-Replayed %q; want true", second.replayed)
	}
	if got := mock.Calls(); got != 1 {
		t.Errorf("upstream calls: got %d; want 1", got)
	}
}

// TestOpenAISDKJoin: two identical streaming calls of the official OpenAI
// Go SDK, made at the same moment through the built binary, cause one
// generation upstream; both get the same content, and exactly one of
// them is marked as replayed (the one that joined).
func TestOpenAISDKJoin(t *testing.T) {
	// Slow enough (about 1 s) that the second call finds the first live.
	mock, upstream := startMock(t, mockllm.Config{Tokens: 40, Delay: 20 * time.Millisecond})
	g := startGate(t, "-upstream", upstream)
	key := fmt.Sprintf("openai-join-%d", time.Now().UnixNano())
	client := openai.NewClient(
		openaiopt.WithBaseURL(g.URL+"/v1/"),
		openaiopt.WithAPIKey("sk-e2e"),
		openaiopt.WithHeader("Idempotency-Key", key),
		openaiopt.WithMaxRetries(0),
	)
	params := openai.ChatCompletionNewParams{
		Model:         "gpt-4o-mini",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a joke")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	type answer struct {
		content, finish, replayed string
		tokens                    int64
		err                       error
	}
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		answers [2]answer
	)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			<-start
			var resp *http.Response
			stream := client.Chat.Completions.NewStreaming(ctx, params, openaiopt.WithResponseInto(&resp))
			defer stream.Close()
			acc := openai.ChatCompletionAccumulator{}
			for stream.Next() {
				acc.AddChunk(stream.Current())
			}
			a := &answers[i]
			if a.err = stream.Err(); a.err != nil {
				return
			}
			if len(acc.Choices) != 1 {
				a.err = fmt.Errorf("got %d choices; want 1", len(acc.Choices))
				return
			}
			a.content, a.finish, a.tokens = acc.Choices[0].Message.Content, acc.Choices[0].FinishReason, acc.Usage.CompletionTokens
			if resp != nil {
				a.replayed = resp.Header.Get("Idempotent-Replayed")
			}
		}()
	}
	close(start)
	wg.Wait()
	for i, a := range answers {
		if a.err != nil {
			t.Fatalf("call %d: %v", i, a.err)
		}
		if strings.TrimSpace(a.content) == "" || a.finish != "stop" || a.tokens != 40 {
			t.Errorf("call %d: got content %q, finish %q, tokens %d; want text, stop, 40", i, a.content, a.finish, a.tokens)
		}
	}
	if answers[0].content != answers[1].content {
		t.Errorf("contents differ: got %q and %q; want the same", answers[0].content, answers[1].content)
	}
	if replayed := (answers[0].replayed == "true") != (answers[1].replayed == "true"); !replayed {
		t.Errorf("Idempotent-Replayed: got %q and %q; want true on exactly one", answers[0].replayed, answers[1].replayed)
	}
	if got := mock.Calls(); got != 1 {
		t.Errorf("upstream calls: got %d; want 1", got)
	}
}
