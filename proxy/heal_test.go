package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
)

const (
	bgBody     = `{"model":"gpt-4o-mini","input":"Tell me a joke","stream":true,"background":true}`
	fgBody     = `{"model":"gpt-4o-mini","input":"Tell me a joke","stream":true}`
	resetAfter = "reset-after=5"
)

// wantWholeResponses checks that a Responses stream came whole: every
// sequence number once, from 0, contiguous, ending with
// response.completed of one response id.
func wantWholeResponses(t *testing.T, got result, events int) {
	t.Helper()
	if got.status != 200 || got.aborted {
		t.Fatalf("status %d, aborted %v; want a whole stream: %s", got.status, got.aborted, got.raw)
	}
	if len(got.events) != events {
		t.Fatalf("%d events; want %d", len(got.events), events)
	}
	var id string
	for i, ev := range got.events {
		var v struct {
			Type     string `json:"type"`
			Seq      *int   `json:"sequence_number"`
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(ev.Data), &v); err != nil {
			t.Fatalf("event %d: %v: %s", i, err, ev.Data)
		}
		if v.Seq == nil || *v.Seq != i {
			t.Fatalf("event %d (%s): sequence_number %v; want %d", i, v.Type, v.Seq, i)
		}
		if v.Response.ID != "" {
			if id != "" && v.Response.ID != id {
				t.Fatalf("event %d: response %q; want %q", i, v.Response.ID, id)
			}
			id = v.Response.ID
		}
		if i == len(got.events)-1 && v.Type != "response.completed" {
			t.Fatalf("last event %s; want response.completed", v.Type)
		}
	}
}

// TestHealBackground: a background Responses stream whose upstream
// connection is reset after 5 events is resumed from its last sequence
// number: the client gets every event once, in order, no abort; the key
// is committed and replays the same stream; the upstream ran one
// generation (one call, one resume), and the heal is counted. The same
// holds for a request without a key.
func TestHealBackground(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	events := 16 + 8 // the mock's 16 tokens, and Responses' 8 other events
	key := newKey("heal")
	r := req{path: "/v1/responses", key: key, body: bgBody, header: map[string]string{"X-Mock-Fault": resetAfter}}
	got := e.fetch(r)
	wantWholeResponses(t, got, events)
	e.waitState(key, "", cache.StateCommitted)
	wantCount(t, "generations", e.mock.Generations(), 1)
	wantCount(t, "calls", e.mock.Calls(), 1)
	wantCount(t, "resumes", e.mock.Resumes(), 1)
	if v := metricValue(t, e.scrape(), `ssegate_upstream_resumes_total{outcome="resumed"}`); v != 1 {
		t.Errorf("resumes resumed: %v; want 1", v)
	}

	again := e.fetch(r)
	if !again.replayed || string(eventBytes(again.raw)) != string(eventBytes(got.raw)) {
		t.Errorf("replay: replayed %v, same events %v", again.replayed, string(eventBytes(again.raw)) == string(eventBytes(got.raw)))
	}
	wantCount(t, "calls after the replay", e.mock.Calls(), 1)

	r.key = ""
	wantWholeResponses(t, e.fetch(r), events)
	wantCount(t, "generations", e.mock.Generations(), 2)
	wantCount(t, "resumes", e.mock.Resumes(), 2)
}

// TestHealIdleTimeout: a background stream that goes silent past
// -upstream-idle-timeout after 5 events is resumed like a reset one.
func TestHealIdleTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withConfig(func(pc *Config) { pc.UpstreamIdleTimeout = 300 * time.Millisecond }))
	key := newKey("heal-idle")
	got := e.fetch(req{path: "/v1/responses", key: key, body: bgBody, header: map[string]string{"X-Mock-Fault": "hang-after=5"}})
	wantWholeResponses(t, got, 16+8)
	e.waitState(key, "", cache.StateCommitted)
	wantCount(t, "generations", e.mock.Generations(), 1)
	wantCount(t, "resumes", e.mock.Resumes(), 1)
}

