package proxy

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/mcpmock"
)

// TestToolRetries: a keyed tool call is sent again only where the server
// said it did not take it (429, 503) or could not have got it (connect
// error); a 5xx, or a stream that ends without the response, leaves the
// outcome unknown and is never repeated; a 4xx is the server's refusal,
// relayed. Every case counts the server's calls.
func TestToolRetries(t *testing.T) {
	t.Parallel()
	answer := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`)
	}
	first := func(code int) func(int64, http.ResponseWriter, *http.Request) { // code, then the answer
		return func(n int64, w http.ResponseWriter, r *http.Request) {
			if n == 1 {
				status(code)(n, w, r)
				return
			}
			answer(w, r)
		}
	}
	cutStream := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the server died mid-call
	}
	for _, c := range []struct {
		name   string
		script func(n int64, w http.ResponseWriter, r *http.Request)
		calls  int64
		want   string // result, unknown, or a status
	}{
		{"503", first(503), 2, "result"},
		{"429", first(429), 2, "result"},
		{"500", status(500), 1, "unknown"},
		{"502", status(502), 1, "unknown"},
		{"504", status(504), 1, "unknown"},
		{"cut", func(_ int64, w http.ResponseWriter, _ *http.Request) { cutStream(w) }, 1, "unknown"},
		{"404", status(404), 1, "404"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fs := newFaultServer(t, c.script)
			e := &mcpEnv{env: retryEnv(t, []string{fs.url}, func(pc *Config) { pc.MCPPaths = []string{mcpmock.Path} })}
			key := newKey("retry")
			r := e.call(callBody(1, "write", map[string]any{"target": key}, map[string]any{"progressToken": 1}), "Idempotency-Key", key)
			switch c.want {
			case "result":
				wantResult(t, r, 1)
			case "unknown":
				wantUnknown(t, r, 1)
				wantUnknown(t, e.call(callBody(2, "write", map[string]any{"target": key}, nil), "Idempotency-Key", key), 2)
			default:
				if fmt.Sprint(r.status) != c.want {
					t.Fatalf("got %d; want %s", r.status, c.want)
				}
			}
			wantCount(t, "server calls", fs.calls.Load(), c.calls)
		})
	}
}

// TestToolConnectRetried: a call the server could not have received (its
// connection refused) is sent again, to the next upstream.
func TestToolConnectRetried(t *testing.T) {
	t.Parallel()
	refused, _ := refusedAddr(t)
	srv := mcpmock.New(mcpmock.Config{Stateless: true, JSON: true, Delay: 10 * time.Millisecond})
	up, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	e := &mcpEnv{env: retryEnv(t, []string{"http://" + refused, up}, func(pc *Config) { pc.MCPPaths = []string{mcpmock.Path} }), srv: srv}
	key := newKey("connect")
	wantResult(t, e.call(callBody(1, "write", map[string]any{"target": key}, nil), "Idempotency-Key", key), 1)
	e.wantRuns(key, 1)
}
