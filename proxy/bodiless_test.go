package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/valyala/fasthttp"
)

// bodilessUpstream is a real HTTP upstream whose answers have no body:
// to HEAD, 204, 304, a 103 before its 200, and a connection cut before
// any answer (for ssegate's own error). calls counts the requests that
// reached it.
func bodilessUpstream(t *testing.T, calls *atomic.Int64) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/plain", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "hello world") //nolint:errcheck
	})
	mux.HandleFunc("/events", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: hi\n\n") //nolint:errcheck
	})
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, _ *http.Request) { okStream(w) })
	mux.HandleFunc("/mcp", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("/204", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream") // a body it says, and has none
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/204plain", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/304", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("ETag", `"v1"`)
		w.WriteHeader(http.StatusNotModified)
	})
	mux.HandleFunc("/103", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, plainJSON) //nolint:errcheck
	})
	mux.HandleFunc("/cut", func(w http.ResponseWriter, _ *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close()
		}
	})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	return up
}

// exchange is one request on a kept connection and its answer, read
// whole as a client reads it.
type exchange struct {
	method, path, key string
}

func (x exchange) send(t *testing.T, conn net.Conn, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	body := ""
	switch {
	case x.path == "/v1/chat/completions":
		body = chatBody
	case x.method == http.MethodPost:
		body = `{"model":"m","input":"no stream"}` // a stream was not asked for: any 2xx is an answer
	}
	key := ""
	if x.key != "" {
		key = "Idempotency-Key: " + x.key + "\r\n"
	}
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		x.method, x.path, key, len(body), body)
	resp, err := http.ReadResponse(br, &http.Request{Method: x.method})
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", x.method, x.path, err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", x.method, x.path, err)
	}
	return resp, string(b)
}

// TestBodilessAnswersKeepTheConnection: an answer that has no body (to
// a HEAD, relayed or ssegate's own error; a 204; a 304; the 200 after an
// upstream's 103, which is not relayed) carries none on the wire, keyed
// or not, first or replayed, so that the client's next request on the
// same connection gets its own answer, whole.
func TestBodilessAnswersKeepTheConnection(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	up := bodilessUpstream(t, &calls)
	e := newEnvUpstream(t, up.URL, nil, Config{MCPPaths: []string{"/mcp"}}, cache.Config{})
	// The proxy's own server, and another fasthttp server running its
	// Handler (whose connections the proxy serves itself after an answer
	// it wrote on them).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	other := &fasthttp.Server{Handler: e.proxy.Handler}
	go other.Serve(ln)                     //nolint:errcheck // ends with Shutdown
	t.Cleanup(func() { other.Shutdown() }) //nolint:errcheck // a test
	jsonError := func(r *http.Response) string {
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			return "Content-Type " + ct + "; want application/json"
		}
		return ""
	}
	length := func(n int64) func(*http.Response) string {
		return func(r *http.Response) string {
			if r.ContentLength != n {
				return fmt.Sprintf("Content-Length %d; want %d", r.ContentLength, n)
			}
			return ""
		}
	}
	replayed := func(r *http.Response) string {
		if r.Header.Get("Idempotent-Replayed") != "true" {
			return "not marked replayed"
		}
		return ""
	}
	type testCase struct {
		name  string
		steps []exchange
		wants []bodilessWant
		calls int64 // upstream calls the steps make
	}
	cases := func() []testCase {
		streamKey := newKey("bodiless-stream")
		return []testCase{
			{"head relayed", []exchange{{method: "HEAD", path: "/plain"}}, []bodilessWant{{status: 200, check: length(11)}}, 1},
			{"head of an event stream", []exchange{{method: "HEAD", path: "/events"}}, []bodilessWant{{status: 200}}, 1},
			{"head with a key", []exchange{{method: "HEAD", path: "/plain", key: newKey("bodiless")}}, []bodilessWant{{status: 200, check: length(11)}}, 1},
			{"head on an mcp path", []exchange{{method: "HEAD", path: "/mcp"}}, []bodilessWant{{status: 200}}, 1},
			{"head error", []exchange{{method: "HEAD", path: "/cut"}}, []bodilessWant{{status: 502, check: jsonError}}, 1},
			{"head refused", []exchange{{method: "HEAD", path: "/streams/nothing-here"}}, []bodilessWant{{status: 404, check: jsonError}}, 0},
			{"204", []exchange{{method: "POST", path: "/204"}}, []bodilessWant{{status: 204}}, 1},
			{"204 plain", []exchange{{method: "POST", path: "/204plain"}}, []bodilessWant{{status: 204}}, 1},
			{"304", []exchange{{method: "GET", path: "/304"}}, []bodilessWant{{status: 304}}, 1},
			{"103 then 200", []exchange{{method: "POST", path: "/103"}}, []bodilessWant{{200, nil, plainJSON}}, 1},
			{"204 keyed and replayed", func() []exchange {
				k := newKey("bodiless")
				return []exchange{{method: "POST", path: "/204", key: k}, {method: "POST", path: "/204", key: k}}
			}(), []bodilessWant{{status: 204}, {status: 204, check: replayed}}, 1},
			{"304 keyed", []exchange{{method: "POST", path: "/304", key: newKey("bodiless")}}, []bodilessWant{{status: 304}}, 1},
			{"103 keyed and replayed", func() []exchange {
				k := newKey("bodiless")
				return []exchange{{method: "POST", path: "/103", key: k}, {method: "POST", path: "/103", key: k}}
			}(), []bodilessWant{{200, length(int64(len(plainJSON))), plainJSON}, {200, replayed, plainJSON}}, 1},
			{"head of a stream to resume", []exchange{
				{method: "POST", path: "/v1/chat/completions", key: streamKey},
				{method: "HEAD", path: "/streams/" + streamKey},
			}, []bodilessWant{{status: 200}, {status: 200}}, 1},
		}
	}
	for _, addr := range []struct{ name, addr string }{
		{"own", strings.TrimPrefix(e.url, "http://")}, {"another", ln.Addr().String()},
	} {
		for _, c := range cases() {
			t.Run(addr.name+"/"+c.name, func(t *testing.T) { bodilessCase(t, addr.addr, &calls, c.steps, c.wants, c.calls) })
		}
	}
}

