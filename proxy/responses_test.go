package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/redistest"
	"github.com/tidwall/gjson"
)

// responsesClient is openai-go through e with credential key.
func responsesClient(e *env, key string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(e.url + "/v1/"), option.WithAPIKey(key),
		option.WithMaxRetries(0), option.WithHTTPClient(e.client),
	}, opts...)...)
}

// TestResponsesResumeFromJournal: openai-go's GetStreaming with
// StartingAfter, for a Responses stream made without background: true, is
// answered from the journal, while the stream runs and after its commit:
// exactly the events after that sequence number, to response.completed,
// with no second upstream call. Without stream=true the GET answers the
// final response object. Another tenant's GET of the same id is not
// served from the journal.
func TestResponsesResumeFromJournal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(5*time.Millisecond, 24))
	c := responsesClient(e, "sk-one")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := newKey("responses")
	params := responses.ResponseNewParams{Model: "gpt-4o-mini", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Tell me a joke")}}
	stream := c.Responses.NewStreaming(ctx, params, option.WithHeader("Idempotency-Key", key))
	var id string
	var seen []int64
	for stream.Next() && len(seen) < 6 { // leave while it runs
		ev := stream.Current()
		seen = append(seen, ev.SequenceNumber)
		if ev.Type == "response.created" {
			id = ev.Response.ID
		}
	}
	stream.Close()
	if id == "" || len(seen) < 6 {
		t.Fatalf("first part: id %q, %d events; want the id and 6 events", id, len(seen))
	}
	resume := func(c openai.Client, after int64) ([]int64, string, error) {
		s := c.Responses.GetStreaming(ctx, id, responses.ResponseGetParams{StartingAfter: openai.Int(after)})
		var seqs []int64
		last := ""
		for s.Next() {
			seqs = append(seqs, s.Current().SequenceNumber)
			last = s.Current().Type
		}
		return seqs, last, s.Err()
	}
	raw := e.fetch(req{method: http.MethodGet, path: "/v1/responses/" + id + "?stream=true&starting_after=5", auth: "Bearer sk-one"})
	if raw.status != 200 || len(raw.events) == 0 || !strings.Contains(raw.events[0].Data, `"sequence_number":6`) {
		t.Fatalf("GET ?stream=true&starting_after=5: got %d, first event %v; want sequence_number 6 first", raw.status, raw.events[:min(1, len(raw.events))])
	}
	after := seen[len(seen)-1]
	seqs, last, err := resume(c, after)
	if err != nil || last != "response.completed" || len(seqs) == 0 || seqs[0] != after+1 {
		t.Fatalf("live resume after %d: %v, last %q, seqs %v; want %d on to response.completed", after, err, last, seqs, after+1)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("resume: sequence numbers %v have a gap or a repeat", seqs)
		}
	}
	e.waitState(key, "Bearer sk-one", cache.StateCommitted)
	again, last2, err := resume(c, 2)
	if err != nil || last2 != "response.completed" || len(again) == 0 || again[0] != 3 || again[len(again)-1] != seqs[len(seqs)-1] {
		t.Fatalf("stored resume after 2: %v, last %q, seqs %v", err, last2, again)
	}
	r, err := c.Responses.Get(ctx, id, responses.ResponseGetParams{})
	if err != nil || r.ID != id || r.Status != "completed" || strings.TrimSpace(r.OutputText()) == "" {
		t.Fatalf("GET without stream: %v, %+v; want the completed response", err, r)
	}
	e.wantCalls(1)
	// Another tenant: the id is unknown to it, so the GET goes upstream
	// (the mock has no GET: an error), not to the journal.
	if _, _, err := resume(responsesClient(e, "sk-two"), 2); err == nil {
		t.Fatal("another tenant's resume: got the stream; want it not served from the journal")
	}
	e.wantCalls(1)
}

