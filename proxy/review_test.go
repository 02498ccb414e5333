package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
)

// TestAnswersWithoutBody: answers fasthttp gives no body stream for (to a
// HEAD, a 204) are relayed, keyed or not, and the proxy serves on.
func TestAnswersWithoutBody(t *testing.T) {
	fs := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	e := retryEnv(t, []string{fs.url}, nil)
	if got := e.fetch(req{method: http.MethodHead, path: "/v1/models"}); got.status != http.StatusNoContent {
		t.Fatalf("HEAD: got %d; want the upstream's 204", got.status)
	}
	key := newKey("nobody")
	body := `{"model":"m","messages":[]}`
	if got := e.fetch(req{key: key, body: body}); got.status != http.StatusNoContent {
		t.Fatalf("keyed: got %d; want the upstream's 204", got.status)
	}
	if got := e.fetch(req{key: key, body: body}); got.status != http.StatusNoContent || !got.replayed {
		t.Fatalf("keyed repeat: got %d replayed %v; want 204 replayed", got.status, got.replayed)
	}
	wantCount(t, "upstream calls", fs.calls.Load(), 2)
}

// TestAbortWhileAwaitingHead: a generation cut short (shutdown) while its
// call waits for the head ends, with no read of the answer it then drops.
func TestAbortWhileAwaitingHead(t *testing.T) {
	fs := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
		time.Sleep(400 * time.Millisecond)
		okStream(w)
	})
	e := retryEnv(t, []string{fs.url}, func(pc *Config) { pc.HeadTimeout = 5 * time.Second })
	done := make(chan result, 1)
	go func() { done <- e.fetch(req{key: newKey("abort")}) }()
	time.Sleep(150 * time.Millisecond)
	e.proxy.Abort()
	select {
	case got := <-done:
		if got.status != http.StatusServiceUnavailable || got.errType != "shutting_down" {
			t.Fatalf("got %d %q; want 503 shutting_down", got.status, got.errType)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer 5 s after Abort")
	}
	if !within(2*time.Second, func() bool { return e.proxy.streams.Load() == 0 }) {
		t.Fatalf("live generations: %d; want 0", e.proxy.streams.Load())
	}
}

// TestKeepAliveAfterSlowBound: a connection handed back after a
// taken-over answer keeps no write deadline: a later answer on it, which
// fasthttp writes itself past -slow-client-timeout, arrives.
func TestKeepAliveAfterSlowBound(t *testing.T) {
	e := newEnv(t, func(pc *Config, _ *cache.Config, _ *mockllm.Config) { pc.SlowClientTimeout = 300 * time.Millisecond })
	key := newKey("ka")
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	e.fetch(req{key: key, body: body})
	e.waitState(key, "", cache.StateCommitted)
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	send := func(key string) *http.Response {
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("key %.10s: %v", key, err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		return resp
	}
	if resp := send(key); resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("repeat not replayed")
	}
	time.Sleep(800 * time.Millisecond)
	if resp := send(strings.Repeat("x", 300)); resp.StatusCode != http.StatusBadRequest { // fasthttp writes the 400
		t.Fatalf("got %d; want 400", resp.StatusCode)
	}
}

// TestAmbiguousRetryStaysOnItsUpstream: with -retry-ambiguous, the repeat
// of a call that may be running goes to the same upstream (the only one
// that can tell it apart), never fails over to another.
func TestAmbiguousRetryStaysOnItsUpstream(t *testing.T) {
	first := newFaultServer(t, hangUp)
	second := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { okStream(w) })
	e := retryEnv(t, []string{first.url, second.url}, func(pc *Config) { pc.RetryAmbiguous = []string{"*"} })
	got := e.fetch(req{key: newKey("pinned")})
	if got.status != http.StatusBadGateway {
		t.Fatalf("got %d; want 502 after the first upstream's attempts", got.status)
	}
	wantCount(t, "first upstream calls", first.calls.Load(), 3)
	wantCount(t, "second upstream calls", second.calls.Load(), 0)
}