// bodilessWant is what one answer must be.
type bodilessWant struct {
	status int
	check  func(*http.Response) string // "" when the answer is right
	body   string                      // the body, when not ""
}

// bodilessCase sends steps on one connection to addr, checks each answer
// against wants and the upstream calls they made, then, whatever it
// found, that the connection's next request gets its own answer, whole.
func bodilessCase(t *testing.T, addr string, calls *atomic.Int64, steps []exchange, wants []bodilessWant, ncalls int64) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second)) //nolint:errcheck
	br := bufio.NewReader(conn)
	before := calls.Load()
	for i, x := range steps {
		resp, body := x.send(t, conn, br)
		w := wants[i]
		if resp.StatusCode != w.status {
			t.Errorf("%s %s: got %d %q; want %d", x.method, x.path, resp.StatusCode, body, w.status)
		}
		if w.body != "" && body != w.body {
			t.Errorf("%s %s: got body %q; want %q", x.method, x.path, body, w.body)
		}
		if w.check != nil {
			if msg := w.check(resp); msg != "" {
				t.Errorf("%s %s: %s", x.method, x.path, msg)
			}
		}
		if resp.Close {
			t.Errorf("%s %s: the answer closes the connection", x.method, x.path)
		}
	}
	if got := calls.Load() - before; got != ncalls {
		t.Errorf("upstream calls: got %d; want %d", got, ncalls)
	}
	// The next request on the same connection gets its own answer,
	// whole: no byte of an earlier answer is left before it.
	next := exchange{method: "GET", path: "/plain"}
	resp, body := next.send(t, conn, br)
	if resp.StatusCode != 200 || body != "hello world" {
		t.Fatalf("the next request on the connection: got %d %q; want 200 \"hello world\"", resp.StatusCode, body)
	}
}