// TestResponsesUnknownIDRelayed: a GET of an id the proxy does not know
// reaches the upstream unchanged, path and query, so the provider's own
// background resume works through the proxy.
func TestResponsesUnknownIDRelayed(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Method + " " + r.URL.RequestURI())
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":9,\"response\":{\"id\":\"resp_x\",\"status\":\"completed\"}}\n\n")) //nolint:errcheck // a test
	}))
	defer up.Close()
	e := newEnvUpstream(t, up.URL, nil, Config{}, cache.Config{})
	r := e.fetch(req{method: http.MethodGet, path: "/v1/responses/resp_x?stream=true&starting_after=8"})
	if r.status != 200 || got.Load() != "GET /v1/responses/resp_x?stream=true&starting_after=8" {
		t.Fatalf("got %d, upstream saw %v; want the GET relayed unchanged", r.status, got.Load())
	}
}

// TestResponsesAliasTenantCredentials: whatever carries the tenant (each
// credential header, Gemini's ?key=, a -tenant-header), a GET of the id
// with the same one is served from the journal, and one with another
// value, an extra credential, or none at all is not.
func TestResponsesAliasTenantCredentials(t *testing.T) {
	t.Parallel()
	type cred struct {
		header map[string]string
		query  string // appended to the path, after ?
	}
	h := func(kv ...string) cred {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return cred{header: m}
	}
	for _, tc := range []struct {
		name   string
		own    cred
		others []cred
	}{
		{"x-api-key", h("x-api-key", "k-one"), []cred{h("x-api-key", "k-two"), h("api-key", "k-one"), h()}},
		{"api-key", h("api-key", "k-one"), []cred{h("api-key", "k-two"), h("x-api-key", "k-one"), h()}},
		{"x-goog-api-key", h("x-goog-api-key", "k-one"), []cred{h("x-goog-api-key", "k-two"), h("authorization", "k-one"), h()}},
		{"query key", cred{query: "key=k-one"}, []cred{{query: "key=k-two"}, h("x-api-key", "k-one"), h()}},
		{"tenant header", h("Authorization", "Bearer sk", "X-Org-Id", "org-a"), []cred{h("Authorization", "Bearer sk", "X-Org-Id", "org-b"), h("Authorization", "Bearer sk"), h("X-Org-Id", "org-a")}},
		{"extra credential", h("x-api-key", "k-one"), []cred{h("x-api-key", "k-one", "Authorization", "Bearer other")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, slowMock(time.Millisecond, 8), withConfig(func(pc *Config) { pc.TenantHeaders = []string{"X-Org-Id"} }))
			withQuery := func(path string, c cred, sep string) string {
				if c.query == "" {
					return path
				}
				return path + sep + c.query
			}
			r := e.fetch(req{key: newKey("responses-cred"), path: withQuery("/v1/responses", tc.own, "?"),
				body: `{"model":"gpt-4o-mini","stream":true,"input":"hi"}`, header: tc.own.header})
			if r.status != 200 || len(r.events) == 0 {
				t.Fatalf("POST: got %d; want a stream", r.status)
			}
			id := gjson.Get(r.events[0].Data, "response.id").String()
			get := func(c cred) result {
				return e.fetch(req{method: http.MethodGet, header: c.header,
					path: withQuery("/v1/responses/"+id+"?stream=true&starting_after=2", c, "&")})
			}
			if own := get(tc.own); own.status != 200 || !own.replayed || len(own.events) == 0 ||
				!strings.Contains(own.events[0].Data, `"sequence_number":3`) {
				t.Fatalf("own credential: got %d replayed=%v; want the stored stream from sequence number 3", own.status, own.replayed)
			}
			for i, c := range tc.others {
				if other := get(c); other.replayed || other.status == 200 && len(other.events) > 0 {
					t.Errorf("other %d (%v %q): got %d replayed=%v; want it not served from the journal", i, c.header, c.query, other.status, other.replayed)
				}
			}
			e.wantCalls(1)
		})
	}
}

