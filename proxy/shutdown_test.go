package proxy

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/valyala/fasthttp"
)

// TestHandlerUnderAnyServer: Proxy.Handler served by a plain fasthttp
// server (KeepHijackedConns off, which closes a taken-over connection
// when its handler returns) streams whole answers, keyed and not, and
// keeps the connection alive for the next request; Shutdown then drains.
func TestHandlerUnderAnyServer(t *testing.T) {
	mock := mockllm.New(mockllm.Config{Tokens: 8, Delay: time.Millisecond})
	upURL, err := mock.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mock.Close()
	store, err := cache.NewMemory(cache.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
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

func tail(s string) string {
	if len(s) > 200 {
		return s[len(s)-200:]
	}
	return s
}
