package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/valyala/fasthttp"
)

// TestOpenAISDK: the official OpenAI Go SDK streams a chat completion
// through ssegate with an Idempotency-Key; a second identical call is
// replayed without an upstream call.
func TestOpenAISDK(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(time.Millisecond, 24))
	client := openai.NewClient(
		option.WithBaseURL(e.url+"/v1/"),
		option.WithAPIKey("sk-test"),
		option.WithHeader("Idempotency-Key", newKey("sdk")),
		option.WithMaxRetries(0),
		// The env's client, whose kept-alive connection the env closes at
		// the end: the server's shutdown would wait for one it did not know.
		option.WithHTTPClient(e.client),
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

// TestWebhookRedelivery: with -key-header webhook-id, a redelivered
// webhook (same id, same body) relayed through ssegate is answered from
// the store and reaches the upstream once.
func TestWebhookRedelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.KeyHeaders = []string{"webhook-id", "X-GitHub-Delivery"}
	})
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"summarize this event"}]}`
	hdr := map[string]string{"webhook-id": "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", "webhook-timestamp": "1674087231"}
	first := e.fetch(req{body: body, header: hdr})
	hdr["webhook-timestamp"] = "1674087299" // redeliveries carry a new timestamp header
	second := e.fetch(req{body: body, header: hdr})
	if first.status != 200 || !second.replayed || string(second.raw) != string(first.raw) {
		t.Fatalf("redelivery: got %d replayed %v same %v; want a replay of the first answer", second.status, second.replayed, string(second.raw) == string(first.raw))
	}
	github := map[string]string{"X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"}
	e.fetch(req{body: body, header: github})
	if got := e.fetch(req{body: body, header: github}); !got.replayed {
		t.Fatalf("GitHub redelivery was not replayed")
	}
	e.wantCalls(2)
}

// TestBodyTooLarge: a body over -max-body gets a JSON 413 and no upstream call.
func TestBodyTooLarge(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) { pc.MaxBodyBytes = 1024 })
	r := e.fetch(req{key: newKey("big"), body: `{"x":"` + strings.Repeat("a", 4096) + `"}`})
	if r.status != 413 || r.errType != "request_too_large" {
		t.Fatalf("got %d %q; want 413 request_too_large", r.status, r.errType)
	}
	e.wantCalls(0)
}

// TestFingerprintWithoutCredential: the key query parameter (a
// credential) is not part of the fingerprint; the rest of the query is.
func TestFingerprintWithoutCredential(t *testing.T) {
	t.Parallel()
	fp := func(uri string) string {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(http.MethodPost)
		ctx.Request.SetRequestURI(uri)
		ctx.Request.SetBodyString(chatBody)
		return fingerprint(&ctx)
	}
	base := fp("/v1/x?alt=sse")
	for _, uri := range []string{"/v1/x?alt=sse&key=A", "/v1/x?key=B&alt=sse", "/v1/x?alt=sse&k%65y=C", "/v1/x?alt=sse&key=A&key=B"} {
		if fp(uri) != base {
			t.Errorf("%s: fingerprint differs from /v1/x?alt=sse; want the key parameter left out", uri)
		}
	}
	for _, uri := range []string{"/v1/x?alt=json&key=A", "/v1/x?alt=sse&keys=A", "/v1/x"} {
		if fp(uri) == base {
			t.Errorf("%s: fingerprint equals /v1/x?alt=sse's; want another", uri)
		}
	}
}

// TestMalformedRequestHidesCredential: a request fasthttp cannot parse is
// answered 400 with a fixed message; neither the answer nor any log line,
// at debug level, carries a byte of the request's credential.
func TestMalformedRequestHidesCredential(t *testing.T) {
	t.Parallel()
	const secret = "sk-secret-XYZ"
	var logs gatetest.LogBuffer
	e := newEnv(t, withConfig(func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}))
	addr := strings.TrimPrefix(e.url, "http://")
	for _, raw := range []string{
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "\r\nno colon here\r\n\r\n",
		"POST /v1/chat/completions?key=" + secret + " HTTP/1.1\r\nHost: x\r\nnocolon\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-api-key: " + secret + "\r\nContent-Length: abc\r\n\r\n",
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		body, _ := io.ReadAll(resp.Body)
		c.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(body), `"invalid_request"`) {
			t.Errorf("%q: got %d %s; want 400 invalid_request", raw, resp.StatusCode, body)
		}
		var head bytes.Buffer
		resp.Header.Write(&head) //nolint:errcheck
		if strings.Contains(string(body)+head.String(), secret) {
			t.Errorf("%q: the answer carries the credential: %s", raw, body)
		}
	}
	// fasthttp logs the connection's error after the answer went out.
	waitFor(t, func() bool { return strings.Count(logs.String(), "msg=fasthttp") == 3 })
	if strings.Contains(logs.String(), secret) {
		t.Fatalf("the log carries the credential:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "malformed request") {
		t.Fatalf("no refusal logged:\n%s", logs.String())
	}
}

// TestHandlerUnderAnyServer: Proxy.Handler served by a plain fasthttp
// server (KeepHijackedConns off, which closes a taken-over connection
// when its handler returns) streams whole answers, keyed and not, and
// keeps the connection alive for the next request; Shutdown then drains.
func TestHandlerUnderAnyServer(t *testing.T) {
	t.Parallel()
	mock, upURL := startMock(t, mockllm.Config{Tokens: 8, Delay: time.Millisecond})
	store := memoryStore(t, cache.Config{})
	p, err := New(Config{Upstreams: []string{upURL}, Store: store, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: p.Handler}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i, key := range []string{"", "any-server", "any-server"} { // relay, miss, hit
		conn.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // a test
		r, _ := http.NewRequest(http.MethodPost, "http://x/v1/chat/completions", strings.NewReader(chatBody))
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		if err := r.Write(conn); err != nil {
			t.Fatalf("request %d on the kept connection: %v", i, err)
		}
		resp, err := http.ReadResponse(br, r)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.HasSuffix(strings.TrimSpace(string(body)), "data: [DONE]") {
			t.Fatalf("request %d: got %d %v, body ending %q; want 200 and a whole stream", i, resp.StatusCode, err, tail(string(body)))
		}
		if resp.Close {
			t.Fatalf("request %d: the connection was not kept alive", i)
		}
	}
	if got := mock.Calls(); got != 2 {
		t.Fatalf("upstream calls: got %d; want 2 (the hit is a replay)", got)
	}
	conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.ShutdownWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with nothing open: %v", err)
	}
}

// TestShutdownAbortsWhatOutlivesTheDrain: a stream still open when the
// drain's time is up ends with stream_aborted, its key is not committed,
// and Shutdown says it had to abort.
func TestShutdownAbortsWhatOutlivesTheDrain(t *testing.T) {
	e := newEnv(t, slowMock(50*time.Millisecond, 200))
	key := newKey("shutdown")
	resp := e.do(req{key: key})
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the stream began
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := e.proxy.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown: got nil; want the drain's timeout, since a stream had to be aborted")
	}
	if took := time.Since(start); took > abortGrace {
		t.Fatalf("Shutdown took %v; want about the drain's 200ms", took)
	}
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), `"stream_aborted"`) || !strings.Contains(string(rest), `"code":"shutdown"`) {
		t.Fatalf("stream after Shutdown ends %q; want stream_aborted with code shutdown", tail(string(rest)))
	}
	e.waitState(key, "", cache.StateFailedRetryable)
}

// TestShutdownAbortAnswersWhole: a keyed request that is not a stream's,
// whose answer the handler waits for to hand to the server
// (answerInHandler), gets the outcome-unknown answer when the drain's time
// is up, and Shutdown returns only once the server is done writing it (a
// process exits then): the answer is already on the client's socket.
func TestShutdownAbortAnswersWhole(t *testing.T) {
	e := newEnv(t, slowMock(50*time.Millisecond, 200)) // a completion of 10 s
	conn, br := dialKept(t, e)
	key := newKey("shutdown-whole")
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(plainBody), plainBody)
	e.waitState(key, "", cache.StateExecutionStarted)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := e.proxy.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown: got nil; want the drain's timeout, since a generation had to be aborted")
	}
	conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond)) // written before Shutdown returned: no wait for it
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer right after Shutdown: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode < 500 || resp.Header.Get(outcomeHeader) != "unknown" || !resp.Close {
		t.Fatalf("got %d, %s %q, close %v, %q (%v); want the outcome-unknown answer whole, and the connection closed after it",
			resp.StatusCode, outcomeHeader, resp.Header.Get(outcomeHeader), resp.Close, body, err)
	}
	e.waitState(key, "", cache.StateCommitUnknown)
}

func tail(s string) string {
	if len(s) > 200 {
		return s[len(s)-200:]
	}
	return s
}