// TestResponsesAliasAnonymousDeny: an anonymous keyed stream's id, left in
// a store shared with a replica that allowed anonymous keys, is served
// from the journal to a credential-less GET there, and not by a replica
// under AnonymousDeny (as its /streams/{key} is not).
func TestResponsesAliasAnonymousDeny(t *testing.T) {
	t.Parallel()
	mock, upURL := startMock(t, mockllm.Config{Tokens: 8})
	allow := newEnvUpstream(t, upURL, mock, Config{}, cache.Config{})
	deny := newEnvUpstream(t, upURL, mock, Config{AnonymousKeys: AnonymousDeny, Store: allow.store}, cache.Config{})
	key := newKey("responses-anon")
	r := allow.fetch(req{key: key, path: "/v1/responses", body: `{"model":"gpt-4o-mini","stream":true,"input":"hi"}`})
	if r.status != 200 || len(r.events) == 0 {
		t.Fatalf("POST: got %d; want a stream", r.status)
	}
	allow.waitState(key, "", cache.StateCommitted)
	path := "/v1/responses/" + gjson.Get(r.events[0].Data, "response.id").String() + "?stream=true&starting_after=2"
	if got := allow.fetch(req{method: http.MethodGet, path: path}); got.status != 200 || !got.replayed {
		t.Fatalf("allow: got %d replayed=%v; want the stored stream", got.status, got.replayed)
	}
	if got := deny.fetch(req{method: http.MethodGet, path: path}); got.replayed || got.status == 200 && len(got.events) > 0 {
		t.Fatalf("deny: got %d replayed=%v; want it not served from the journal", got.status, got.replayed)
	}
	if got := deny.fetch(req{method: http.MethodGet, path: "/streams/" + key}); got.status != http.StatusUnauthorized {
		t.Errorf("deny /streams/{key}: got %d; want 401", got.status)
	}
	allow.wantCalls(1)
}

// TestResponsesObjectLive: a GET without stream=true of a live stream's
// id answers the object of the latest journaled event that carries one,
// even when the journal holds more than one block before it (here a
// response.created whose instructions take 6 KiB, then
// response.in_progress); after the commit it answers response.completed's.
// The upstream got one call.
func TestResponsesObjectLive(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	instr := strings.Repeat("x", 6<<10)
	up := newFaultServer(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		send := func(typ, data string) {
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, data)
			fl.Flush()
		}
		send("response.created", `{"type":"response.created","response":{"id":"resp_big","status":"queued","instructions":"`+instr+`"},"sequence_number":0}`)
		send("response.in_progress", `{"type":"response.in_progress","response":{"id":"resp_big","status":"in_progress"},"sequence_number":1}`)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		send("response.output_text.delta", `{"type":"response.output_text.delta","delta":"a","sequence_number":2}`)
		send("response.completed", `{"type":"response.completed","response":{"id":"resp_big","status":"completed"},"sequence_number":3}`)
	})
	e := retryEnv(t, []string{up.url}, nil)
	key := newKey("responses-object")
	resp := e.do(req{path: "/v1/responses", key: key, auth: "Bearer sk-a", body: `{"model":"gpt-4o","input":"hi","stream":true}`})
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("before response.in_progress: %v", err)
		}
		if strings.HasPrefix(line, "event: response.in_progress") {
			break
		}
	}
	object := func() string {
		r := e.fetch(req{method: http.MethodGet, path: "/v1/responses/resp_big", auth: "Bearer sk-a"})
		if r.status != 200 {
			t.Fatalf("GET: got %d (%s); want 200", r.status, r.raw)
		}
		return gjson.GetBytes(r.raw, "status").String()
	}
	if got := object(); got != "in_progress" {
		t.Errorf("live GET: status %q; want in_progress (response.in_progress's object)", got)
	}
	close(release)
	io.Copy(io.Discard, br) //nolint:errcheck // to the end of the stream
	e.waitState(key, "Bearer sk-a", cache.StateCommitted)
	if got := object(); got != "completed" {
		t.Errorf("stored GET: status %q; want completed", got)
	}
	wantCount(t, "upstream calls", up.calls.Load(), 1)
}