// abortCode is the code of the stream_aborted event that ended got.
func abortCode(t *testing.T, got result) string {
	t.Helper()
	if !got.aborted {
		t.Fatalf("not aborted: %s", got.raw)
	}
	var v struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(got.events[len(got.events)-1].Data), &v); err != nil {
		t.Fatal(err)
	}
	return v.Error.Code
}

// TestHealNotBackground: a Responses stream not made in background mode
// has no resume: reset mid-stream, it aborts as before, and nothing is
// resumed.
func TestHealNotBackground(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	key := newKey("heal-fg")
	got := e.fetch(req{path: "/v1/responses", key: key, body: fgBody, header: map[string]string{"X-Mock-Fault": resetAfter}})
	if c := abortCode(t, got); c != "upstream_read_error" {
		t.Errorf("abort code %q; want upstream_read_error", c)
	}
	e.waitState(key, "", cache.StateFailedRetryable)
	wantCount(t, "resumes", e.mock.Resumes(), 0)
	wantCount(t, "generations", e.mock.Generations(), 1)
}

// TestHealRefused: when the upstream no longer knows the response (404
// to the resume), the stream aborts with heal_refused and the key is
// free.
func TestHealRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	key := newKey("heal-refused")
	resp := e.do(req{path: "/v1/responses", key: key, body: bgBody,
		header: map[string]string{"X-Mock-Fault": resetAfter, "X-Mock-Delay": "50ms"}})
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("before the first event: %v", err)
		}
		if strings.HasPrefix(line, "id: ") {
			break
		}
	}
	e.mock.ForgetResponses() // before the reset, 5 events in
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rest), `"stream_aborted"`) || !strings.Contains(string(rest), `"code":"heal_refused"`) {
		t.Errorf("the stream did not end with stream_aborted heal_refused: %s", rest)
	}
	if ki := e.waitState(key, "", cache.StateFailedRetryable); ki.Reason != "heal_refused" {
		t.Errorf("reason %q; want heal_refused", ki.Reason)
	}
	wantCount(t, "resumes", e.mock.Resumes(), 0)
	if v := metricValue(t, e.scrape(), `ssegate_upstream_resumes_total{outcome="refused"}`); v != 1 {
		t.Errorf("resumes refused: %v; want 1", v)
	}
}

// TestHealNeverChat: a chat completion stream has no provider-side
// resume and is never healed, "background" or not.
func TestHealNeverChat(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	body := `{"model":"gpt-4o-mini","stream":true,"background":true,"messages":[{"role":"user","content":"hi"}]}`
	got := e.fetch(req{body: body, header: map[string]string{"X-Mock-Fault": resetAfter}})
	if c := abortCode(t, got); c != "upstream_read_error" {
		t.Errorf("abort code %q; want upstream_read_error", c)
	}
	wantCount(t, "resumes", e.mock.Resumes(), 0)
	wantCount(t, "calls", e.mock.Calls(), 1)
}

// bgEvents is a background Responses stream of a scripted upstream, by
// sequence number.
var bgEvents = []string{
	`event: response.created` + "\n" + `data: {"type":"response.created","response":{"id":"resp_abc","status":"in_progress","background":true},"sequence_number":0}`,
	`event: response.in_progress` + "\n" + `data: {"type":"response.in_progress","response":{"id":"resp_abc","status":"in_progress","background":true},"sequence_number":1}`,
	`event: response.output_text.delta` + "\n" + `data: {"type":"response.output_text.delta","delta":"a","sequence_number":2}`,
	`event: response.output_text.delta` + "\n" + `data: {"type":"response.output_text.delta","delta":"b","sequence_number":3}`,
	`event: response.output_text.delta` + "\n" + `data: {"type":"response.output_text.delta","delta":"c","sequence_number":4}`,
	`event: response.completed` + "\n" + `data: {"type":"response.completed","response":{"id":"resp_abc","status":"completed","background":true,"usage":{"input_tokens":3,"output_tokens":3}},"sequence_number":5}`,
}

