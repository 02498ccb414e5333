package mockllm

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
)

// streamBodies are a streaming request per endpoint.
var streamBodies = []struct{ path, body string }{
	{"/v1/chat/completions", chatStream},
	{"/v1/messages", messagesStream},
	{"/v1/responses", responsesStream},
}

// isTerminal reports whether a raw event is a dialect's clean end.
func isTerminal(ev string) bool {
	return strings.Contains(ev, "data: [DONE]") || strings.Contains(ev, "event: message_stop") ||
		strings.Contains(ev, "event: response.completed")
}

// streamFault posts a streaming request with an X-Mock-Fault and reads events
// until the body ends or fails.
func streamFault(t *testing.T, c *http.Client, url, path, body, fault string) (*http.Response, []string, error) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	req.Header.Set("X-Mock-Fault", fault)
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	evs, err := readEvents(resp.Body)
	return resp, evs, err
}

func TestStatusFault(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{})
	tests := []struct {
		path, fault string
		status      int
		errType     string
		retryAfter  string
	}{
		{"/v1/chat/completions", "status=503", 503, "server_error", ""},
		{"/v1/chat/completions", "status=500", 500, "server_error", ""},
		{"/v1/chat/completions", "status=429", 429, "requests", "1"},
		{"/v1/chat/completions", "status=400", 400, "invalid_request_error", ""},
		{"/v1/responses", "status=502", 502, "server_error", ""},
		{"/v1/messages", "status=529", 529, "overloaded_error", ""},
		{"/v1/messages", "status=429", 429, "rate_limit_error", "1"},
		{"/v1/messages", "status=500", 500, "api_error", ""},
	}
	for _, tt := range tests {
		t.Run(tt.path+" "+tt.fault, func(t *testing.T) {
			a := post(t, url, tt.path, `{"stream":true}`, "X-Mock-Fault: "+tt.fault)
			if a.status != tt.status {
				t.Errorf("status: got %d; want %d", a.status, tt.status)
			}
			if got := a.header.Get("Retry-After"); got != tt.retryAfter {
				t.Errorf("Retry-After: got %q; want %q", got, tt.retryAfter)
			}
			m := decode(t, string(a.body))
			if got := path(m, "error", "type"); got != tt.errType {
				t.Errorf("error type: got %v; want %s (%s)", got, tt.errType, a.body)
			}
			if tt.path == "/v1/messages" && m["type"] != "error" {
				t.Errorf("Anthropic error body: got %s", a.body)
			}
		})
	}
}

func TestResetAfter(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{})
	for _, e := range streamBodies {
		t.Run(e.path, func(t *testing.T) {
			resp, evs, err := streamFault(t, http.DefaultClient, url, e.path, e.body, "reset-after=3")
			if resp == nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("response: got %v, %v; want a 200 stream", resp, err)
			}
			if err == nil {
				t.Errorf("read: got no error; want a reset")
			}
			t.Logf("read error: %v", err)
			if len(evs) != 3 {
				t.Errorf("events: got %d; want 3", len(evs))
			}
		})
	}
	t.Run("non-streaming", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{}`))
		req.Header.Set("X-Mock-Fault", "reset-after=0")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("got %d; want a transport error", resp.StatusCode)
		}
	})
}

func TestEOFAfter(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{})
	for _, e := range streamBodies {
		for _, n := range []int{0, 3, 1000} {
			fault := "eof-after=" + itoa(n)
			t.Run(e.path+" "+fault, func(t *testing.T) {
				_, evs, err := streamFault(t, http.DefaultClient, url, e.path, e.body, fault)
				if err != nil {
					t.Fatalf("%s: read: %v; want a clean end", fault, err)
				}
				if n < 1000 && len(evs) != n {
					t.Errorf("%s: events: got %d; want %d", fault, len(evs), n)
				}
				for _, ev := range evs {
					if isTerminal(ev) {
						t.Errorf("%s: got terminal event %q", fault, ev)
					}
				}
				if n == 1000 && len(evs) < 16 {
					t.Errorf("%s: events: got %d; want all but the terminal one", fault, len(evs))
				}
			})
		}
	}
}

func itoa(n int) string { return string(appendInt(nil, n)) }

func TestErrorAfter(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{})
	tests := []struct {
		path, body string
		tail       []string // the events after the first 3
	}{
		{"/v1/chat/completions", chatStream, []string{
			`data: {"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}` + "\n",
			"data: [DONE]\n",
		}},
		{"/v1/messages", messagesStream, []string{
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n",
		}},
		{"/v1/responses", responsesStream, []string{
			"event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"The server had an error while processing your request. Sorry about that!\",\"param\":null,\"sequence_number\":3}\n",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			_, evs, err := streamFault(t, http.DefaultClient, url, tt.path, tt.body, "error-after=3")
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if len(evs) != 3+len(tt.tail) {
				t.Fatalf("events: got %d; want %d: %q", len(evs), 3+len(tt.tail), evs)
			}
			for i, want := range tt.tail {
				if got := evs[3+i]; got != want {
					t.Errorf("event %d: got %q; want %q", 3+i, got, want)
				}
			}
		})
	}
	t.Run("non-streaming", func(t *testing.T) {
		a := post(t, url, "/v1/chat/completions", `{}`, "X-Mock-Fault: error-after=1")
		if a.status != 500 {
			t.Errorf("status: got %d; want 500", a.status)
		}
	})
}