// TestResponsesGetClientLeaves: the client that made a keyed Responses
// stream leaves after its first event, and a client that resumed it by
// GET /v1/responses/{id}?stream=true closes or resets its connection a
// few events in. Neither stops the generation: it commits, a later GET
// from sequence number 0 replays the rest of it, contiguous to
// response.completed, no generation stays live, and the upstream was
// called once.
func TestResponsesGetClientLeaves(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"close", "reset"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, slowMock(3*time.Millisecond, 120))
			key := newKey("responses-get-leave")
			resp := e.do(req{path: "/v1/responses", key: key, auth: "Bearer sk-a", body: `{"model":"gpt-4o-mini","stream":true,"input":"hi"}`})
			br := bufio.NewReader(resp.Body)
			id := ""
			for id == "" {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("before the first event: %v", err)
				}
				if data, ok := strings.CutPrefix(line, "data: "); ok {
					id = gjson.Get(data, "response.id").String()
				}
			}
			resp.Body.Close() // the first client leaves

			conn := dialSmallBuffer(t, strings.TrimPrefix(e.url, "http://"), 4096)
			fmt.Fprintf(conn, "GET /v1/responses/%s?stream=true&starting_after=0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\n\r\n", id)
			conn.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
			gr := bufio.NewReader(conn)
			for seen := 0; seen < 3; {
				line, err := gr.ReadString('\n')
				if err != nil {
					t.Fatalf("GET, after %d events: %v", seen, err)
				}
				if strings.HasPrefix(line, "data: ") {
					seen++
				}
			}
			if e.proxy.streams.Load() == 0 {
				t.Fatal("the generation ended before the GET's client left; want it live")
			}
			if how == "reset" {
				conn.SetLinger(0) //nolint:errcheck
			}
			conn.Close()

			e.waitState(key, "Bearer sk-a", cache.StateCommitted)
			got := e.fetch(req{method: http.MethodGet, path: "/v1/responses/" + id + "?stream=true&starting_after=0", auth: "Bearer sk-a"})
			if got.status != 200 || !got.replayed || len(got.events) == 0 {
				t.Fatalf("GET after the commit: got %d replayed=%v, %d events; want the stored stream", got.status, got.replayed, len(got.events))
			}
			for i, ev := range got.events {
				if seq := gjson.Get(ev.Data, "sequence_number").Int(); seq != int64(i+1) {
					t.Fatalf("event %d: sequence_number %d; want %d", i, seq, i+1)
				}
			}
			if last := gjson.Get(got.events[len(got.events)-1].Data, "type").String(); last != "response.completed" {
				t.Fatalf("last event %s; want response.completed", last)
			}
			if !within(5*time.Second, func() bool { return e.proxy.streams.Load() == 0 }) {
				t.Fatalf("live generations: got %d; want 0", e.proxy.streams.Load())
			}
			e.wantCalls(1)
		})
	}
}

