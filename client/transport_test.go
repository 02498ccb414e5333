package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/client"
	"github.com/ssegate/ssegate/internal/poll"
)

// fast is a Transport with short backoffs, for tests.
func fast() *client.Transport {
	return &client.Transport{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
}

// opaque hides a reader's type, so that http.NewRequest sets no GetBody and
// the Transport has to buffer the body itself.
type opaque struct{ io.Reader }

type recorder struct {
	mu     sync.Mutex
	keys   []string
	bodies []string
}

func (r *recorder) add(req *http.Request) int {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, req.Header.Get("Idempotency-Key"))
	r.bodies = append(r.bodies, string(b))
	return len(r.keys)
}

func (r *recorder) snapshot() ([]string, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.keys...), append([]string(nil), r.bodies...)
}

func post(t *testing.T, tr http.RoundTripper, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, opaque{strings.NewReader(body)})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestRetry503ThenSuccess: two 503s (one with Retry-After: 0) then a 200;
// the caller gets the 200, and the three attempts carry one fresh key and
// the whole body each.
func TestRetry503ThenSuccess(t *testing.T) {
	t.Parallel()
	var rec recorder
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch rec.add(r) {
		case 1:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			io.WriteString(w, `{"ok":true}`)
		}
	}))
	defer srv.Close()
	resp := post(t, fast(), srv.URL+"/v1/chat/completions", `{"model":"m"}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != `{"ok":true}` {
		t.Fatalf("got %d %q; want 200 {\"ok\":true}", resp.StatusCode, b)
	}
	keys, bodies := rec.snapshot()
	if len(keys) != 3 {
		t.Fatalf("attempts: got %d; want 3", len(keys))
	}
	for i := range keys {
		if keys[i] == "" || keys[i] != keys[0] {
			t.Errorf("attempt %d: key %q; want %q, the same on every attempt", i+1, keys[i], keys[0])
		}
		if bodies[i] != `{"model":"m"}` {
			t.Errorf("attempt %d: body %q; want the whole body", i+1, bodies[i])
		}
	}
}

// TestRetriesExhausted: a 503 on every attempt; after MaxAttempts the
// caller gets the last 503 as it came.
func TestRetriesExhausted(t *testing.T) {
	t.Parallel()
	var rec recorder
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "down")
	}))
	defer srv.Close()
	tr := fast()
	tr.MaxAttempts = 4
	resp := post(t, tr, srv.URL, "x")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || string(b) != "down" {
		t.Errorf("got %d %q; want 503 down", resp.StatusCode, b)
	}
	if keys, _ := rec.snapshot(); len(keys) != 4 {
		t.Errorf("attempts: got %d; want 4", len(keys))
	}
}

// TestRetryConnectionError: the first connection is closed before any
// answer; the request is sent again and succeeds.
func TestRetryConnectionError(t *testing.T) {
	t.Parallel()
	var rec recorder
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rec.add(r) == 1 {
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	resp := post(t, fast(), srv.URL, "x")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Errorf("got %q; want ok", b)
	}
	if keys, _ := rec.snapshot(); len(keys) != 2 || keys[0] != keys[1] {
		t.Errorf("attempts: got keys %q; want two, equal", keys)
	}
}

// TestNoRetryOn400: a 400 is returned at once, with no second attempt.
func TestNoRetryOn400(t *testing.T) {
	t.Parallel()
	// 400, and ssegate's 502 and 504: answers whose generation may have
	// run (the outcome is unknown, the key free), so that a repeat could
	// be a second paid generation.
	for _, code := range []int{http.StatusBadRequest, http.StatusBadGateway, http.StatusGatewayTimeout} {
		var rec recorder
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rec.add(r)
			w.WriteHeader(code)
		}))
		resp := post(t, fast(), srv.URL, "x")
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != code {
			t.Errorf("status: got %d; want %d", resp.StatusCode, code)
		}
		if keys, _ := rec.snapshot(); len(keys) != 1 {
			t.Errorf("%d: attempts: got %d; want 1", code, len(keys))
		}
	}
}

// TestNoRetryOnOutcomeUnknown: an answer carrying Ssegate-Outcome:
// unknown is returned at once whatever its status, even one the Transport
// otherwise retries (500, 503, with Retry-After or not): the request went
// upstream and may have run.
func TestNoRetryOnOutcomeUnknown(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusInternalServerError, http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		var rec recorder
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rec.add(r)
			w.Header().Set(client.OutcomeHeader, "unknown")
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(code)
		}))
		resp := post(t, fast(), srv.URL, "x")
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != code || !client.OutcomeUnknown(resp) {
			t.Errorf("%d: got %d, marked %v; want the marked answer as it came", code, resp.StatusCode, client.OutcomeUnknown(resp))
		}
		if keys, _ := rec.snapshot(); len(keys) != 1 {
			t.Errorf("%d: attempts: got %d; want 1", code, len(keys))
		}
	}
}

// TestKeyPinned: a key pinned to the context is sent on every request made
// with it (the retries included); a request's own header wins; two POSTs
// without either get two different keys.
func TestKeyPinned(t *testing.T) {
	t.Parallel()
	var rec recorder
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rec.add(r) == 1 {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	// A fresh connection per request: a kept-alive one that breaks under
	// a loaded machine is a transport error, which both net/http (the
	// request carries an Idempotency-Key) and the Transport retry, so the
	// server would count a request more than the test makes.
	tr := fast()
	tr.Base = &http.Transport{DisableKeepAlives: true}
	c := &http.Client{Transport: tr}
	ctx := client.WithIdempotencyKey(t.Context(), "intent-1")
	do := func(req *http.Request) {
		t.Helper()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for range 2 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
		do(req)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "own")
	do(req)
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		do(req)
	}
	keys, _ := rec.snapshot()
	if len(keys) != 6 {
		t.Fatalf("requests: got %d; want 6", len(keys))
	}
	if keys[0] != "intent-1" || keys[1] != "intent-1" || keys[2] != "intent-1" {
		t.Errorf("pinned: got %q; want intent-1 on the 429, its retry and the next request", keys[:3])
	}
	if keys[3] != "own" {
		t.Errorf("own header: got %q; want own", keys[3])
	}
	if keys[4] == "" || keys[5] == "" || keys[4] == keys[5] {
		t.Errorf("fresh keys: got %q and %q; want two different keys", keys[4], keys[5])
	}
}

// events returns the SSE events with ids 7-from..7-to, the last being
// [DONE] when it is n+1.
func events(from, to, n int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		if i == n+1 {
			fmt.Fprintf(&b, "id: 7-%d\ndata: [DONE]\n\n", i)
			continue
		}
		fmt.Fprintf(&b, "id: 7-%d\ndata: {\"tok\":%d}\n\n", i, i)
	}
	return b.String()
}

// cut answers with a chunked event stream of the chunks, then closes the
// connection without the last chunk: the client's read fails with
// io.ErrUnexpectedEOF.
func cut(w http.ResponseWriter, chunks ...string) { cutHead(w, "", chunks...) }

// cutHead is cut with head's lines ("Name: value\r\n" each) added to the
// answer's head.
func cutHead(w http.ResponseWriter, head string, chunks ...string) {
	c, bw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	defer c.Close()
	bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n" + head + "\r\n")
	for _, s := range chunks {
		fmt.Fprintf(bw, "%x\r\n%s\r\n", len(s), s)
		bw.Flush()
	}
	bw.Flush()
}

type resumes struct {
	mu    sync.Mutex
	paths []string
	ids   []string
	auths []string
}

func (r *resumes) add(req *http.Request) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.paths = append(r.paths, req.URL.EscapedPath())
	r.ids = append(r.ids, req.Header.Get("Last-Event-ID"))
	r.auths = append(r.auths, req.Header.Get("Authorization"))
	return len(r.paths)
}

// n is the number of reconnections so far; the server's handler may still
// be running when a test asks.
func (r *resumes) n() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.paths)
}

// streamServer answers the POST with post and GET /streams/ with get.
func streamServer(t *testing.T, post, get func(http.ResponseWriter, *http.Request)) (*httptest.Server, *resumes, *recorder) {
	var rs resumes
	var rec recorder
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/streams/") {
			rs.add(r)
			get(w, r)
			return
		}
		rec.add(r)
		post(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &rs, &rec
}

func stream(t *testing.T, tr http.RoundTripper, url, key string) (string, error) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
	req.Header.Set("Authorization", "Bearer sk-1")
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got strings.Builder
	_, err = io.Copy(&got, resp.Body)
	return got.String(), err
}

// TestResumeMidEvent: the connection breaks in the middle of the fourth
// event; the body passes on the three whole events, reconnects with
// GET /streams/{key} (path-escaped), Last-Event-ID 7-3 and the credential,
// and goes on: the reader gets every event once, in order.
func TestResumeMidEvent(t *testing.T) {
	t.Parallel()
	half := events(4, 4, 8)[:9]
	srv, rs, _ := streamServer(t,
		func(w http.ResponseWriter, r *http.Request) { cut(w, events(1, 2, 8), events(3, 3, 8)+half) },
		func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Last-Event-ID") != "7-3" {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, events(4, 9, 8))
		})
	got, err := stream(t, fast(), srv.URL, "k/1 x")
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if want := events(1, 9, 8); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if len(rs.paths) != 1 || rs.paths[0] != "/streams/k%2F1%20x" || rs.ids[0] != "7-3" || rs.auths[0] != "Bearer sk-1" {
		t.Errorf("resumes: paths %q, Last-Event-IDs %q, Authorization %q; want one, /streams/k%%2F1%%20x, 7-3, Bearer sk-1", rs.paths, rs.ids, rs.auths)
	}
}

// TestResumeWholeEventsOnly: a reader sees no byte of an event before its
// blank line arrived, so a cut never hands it half an event.
func TestResumeWholeEventsOnly(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv, _, _ := streamServer(t,
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "id: 7-1\ndata: {\"a\":")
			w.(http.Flusher).Flush()
			<-release
			io.WriteString(w, "1}\n\n")
		},
		nil)
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	resp, err := (&http.Client{Transport: fast()}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make(chan string, 1)
	go func() {
		b := make([]byte, 100)
		n, _ := resp.Body.Read(b)
		first <- string(b[:n])
	}()
	select {
	case s := <-first:
		t.Fatalf("read %q before the event's end", s)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if s := <-first; s != "id: 7-1\ndata: {\"a\":1}\n\n" {
		t.Errorf("got %q; want the whole event", s)
	}
}

// TestResumeGone: a 410 to the reconnection ends the body with
// ErrStreamGone, after the whole events before the cut.
func TestResumeGone(t *testing.T) {
	t.Parallel()
	srv, _, _ := streamServer(t,
		func(w http.ResponseWriter, r *http.Request) { cut(w, events(1, 3, 8)+"id: 7-4\nda") },
		func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusGone)
			io.WriteString(w, `{"error":{"type":"stream_gone","message":"gone"}}`)
		})
	got, err := stream(t, fast(), srv.URL, "k")
	if !errors.Is(err, client.ErrStreamGone) {
		t.Errorf("error: got %v; want ErrStreamGone", err)
	}
	if want := events(1, 3, 8); got != want {
		t.Errorf("got %q; want %q", got, want)
	}
}

// TestAborted: ssegate's stream_aborted event ends the body with an
// *AbortedError carrying its code and message; the event itself is not
// passed on, the events before it are; nothing reconnects.
func TestAborted(t *testing.T) {
	t.Parallel()
	srv, rs, _ := streamServer(t,
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, events(1, 2, 8)+"event: error\ndata: {\"error\":{\"type\":\"stream_aborted\",\"code\":\"upstream_read_error\",\"message\":\"reset\"}}\n\n")
		},
		func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusGone) })
	got, err := stream(t, fast(), srv.URL, "k")
	var ab *client.AbortedError
	if !errors.As(err, &ab) || ab.Code != "upstream_read_error" || ab.Message != "reset" {
		t.Fatalf("error: got %v; want an *AbortedError upstream_read_error: reset", err)
	}
	if want := events(1, 2, 8); got != want {
		t.Errorf("got %q; want %q", got, want)
	}
	if rs.n() != 0 {
		t.Errorf("resumes: got %d; want none", rs.n())
	}
}

// TestReconnectsBounded: every reconnection is cut before an event; after
// MaxReconnects of them the body ends with an error matching
// ErrReconnectLimit; and 5xx answers to a reconnection count the same.
func TestReconnectsBounded(t *testing.T) {
	t.Parallel()
	var n int
	var mu sync.Mutex
	srv, rs, _ := streamServer(t,
		func(w http.ResponseWriter, r *http.Request) { cut(w, events(1, 1, 8)) },
		func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			n++
			odd := n%2 == 1
			mu.Unlock()
			if odd {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			cut(w, "id: 7-2\n")
		})
	tr := fast()
	tr.MaxReconnects = 3
	got, err := stream(t, tr, srv.URL, "k")
	if !errors.Is(err, client.ErrReconnectLimit) {
		t.Errorf("error: got %v; want ErrReconnectLimit", err)
	}
	if want := events(1, 1, 8); got != want {
		t.Errorf("got %q; want %q", got, want)
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if len(rs.paths) != 3 {
		t.Errorf("reconnections: got %d; want 3", len(rs.paths))
	}
	for i, id := range rs.ids {
		if id != "7-1" {
			t.Errorf("reconnection %d: Last-Event-ID %q; want 7-1", i+1, id)
		}
	}
}

// TestNoResumeAfterTerminal: a cut after the terminal event of each
// dialect ([DONE], Anthropic's message_stop, the Responses API's
// response.completed) is the stream's end: the body ends cleanly, with no
// reconnection. A cut after an event that only looks like one (a chunk
// whose text says message_stop) is resumed.
func TestNoResumeAfterTerminal(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, body string
		resumes    int
	}{
		{"done", events(1, 3, 2), 0},
		{"message_stop", "id: 7-1\nevent: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\nid: 7-2\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", 0},
		{"response.completed", "id: 7-1\nevent: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}\n\nid: 7-2\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{}}\n\n", 0},
		{"not terminal", "id: 7-1\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"message_stop\"}}]}\n\n", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv, rs, _ := streamServer(t,
				func(w http.ResponseWriter, r *http.Request) { cut(w, c.body) },
				func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusGone) })
			got, err := stream(t, fast(), srv.URL, "k")
			if c.resumes == 0 && (err != nil || got != c.body) {
				t.Errorf("got %q, %v; want the whole stream, nil", got, err)
			}
			if rs.n() != c.resumes {
				t.Errorf("resumes: got %d; want %d", rs.n(), c.resumes)
			}
		})
	}
}

// TestResumeKeepsOwnLastEventID: a POST that itself resumes (it carries
// Last-Event-ID 7-2) and is cut before any event reconnects from 7-2, not
// from the stream's start.
func TestResumeKeepsOwnLastEventID(t *testing.T) {
	t.Parallel()
	srv, rs, _ := streamServer(t,
		func(w http.ResponseWriter, r *http.Request) { cut(w, "id: 7-3\ndata: {") },
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, events(3, 4, 3))
		})
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Set("Last-Event-ID", "7-2")
	resp, err := (&http.Client{Transport: fast()}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil || string(got) != events(3, 4, 3) {
		t.Errorf("got %q, %v; want %q, nil", got, err, events(3, 4, 3))
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if len(rs.ids) != 1 || rs.ids[0] != "7-2" {
		t.Errorf("reconnections' Last-Event-ID: got %q; want [7-2]", rs.ids)
	}
}

// TestRetryAfterBounded: a 503 whose Retry-After is over MaxRetryAfter is
// returned at once, not waited for.
func TestRetryAfterBounded(t *testing.T) {
	t.Parallel()
	var rec recorder
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	start := time.Now()
	resp := post(t, fast(), srv.URL, "x")
	resp.Body.Close()
	if resp.StatusCode != 503 || time.Since(start) > 5*time.Second {
		t.Errorf("got %d after %v; want 503 at once", resp.StatusCode, time.Since(start))
	}
	if keys, _ := rec.snapshot(); len(keys) != 1 {
		t.Errorf("attempts: got %d; want 1", len(keys))
	}
}

// TestLargeBodySentOnce: a body over MaxBodyBuffer without GetBody is sent
// whole, once: a 503 to it is not retried.
func TestLargeBodySentOnce(t *testing.T) {
	t.Parallel()
	var rec recorder
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	tr := fast()
	tr.MaxBodyBuffer = 4
	resp := post(t, tr, srv.URL, "0123456789")
	resp.Body.Close()
	keys, bodies := rec.snapshot()
	if len(keys) != 1 || bodies[0] != "0123456789" {
		t.Errorf("attempts: got bodies %q; want one, whole", bodies)
	}
}

// TestCallerLeaves: a caller that stops reading mid-stream, by closing
// the body from another goroutine while a Read waits or by cancelling the
// request's context, ends the body with an error, and nothing reconnects.
func TestCallerLeaves(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		leave func(body io.Closer, cancel func())
	}{
		{"close", func(body io.Closer, _ func()) { body.Close() }},
		{"cancel", func(_ io.Closer, cancel func()) { cancel() }},
	} {
		t.Run(c.name, func(t *testing.T) { // one at a time: readWaits tells them apart by the test's name only
			left := make(chan struct{})
			srv, rs, rec := streamServer(t,
				func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, events(1, 1, 8))
					w.(http.Flusher).Flush()
					select {
					case <-r.Context().Done(): // the caller's connection went away
					case <-time.After(10 * time.Second):
						t.Error("the connection stayed open after the caller left")
					}
					close(left)
				},
				func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusGone) })
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
			req.Header.Set("Idempotency-Key", "k")
			resp, err := (&http.Client{Transport: fast()}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b := make([]byte, 100)
			if n, err := resp.Body.Read(b); err != nil || string(b[:n]) != events(1, 1, 8) {
				t.Fatalf("first read: got %q, %v; want the first event", b[:n], err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := resp.Body.Read(b)
				done <- err
			}()
			poll.For(t, 5*time.Second, "the Read waits for bytes", func() bool { return readWaits("TestCallerLeaves") })
			c.leave(resp.Body, cancel)
			select {
			case err := <-done:
				if err == nil || err == io.EOF {
					t.Errorf("read after leaving: got %v; want an error", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the waiting Read did not return after the caller left")
			}
			<-left
			rs.mu.Lock()
			defer rs.mu.Unlock()
			if len(rs.paths) != 0 {
				t.Errorf("reconnections: got %d; want none", len(rs.paths))
			}
			if keys, _ := rec.snapshot(); len(keys) != 1 {
				t.Errorf("requests: got %d; want 1", len(keys))
			}
		})
	}
}

// readWaits reports whether a goroutine that test started is blocked in a
// resumed body's Read, waiting for the network.
func readWaits(test string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		head, _, _ := strings.Cut(g, "\n")
		if strings.Contains(head, "[IO wait") && strings.Contains(g, "client.(*resumeBody).Read") &&
			strings.Contains(g, "created by github.com/ssegate/ssegate/client_test."+test+".") {
			return true
		}
	}
	return false
}

// TestResumeCarriesCredentials: a reconnection carries every credential
// ssegate scopes keys by, not only Authorization: Anthropic's x-api-key,
// Azure's api-key, Gemini's x-goog-api-key and its ?key= query parameter,
// so that it reaches the same tenant's stream.
func TestResumeCarriesCredentials(t *testing.T) {
	t.Parallel()
	type creds struct{ xAPIKey, apiKey, goog, query string }
	got := make(chan creds, 4)
	srv, _, _ := streamServer(t,
		func(w http.ResponseWriter, r *http.Request) { cut(w, events(1, 1, 2)) },
		func(w http.ResponseWriter, r *http.Request) {
			got <- creds{r.Header.Get("X-Api-Key"), r.Header.Get("Api-Key"), r.Header.Get("X-Goog-Api-Key"), r.URL.Query().Get("key")}
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, events(2, 3, 2))
		})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages?key=g-1", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Set("X-Api-Key", "sk-ant-1")
	req.Header.Set("Api-Key", "az-1")
	req.Header.Set("X-Goog-Api-Key", "goog-1")
	resp, err := (&http.Client{Transport: fast()}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != events(1, 3, 2) {
		t.Fatalf("got %q, %v; want the whole stream, nil", b, err)
	}
	want := creds{"sk-ant-1", "az-1", "goog-1", "g-1"}
	select {
	case c := <-got:
		if c != want {
			t.Errorf("reconnection's credentials: got %+v; want %+v", c, want)
		}
	default:
		t.Fatal("no reconnection")
	}
}