func TestHang(t *testing.T) {
	t.Parallel()
	s, url := start(t, Config{})
	c := &http.Client{Timeout: 200 * time.Millisecond}
	for _, body := range []string{`{"stream":true}`, `{}`} {
		began := time.Now()
		_, _, err := streamFault(t, c, url, "/v1/chat/completions", body, "hang")
		if err == nil {
			t.Errorf("%s: got an answer; want a client timeout", body)
		}
		if d := time.Since(began); d < 150*time.Millisecond {
			t.Errorf("%s: failed after %v; want the client's timeout", body, d)
		}
	}
	if got := s.Calls(); got != 2 {
		t.Errorf("Calls: got %d; want 2", got)
	}
}

func TestHangAfter(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/messages", strings.NewReader(messagesStream))
	req.Header.Set("X-Mock-Fault", "hang-after=2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	evs, err := readEvents(resp.Body)
	if err == nil {
		t.Error("read: got a clean end; want the client's timeout")
	}
	if len(evs) != 2 {
		t.Errorf("events: got %d; want 2", len(evs))
	}
}

func TestHangLimit(t *testing.T) {
	t.Parallel()
	_, url := start(t, Config{HangLimit: 100 * time.Millisecond})
	_, evs, err := streamFault(t, http.DefaultClient, url, "/v1/chat/completions", chatStream, "hang-after=2")
	if err != nil || len(evs) != 2 {
		t.Errorf("hang-after=2: got %d events, %v; want 2 and a clean end", len(evs), err)
	}
	_, _, err = streamFault(t, http.DefaultClient, url, "/v1/chat/completions", chatStream, "hang")
	if err == nil {
		t.Error("hang: got an answer; want the connection closed without one")
	}
}

// TestInMemory serves Handler from a fasthttp.Server of the caller's own on
// an in-memory listener, with a fasthttp client, as the proxy's tests may.
func TestInMemory(t *testing.T) {
	t.Parallel()
	s := New(Config{Tokens: 3})
	ln := fasthttputil.NewInmemoryListener()
	srv := &fasthttp.Server{Handler: s.Handler}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = s.Close()
		_ = srv.Shutdown()
	})
	c := &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://mock/v1/chat/completions")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetBodyString(chatStream)
	if err := c.Do(req, resp); err != nil {
		t.Fatal(err)
	}
	evs, err := readEvents(bufio.NewReader(strings.NewReader(string(resp.Body()))))
	if err != nil || len(evs) != 6 || evs[5] != "data: [DONE]\n" {
		t.Errorf("got %q, %v; want 6 events ending in [DONE]", evs, err)
	}

	req.Header.Set("X-Mock-Fault", "reset-after=2")
	err = c.Do(req, resp)
	if err == nil && strings.Contains(string(resp.Body()), "[DONE]") {
		t.Error("reset-after=2: got the whole stream")
	}
	if got := s.Calls(); got != 2 {
		t.Errorf("Calls: got %d; want 2", got)
	}
}
