package clients_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	openaiopt "github.com/openai/openai-go/v3/option"

	"github.com/ssegate/ssegate/client"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/poll"
)

// storedData returns the data of every event of key's stream as ssegate
// stored it, read by GET /streams/{key} straight from the gate (not through
// the forwarder), without what an SDK does not hand its caller: the
// terminal [DONE] and Anthropic's ping events.
func storedData(t *testing.T, gate, key, header, credential string) []string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, gate+"/streams/"+key, nil)
	req.Header.Set(header, credential)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /streams/%s: %s", key, resp.Status)
	}
	evs, err := readEvents(resp.Body, nil)
	if err != nil {
		t.Fatal(err)
	}
	var data []string
	for _, ev := range evs {
		if ev.data != "[DONE]" && ev.typ != "ping" {
			data = append(data, ev.data)
		}
	}
	return data
}

// wantStoredOnce checks what every resume and join test promises: got
// (the data of the events an SDK handed its caller) is key's stream as
// ssegate stored it, event for event, and the upstream was called once.
func wantStoredOnce(t *testing.T, got []string, mock *mockllm.Server, gate, key, header, credential string) {
	t.Helper()
	want := storedData(t, gate, key, header, credential)
	if len(got) != len(want) {
		t.Errorf("events: got %d; want %d, the stored stream's", len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			t.Errorf("event %d: got %s; want %s", i+1, got[i], want[i])
			break
		}
	}
	if n := mock.Calls(); n != 1 {
		t.Errorf("upstream calls: got %d; want 1", n)
	}
}