// bgScript answers the POST and each resume of bgEvents from after
// starting_after, breaking the connection after breaks[n-1] events of
// call n (-1: to the end).
func bgScript(breaks ...int) func(n int64, w http.ResponseWriter, r *http.Request) {
	return func(n int64, w http.ResponseWriter, r *http.Request) {
		from := 0
		if v := r.URL.Query().Get("starting_after"); v != "" {
			after, _ := strconv.Atoi(v)
			from = after + 1
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		stop := -1
		if int(n) <= len(breaks) {
			stop = breaks[n-1]
		}
		for i, ev := range bgEvents[from:] {
			if i == stop {
				panic(http.ErrAbortHandler) // the connection drops, its body unfinished
			}
			fmt.Fprint(w, ev+"\n\n")
			fl.Flush()
		}
	}
}

// TestHealRequest: the resume is a GET of the same upstream's
// /v1/responses/{id}?stream=true&starting_after=N, N the last sequence
// number journaled, with the original request's credential, whichever
// header carries it (Authorization, OpenAI's; x-api-key; api-key, Azure
// OpenAI's), and without its body headers; a stream dropped twice is
// healed twice, contiguous, and the key then replays it with no call.
func TestHealRequest(t *testing.T) {
	t.Parallel()
	for _, cred := range []struct{ name, value, query string }{
		{"Authorization", "Bearer sk-test", ""},
		{"x-api-key", "k-test", ""},
		{"api-key", "k-azure", "api-version=2025-04-01-preview"},
		{"query key", "", "key=k-query"},
	} {
		t.Run(cred.name, func(t *testing.T) {
			var mu sync.Mutex
			var seen []*http.Request
			fs := newFaultServer(t, nil)
			script := bgScript(3, 1) // 0..2, drop; 3, drop; 4..5
			fs.set(func(n int64, w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				seen = append(seen, r.Clone(r.Context()))
				mu.Unlock()
				script(n, w, r)
			})
			e := retryEnv(t, []string{fs.url}, nil)
			r := req{path: "/v1/responses", key: newKey("heal-req"),
				body: `{"model":"gpt-4o","input":"hi","stream":true,"background":true}`}
			if cred.value != "" {
				r.header = map[string]string{cred.name: cred.value}
			}
			query := ""
			if cred.query != "" {
				r.path += "?" + cred.query
				query = cred.query + "&"
			}
			got := e.fetch(r)
			wantWholeResponses(t, got, len(bgEvents))
			if again := e.fetch(r); !again.replayed || string(eventBytes(again.raw)) != string(eventBytes(got.raw)) {
				t.Errorf("repeat: replayed %v; want the healed stream replayed", again.replayed)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(seen) != 3 {
				t.Fatalf("%d upstream requests; want 3 (the POST, two resumes)", len(seen))
			}
			for i, after := range []string{"2", "3"} {
				hr := seen[i+1]
				want := "/v1/responses/resp_abc?" + query + "stream=true&starting_after=" + after
				if hr.Method != http.MethodGet || hr.URL.RequestURI() != want {
					t.Errorf("resume %d: %s %s; want GET %s", i+1, hr.Method, hr.URL.RequestURI(), want)
				}
				if hr.Header.Get(cred.name) != cred.value || hr.Header.Get("Idempotency-Key") != r.key {
					t.Errorf("resume %d: %s %q, Idempotency-Key %q; want the original's", i+1, cred.name, hr.Header.Get(cred.name), hr.Header.Get("Idempotency-Key"))
				}
				if hr.Header.Get("Content-Type") != "" || hr.ContentLength > 0 {
					t.Errorf("resume %d: Content-Type %q, Content-Length %d; want none", i+1, hr.Header.Get("Content-Type"), hr.ContentLength)
				}
			}
		})
	}
}

// TestHealUpstreamError: a resume answered 500 aborts the stream with
// heal_refused, after the events journaled before the drop.
func TestHealUpstreamError(t *testing.T) {
	t.Parallel()
	fs := newFaultServer(t, nil)
	script := bgScript(3)
	fs.set(func(n int64, w http.ResponseWriter, r *http.Request) {
		if n > 1 {
			http.Error(w, `{"error":{"message":"boom","type":"server_error"}}`, http.StatusInternalServerError)
			return
		}
		script(n, w, r)
	})
	e := retryEnv(t, []string{fs.url}, nil)
	got := e.fetch(req{path: "/v1/responses", body: `{"input":"hi","stream":true,"background":true}`})
	if c := abortCode(t, got); c != "heal_refused" {
		t.Errorf("abort code %q; want heal_refused", c)
	}
	if len(got.events) != 4 { // 3 events and stream_aborted
		t.Errorf("%d events; want 4", len(got.events))
	}
	wantCount(t, "upstream requests", fs.calls.Load(), 2)
}

// TestHealReconnectFails: when no reconnect gets an answer (each is cut
// before its head), the stream aborts with the drop's own cause after
// the bounded attempts.
func TestHealReconnectFails(t *testing.T) {
	t.Parallel()
	fs := newFaultServer(t, nil)
	script := bgScript(3)
	fs.set(func(n int64, w http.ResponseWriter, r *http.Request) {
		if n > 1 {
			panic(http.ErrAbortHandler) // no head
		}
		script(n, w, r)
	})
	e := retryEnv(t, []string{fs.url}, nil)
	got := e.fetch(req{path: "/v1/responses", body: `{"input":"hi","stream":true,"background":true}`})
	if c := abortCode(t, got); c != "upstream_read_error" {
		t.Errorf("abort code %q; want upstream_read_error", c)
	}
	wantCount(t, "upstream requests", fs.calls.Load(), 1+healAttempts)
	if v := metricValue(t, e.scrape(), `ssegate_upstream_resumes_total{outcome="failed"}`); v != 1 {
		t.Errorf("resumes failed: %v; want 1", v)
	}
}

// TestHealClientLeaves: the client that started a background stream
// closes or resets its connection while the heal's reconnect is still
// waiting for the upstream's answer. Whether the upstream then resumes
// the stream or refuses it (404), the generation ends, keyed or not: a
// keyed one is committed (and replays whole) or failed with heal_refused;
// no generation stays live, no goroutine is left behind, and the
// upstream got one POST (one paid generation) and one resume, never a
// second generation.
func TestHealClientLeaves(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		for _, how := range []string{"close", "reset"} {
			for _, refuse := range []bool{false, true} {
				t.Run(fmt.Sprintf("keyed=%v/%s/refuse=%v", keyed, how, refuse), func(t *testing.T) {
					t.Parallel()
					testHealClientLeaves(t, keyed, how, refuse)
				})
			}
		}
	}
}

func testHealClientLeaves(t *testing.T, keyed bool, how string, refuse bool) {
	goroutines := ownGoroutines(t) // before the servers: their goroutines are the test's
	var posts, resumes atomic.Int64
	resuming, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	broken := false // the first POST after the warm-up breaks after 3 events
	fs := newFaultServer(t, nil)
	fs.set(bgScript())
	e := retryEnv(t, []string{fs.url}, nil)
	addr := strings.TrimPrefix(e.url, "http://")
	// A first whole stream starts what lives as long as the servers (their
	// pools' cleaners).
	warm := rawResponses(t, addr, "")
	io.Copy(io.Discard, warm) //nolint:errcheck // to the end of the stream
	warm.Close()
	within(time.Second, func() bool { return e.proxy.streams.Load() == 0 })
	closeUpstreamIdle(e.proxy)
	before, _ := goroutines()

	whole := bgScript()
	fs.set(func(n int64, w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			posts.Add(1)
			if !broken {
				broken = true
				bgScript(3)(1, w, r)
				return
			}
			whole(1, w, r)
			return
		}
		resumes.Add(1)
		close(resuming)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		if refuse {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"error":{"message":"No response found","type":"invalid_request_error"}}`)
			return
		}
		whole(n, w, r)
	})
	key := ""
	if keyed {
		key = newKey("heal-leave")
	}
	conn := rawResponses(t, addr, key)
	select {
	case <-resuming:
	case <-time.After(10 * time.Second):
		t.Fatal("no resume within 10s of the drop")
	}
	if how == "reset" {
		conn.SetLinger(0) //nolint:errcheck
	}
	conn.Close()
	releaseOnce.Do(func() { close(release) })

	switch {
	case keyed && refuse:
		if ki := e.waitState(key, "", cache.StateFailedRetryable); ki.Reason != "heal_refused" {
			t.Errorf("reason %q; want heal_refused", ki.Reason)
		}
	case keyed:
		e.waitState(key, "", cache.StateCommitted)
		got := e.fetch(req{path: "/v1/responses", key: key, body: bgBody})
		if !got.replayed {
			t.Errorf("the key's stream again: replayed %v; want the journal's", got.replayed)
		}
		wantWholeResponses(t, got, len(bgEvents))
		e.client.CloseIdleConnections()
	}
	if !within(5*time.Second, func() bool { return e.proxy.streams.Load() == 0 }) {
		t.Fatalf("live generations: got %d after the client left; want 0", e.proxy.streams.Load())
	}
	outcome := "resumed"
	if refuse {
		outcome = "refused"
	}
	if v := metricValue(t, e.scrape(), `ssegate_upstream_resumes_total{outcome="`+outcome+`"}`); v != 1 {
		t.Errorf("resumes %s: got %v; want 1", outcome, v)
	}
	e.client.CloseIdleConnections()
	closeUpstreamIdle(e.proxy)
	if !within(5*time.Second, func() bool { n, _ := goroutines(); return n <= before+2 }) {
		n, stacks := goroutines()
		t.Fatalf("goroutines: got %d; want at most %d (before the request + 2)\n%s", n, before+2, stacks)
	}
	wantCount(t, "POSTs (generations)", posts.Load(), 1)
	wantCount(t, "resumes", resumes.Load(), 1)
}

// rawResponses sends a background Responses stream request (keyed when
// key is not "") on a connection of its own, and reads its first event.
func rawResponses(t *testing.T, addr, key string) *net.TCPConn {
	t.Helper()
	return rawPost(t, addr, "/v1/responses", "Connection: close\r\n"+keyHeader(key), bgBody, 1)
}

// TestHealNotBeforeFirstEvent: a background Responses request whose
// upstream reads it and hangs up, with no answer or with a stream's head
// and no event, has no response id to resume by and may be generating:
// it is neither healed nor repeated (one upstream request), the client
// gets 502, and the key ends commit_unknown.
func TestHealNotBeforeFirstEvent(t *testing.T) {
	t.Parallel()
	headThenDrop := func(_ int64, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}
	for _, c := range []struct {
		name   string
		script func(int64, http.ResponseWriter, *http.Request)
	}{{"hang up", hangUp}, {"head then drop", headThenDrop}} {
		t.Run(c.name, func(t *testing.T) {
			fs := newFaultServer(t, c.script)
			e := retryEnv(t, []string{fs.url}, nil)
			key := newKey("heal-none")
			got := e.fetch(req{path: "/v1/responses", key: key, auth: "Bearer sk-test",
				body: `{"model":"gpt-4o","input":"hi","stream":true,"background":true}`})
			if got.status != http.StatusBadGateway {
				t.Errorf("got %d (%s); want 502", got.status, got.raw)
			}
			e.waitState(key, "Bearer sk-test", cache.StateCommitUnknown)
			wantCount(t, "upstream requests", fs.calls.Load(), 1)
		})
	}
}