// TestResponsesStartingAfterBounds: starting_after is answered as OpenAI
// answers it, checked with openai-go's GetStreaming: a negative number is
// a 400 (openai-go's *openai.Error), not the whole stream; the last
// event's number is a stream with no event and its end (a 200 event
// stream, not a bare 204); one past it is a 400. None calls the upstream.
func TestResponsesStartingAfterBounds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(0, 8))
	c := responsesClient(e, "sk-one")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := newKey("starting-after")
	params := responses.ResponseNewParams{Model: "gpt-4o-mini", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Tell me a joke")}}
	stream := c.Responses.NewStreaming(ctx, params, option.WithHeader("Idempotency-Key", key))
	var id string
	var last int64
	for stream.Next() {
		ev := stream.Current()
		if ev.Type == "response.created" {
			id = ev.Response.ID
		}
		last = ev.SequenceNumber
	}
	if err := stream.Err(); err != nil || id == "" {
		t.Fatalf("stream: %v, id %q; want a whole stream with its id", err, id)
	}
	e.waitState(key, "Bearer sk-one", cache.StateCommitted)
	resume := func(after int64) (n int, err error) {
		s := c.Responses.GetStreaming(ctx, id, responses.ResponseGetParams{StartingAfter: openai.Int(after)})
		defer s.Close()
		for s.Next() {
			n++
		}
		return n, s.Err()
	}
	var apiErr *openai.Error
	for _, after := range []int64{-1, -100, last + 1} {
		if n, err := resume(after); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || n != 0 {
			t.Fatalf("starting_after=%d: got %d events, error %v; want a 400", after, n, err)
		}
	}
	if n, err := resume(last); err != nil || n != 0 {
		t.Fatalf("starting_after=%d (the last): got %d events, error %v; want none and no error", last, n, err)
	}
	raw := e.fetch(req{method: http.MethodGet, path: fmt.Sprintf("/v1/responses/%s?stream=true&starting_after=%d", id, last), auth: "Bearer sk-one"})
	if raw.status != http.StatusOK || !strings.HasPrefix(raw.header.Get("Content-Type"), "text/event-stream") || len(raw.events) != 0 {
		t.Fatalf("GET starting_after=%d (the last): got %d %q, %d events; want 200 text/event-stream with no event", last, raw.status, raw.header.Get("Content-Type"), len(raw.events))
	}
	neg := e.fetch(req{method: http.MethodGet, path: "/v1/responses/" + id + "?stream=true&starting_after=-1", auth: "Bearer sk-one"})
	if neg.status != http.StatusBadRequest || neg.errType != "invalid_request" {
		t.Fatalf("GET starting_after=-1: got %d %q; want 400 invalid_request", neg.status, neg.errType)
	}
	if n, err := resume(last - 1); err != nil || n != 1 {
		t.Fatalf("starting_after=%d: got %d events, error %v; want the last one", last-1, n, err)
	}
	e.wantCalls(1)
}