// TestOpenAISDKResume: an openai-go stream through the built binary, on a
// connection the forwarder severs twice mid-stream; client.Transport
// resumes it by itself, so that the SDK's iterator sees every chunk of
// the stored stream exactly once, in order, with no error, and the
// upstream is called once.
func TestOpenAISDKResume(t *testing.T) {
	mock, upstream := startMock(t, mockllm.Config{Tokens: 30, Delay: 15 * time.Millisecond})
	g := startGate(t, "-upstream", upstream)
	f := newForwarder(t, g.Addr)
	c := openAIClient("http://"+f.addr(), &client.Transport{MinBackoff: 10 * time.Millisecond}, openaiopt.WithMaxRetries(0))
	key := fmt.Sprintf("openai-resume-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(client.WithIdempotencyKey(context.Background(), key), 20*time.Second)
	defer cancel()
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         "gpt-4o-mini",
		Messages:      joke,
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	defer stream.Close()
	var got []string
	severed := 0
	for stream.Next() {
		got = append(got, stream.Current().RawJSON())
		if len(got) == 5 || len(got) == 15 {
			severed += f.sever()
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if severed != 2 {
		t.Errorf("severed: got %d connections; want 2", severed)
	}
	wantStoredOnce(t, got, mock, g.URL, key, "Authorization", "Bearer sk-e2e")
}

// TestAnthropicSDKResume: the same with anthropic-sdk-go and the Messages
// dialect, with the credential in x-api-key, the header Anthropic's API
// reads (the SDK's WithAPIKey sends Authorization): the reconnections
// carry it, and reach the same tenant's stream.
func TestAnthropicSDKResume(t *testing.T) {
	mock, upstream := startMock(t, mockllm.Config{Tokens: 30, Delay: 15 * time.Millisecond})
	g := startGate(t, "-upstream", upstream)
	f := newForwarder(t, g.Addr)
	c := anthropic.NewClient(
		anthropicopt.WithBaseURL("http://"+f.addr()+"/"),
		anthropicopt.WithHeader("X-Api-Key", "sk-ant-e2e"),
		anthropicopt.WithHTTPClient(&http.Client{Transport: &client.Transport{MinBackoff: 10 * time.Millisecond}}),
		anthropicopt.WithMaxRetries(0),
	)
	key := fmt.Sprintf("anthropic-resume-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(client.WithIdempotencyKey(context.Background(), key), 20*time.Second)
	defer cancel()
	stream := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
		Model:     "claude-sonnet-4-5",
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Tell me a joke"))},
	})
	defer stream.Close()
	var got []string
	var msg anthropic.Message
	severed := 0
	for stream.Next() {
		ev := stream.Current()
		if err := msg.Accumulate(ev); err != nil {
			t.Fatalf("accumulate: %v", err)
		}
		got = append(got, ev.RawJSON())
		if len(got) == 6 || len(got) == 16 {
			severed += f.sever()
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if severed != 2 {
		t.Errorf("severed: got %d connections; want 2", severed)
	}
	if msg.StopReason != "end_turn" || msg.Usage.OutputTokens != 30 {
		t.Errorf("message: stop_reason %q, output_tokens %d; want end_turn, 30", msg.StopReason, msg.Usage.OutputTokens)
	}
	wantStoredOnce(t, got, mock, g.URL, key, "X-Api-Key", "sk-ant-e2e")
}

// TestQueryCredentialResume: a stream whose only credential is the key
// query parameter (Gemini's ?key=), through client.Transport, on a
// connection the forwarder severs mid-stream: the reconnection carries
// ?key= and reaches the same tenant's stream, so the caller reads the
// stored stream whole, from one upstream call.
func TestQueryCredentialResume(t *testing.T) {
	mock, upstream := startMock(t, mockllm.Config{Tokens: 20, Delay: 15 * time.Millisecond})
	g := startGate(t, "-upstream", upstream)
	f := newForwarder(t, g.Addr)
	key := fmt.Sprintf("query-resume-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(client.WithIdempotencyKey(context.Background(), key), 20*time.Second)
	defer cancel()
	body := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Tell me a joke"}]}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.addr()+"/v1/chat/completions?key=g-e2e", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: &client.Transport{MinBackoff: 10 * time.Millisecond}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status: got %s; want 200", resp.Status)
	}
	var got []string
	severed := 0
	_, err = readEvents(resp.Body, func(ev event) {
		got = append(got, ev.data)
		if len(got) == 5 {
			severed += f.sever()
		}
	})
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	if severed != 1 {
		t.Errorf("severed: got %d connections; want 1", severed)
	}
	stored, _ := http.NewRequest(http.MethodGet, g.URL+"/streams/"+key+"?key=g-e2e", nil)
	sr, err := http.DefaultClient.Do(stored)
	if err != nil {
		t.Fatal(err)
	}
	defer sr.Body.Close()
	want, err := readEvents(sr.Body, nil)
	if err != nil || sr.StatusCode != 200 {
		t.Fatalf("GET /streams/%s?key=: %s, %v", key, sr.Status, err)
	}
	if len(got) != len(want) {
		t.Fatalf("events: got %d; want %d, the stored stream's", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i].data {
			t.Fatalf("event %d: got %s; want %s", i+1, got[i], want[i].data)
		}
	}
	if n := mock.Calls(); n != 1 {
		t.Errorf("upstream calls: got %d; want 1", n)
	}
}

// TestOpenAISDKPinnedKeyJoins: two openai-go calls with the SDK's own
// retries on and one key pinned to their context, made at the same
// moment through the Transport: the second joins the first's generation,
// both get the same chunks, and the upstream is called once.
func TestOpenAISDKPinnedKeyJoins(t *testing.T) {
	mock, upstream := startMock(t, mockllm.Config{Tokens: 40, Delay: 20 * time.Millisecond})
	g := startGate(t, "-upstream", upstream)
	c := openAIClient(g.URL, &client.Transport{})
	key := fmt.Sprintf("openai-pinned-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(client.WithIdempotencyKey(context.Background(), key), 20*time.Second)
	defer cancel()
	params := openai.ChatCompletionNewParams{
		Model:    "gpt-4o-mini",
		Messages: joke,
	}
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		texts [2]string
		errs  [2]error
	)
	for i := range texts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			stream := c.Chat.Completions.NewStreaming(ctx, params)
			defer stream.Close()
			var b strings.Builder
			for stream.Next() {
				b.WriteString(stream.Current().RawJSON())
				b.WriteByte('\n')
			}
			texts[i], errs[i] = b.String(), stream.Err()
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if texts[0] == "" || texts[0] != texts[1] {
		t.Errorf("chunks differ or are empty:\n%s\n---\n%s", texts[0], texts[1])
	}
	if n := mock.Calls(); n != 1 {
		t.Errorf("upstream calls: got %d; want 1", n)
	}
}

// TestOpenAISDKRetryJoins: the SDK's own retry (the Transport's are off)
// with a pinned key. The forwarder severs the first attempt's connection
// after the request went out and before the answer's head (the mock waits
// before its first event); the SDK sends the request again under the same
// key, and it joins the generation the first attempt started: one upstream
// call, the whole stream, marked as replayed.
func TestOpenAISDKRetryJoins(t *testing.T) {
	mock, upstream := startMock(t, mockllm.Config{Tokens: 8, Delay: 150 * time.Millisecond})
	g := startGate(t, "-upstream", upstream)
	f := newForwarder(t, g.Addr)
	c := openAIClient("http://"+f.addr(), &client.Transport{MaxAttempts: 1}, openaiopt.WithMaxRetries(2))
	key := fmt.Sprintf("openai-retry-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(client.WithIdempotencyKey(context.Background(), key), 20*time.Second)
	defer cancel()
	severed := make(chan int, 1)
	go func() { // once the request reached the upstream, which waits before its first event
		poll.Until(10*time.Second, func() bool { return mock.Calls() > 0 })
		severed <- f.sever()
	}()
	var resp *http.Response
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:    "gpt-4o-mini",
		Messages: joke,
	}, openaiopt.WithResponseInto(&resp))
	defer stream.Close()
	var got []string
	for stream.Next() {
		got = append(got, stream.Current().RawJSON())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if n := <-severed; n != 1 {
		t.Fatalf("severed: got %d connections; want 1, the first attempt's", n)
	}
	if resp == nil || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the retry's answer: want Idempotent-Replayed: true (it joined)")
	}
	wantStoredOnce(t, got, mock, g.URL, key, "Authorization", "Bearer sk-e2e")
}

// TestOpenAISDKAborted: an upstream reset mid-stream makes ssegate end the
// stream with stream_aborted; through client.Transport the SDK's stream
// ends with an error that is an *client.AbortedError naming the cause,
// after the events before it, and nothing reconnects.
func TestOpenAISDKAborted(t *testing.T) {
	_, upstream := startMock(t, mockllm.Config{Tokens: 20, Delay: 5 * time.Millisecond})
	g := startGate(t, "-upstream", upstream)
	c := openAIClient(g.URL, &client.Transport{}, openaiopt.WithMaxRetries(0), openaiopt.WithHeader("X-Mock-Fault", "reset-after=5"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:    "gpt-4o-mini",
		Messages: joke,
	})
	defer stream.Close()
	n := 0
	for stream.Next() {
		n++
	}
	var ab *client.AbortedError
	if err := stream.Err(); !errors.As(err, &ab) || ab.Code != "upstream_read_error" {
		t.Fatalf("stream: got %v; want an *client.AbortedError upstream_read_error", err)
	}
	if n != 5 {
		t.Errorf("chunks before the abort: got %d; want 5", n)
	}
	if logs := g.Logs(); strings.Contains(logs, "path=/streams/") {
		t.Errorf("a reconnection was made after stream_aborted:\n%s", logs)
	}
}

// openAIClient is openai-go with base URL base+"/v1/", the test's API key
// and client.Transport tr, plus opts.
func openAIClient(base string, tr *client.Transport, opts ...openaiopt.RequestOption) openai.Client {
	return openai.NewClient(append([]openaiopt.RequestOption{
		openaiopt.WithBaseURL(base + "/v1/"),
		openaiopt.WithAPIKey("sk-e2e"),
		openaiopt.WithHTTPClient(&http.Client{Transport: tr}),
	}, opts...)...)
}

// joke is the messages of the tests' chat requests.
var joke = []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a joke")}