// TestResponsesAliasOfFailedAttempt: a Responses stream whose first
// attempt failed before any output (response.created, then
// response.failed with a server_error: made again) and whose second
// attempt is the answer: the second attempt's id resolves to the key's
// journal, and the first's, whose response the upstream ended failed,
// does not: its GET goes to the upstream, never to the other attempt's
// answer. In memory and with Redis, whose alias used to outlive the
// attempt.
func TestResponsesAliasOfFailedAttempt(t *testing.T) {
	t.Parallel()
	completed := fixtureBody(t, "openai-responses-completed")
	second := gjson.Get(completed[strings.Index(completed, "data: ")+6:strings.Index(completed, "\n\n")], "response.id").Str
	const first = "resp_first_attempt"
	failed := "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"" + first + "\",\"status\":\"in_progress\"}}\n\n" +
		"event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":1,\"response\":{\"id\":\"" + first + "\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"The server had an error\"}}}\n\n"
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			var posts, gets atomic.Int64
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet {
					gets.Add(1)
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusNotFound)
					io.WriteString(w, `{"error":{"type":"invalid_request_error","message":"No response found"}}`) //nolint:errcheck // a test
					return
				}
				io.Copy(io.Discard, r.Body) //nolint:errcheck // a test
				if posts.Add(1) == 1 {
					writeSSE(w, failed)
					return
				}
				writeSSE(w, completed)
			}))
			t.Cleanup(up.Close)
			tune := func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
				pc.Upstreams = []string{up.URL}
				pc.Retry = RetryConfig{BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, AttemptTimeout: 5 * time.Second}
			}
			var e *env
			if store == "redis" {
				var logs gatetest.LogBuffer
				e, _ = redisEnv(t, redistest.Shared(t), &logs, tune)
			} else {
				e = newEnv(t, tune)
			}
			key := newKey("alias-failed-attempt")
			got := e.fetch(req{path: "/v1/responses", key: key, auth: "Bearer sk-a",
				body: `{"model":"gpt-5-nano","input":"hi","stream":true}`})
			if got.status != 200 || got.aborted || !strings.Contains(string(got.raw), second) || strings.Contains(string(got.raw), first) {
				t.Fatalf("got %d aborted %v:\n%s\nwant the second attempt's whole stream", got.status, got.aborted, got.raw)
			}
			wantCount(t, "upstream calls", posts.Load(), 2)
			e.waitState(key, "Bearer sk-a", cache.StateCommitted)
			r := e.fetch(req{method: http.MethodGet, path: "/v1/responses/" + second + "?stream=true", auth: "Bearer sk-a"})
			if r.status != 200 || gets.Load() != 0 || !strings.Contains(string(r.raw), "response.completed") {
				t.Fatalf("GET of the answer's id: got %d, %d upstream GETs:\n%s\nwant its stream from the journal", r.status, gets.Load(), r.raw)
			}
			r = e.fetch(req{method: http.MethodGet, path: "/v1/responses/" + first + "?stream=true", auth: "Bearer sk-a"})
			if r.status != http.StatusNotFound || gets.Load() != 1 {
				t.Fatalf("GET of the failed attempt's id: got %d, %d upstream GETs:\n%s\nwant the upstream's 404: the id names no answer here", r.status, gets.Load(), r.raw)
			}
			wantCount(t, "upstream calls", posts.Load(), 2)
		})
	}
}

// TestResponsesGetMaxCredentials: GET /v1/responses/{id} takes the
// request's scope as every keyed request does: a replica whose
// -max-credentials the request passes refuses it 400
// too_many_credentials, though another replica sharing the store took
// the stream with those credentials. Before, the GET built a scope of the
// tenant alone, checked no bound and was served from the journal (its
// tail charged to the tenant rather than the credentials).
func TestResponsesGetMaxCredentials(t *testing.T) {
	t.Parallel()
	var logs gatetest.LogBuffer
	prefix := redistest.Prefix(t)
	secret := []byte("a secret the replicas share")
	shared := func(pc *Config, _ *cache.Config, _ *mockllm.Config) { pc.Secret = secret }
	a, _ := replicaEnv(t, redistest.Shared(t), prefix, &logs, shared, slowMock(time.Millisecond, 8))
	strict, _ := replicaEnv(t, redistest.Shared(t), prefix, &logs, shared, func(pc *Config, _ *cache.Config, _ *mockllm.Config) { pc.MaxCredentials = 1 })
	creds := map[string]string{"x-api-key": "k-one", "Authorization": "Bearer k-two"}
	r := a.fetch(req{key: newKey("responses-max-cred"), path: "/v1/responses", header: creds,
		body: `{"model":"gpt-4o-mini","stream":true,"input":"hi"}`})
	if r.status != 200 || len(r.events) == 0 {
		t.Fatalf("POST: got %d; want a stream", r.status)
	}
	id := gjson.Get(r.events[0].Data, "response.id").String()
	got := strict.fetch(req{method: http.MethodGet, header: creds, path: "/v1/responses/" + id + "?stream=true"})
	if got.status != http.StatusBadRequest || got.errType != "invalid_request" || got.replayed {
		t.Fatalf("GET past the replica's -max-credentials: got %d %q replayed=%v; want 400 invalid_request", got.status, got.errType, got.replayed)
	}
	if !strings.Contains(logs.String(), "too_many_credentials") {
		t.Error("the log has no too_many_credentials refusal")
	}
	a.wantCalls(1)
}
