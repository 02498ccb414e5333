package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
	"github.com/ssegate/ssegate/cache"
	"github.com/tidwall/gjson"
)

// fixtureBody is a stream recorded from a provider, from the sse
// package's testdata (its SOURCES.md says where each comes from).
func fixtureBody(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../sse/testdata/" + name + ".sse")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sseGated answers with first, flushed, then waits for gate (or the test's
// end) before it sends rest and ends the body with its last chunk.
func sseGated(first, rest string, gate <-chan struct{}) func(int64, http.ResponseWriter, *http.Request) {
	return func(_ int64, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, first) //nolint:errcheck // the test reads what arrived
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, rest) //nolint:errcheck // the test reads what arrived
	}
}

// TestResponseIncompleteClean: a Responses stream that ends in
// response.incomplete (max_output_tokens reached) with its events whole
// is the model's answer to the request's own bound, like chat's
// finish_reason "length": the caller gets exactly the events the provider
// sent, the key is committed, and its repeat is a replay that calls the
// upstream no more.
func TestResponseIncompleteClean(t *testing.T) {
	t.Parallel()
	completed := fixtureBody(t, "openai-responses-completed")
	evs := strings.SplitAfter(completed, "\n\n")
	last := evs[len(evs)-2] // the response.completed event; the rest is ""
	if !strings.HasPrefix(last, "event: response.completed\n") || evs[len(evs)-1] != "" {
		t.Fatalf("fixture: got last event %q; want response.completed", last)
	}
	final := strings.ReplaceAll(last, "response.completed", "response.incomplete")
	final = strings.Replace(final, `"status":"completed"`, `"status":"incomplete"`, 1)
	final = strings.Replace(final, `"incomplete_details":null`, `"incomplete_details":{"reason":"max_output_tokens"}`, 1)
	if !strings.Contains(final, `"status":"incomplete"`) || !strings.Contains(final, `"reason":"max_output_tokens"`) {
		t.Fatalf("fixture: the response object of %q lacks status or incomplete_details", last)
	}
	body := strings.TrimSuffix(completed, last) + final
	fs := newFaultServer(t, sseAnswer(body, "framed"))
	e := retryEnv(t, []string{fs.url}, nil)
	key := newKey("incomplete")
	reqBody := `{"model":"gpt-4o-mini","stream":true,"max_output_tokens":16,"input":"Count from 1 to 3"}`
	first := e.fetch(req{key: key, path: "/v1/responses", body: reqBody})
	if first.status != 200 || first.aborted || first.replayed {
		t.Fatalf("first: got %d aborted %v replayed %v; want 200, a whole stream", first.status, first.aborted, first.replayed)
	}
	if got := stripIDs(first.raw, false); got != body {
		t.Fatalf("first: events:\n%s\nwant exactly the upstream's:\n%s", got, body)
	}
	e.waitState(key, "", cache.StateCommitted)
	again := e.fetch(req{key: key, path: "/v1/responses", body: reqBody})
	if !again.replayed || string(eventBytes(again.raw)) != string(eventBytes(first.raw)) {
		t.Fatalf("repeat: replayed %v, same events %v; want a replay of the first", again.replayed, string(eventBytes(again.raw)) == string(eventBytes(first.raw)))
	}
	wantCount(t, "upstream calls", fs.calls.Load(), 1)
}

// oneAttempt makes no retry: a failure in a stream's preamble is then the
// last attempt's, relayed as the provider sent it.
func oneAttempt(pc *Config) { pc.Retry.Attempts = 1 }

// TestProviderFailureRelayed: the provider's own failure, recorded from
// OpenAI (an insufficient_quota error event, then response.failed), when
// no retry may follow (one attempt, no fallback), reaches
// the caller, a joiner and a reader of the Responses journal exactly as
// the provider sent it: response.failed included, no stream_aborted of
// the proxy's after it. It is not stored: the key ends failed_retryable
// with the provider's reason (error_event), GET /keys/{key} says so, and
// the repeat calls the upstream again.
func TestProviderFailureRelayed(t *testing.T) {
	t.Parallel()
	body := fixtureBody(t, "openai-responses-error-failed")
	i := strings.Index(body, "event: error\n")
	if i < 0 {
		t.Fatal("fixture: no error event")
	}
	gate := make(chan struct{})
	fs := newFaultServer(t, sseGated(body[:i], body[i:], gate))
	e := retryEnv(t, []string{fs.url}, oneAttempt)
	key := newKey("failed")
	reqBody := `{"model":"gpt-5-nano","stream":true,"input":"hi"}`
	origin := e.do(req{key: key, path: "/v1/responses", body: reqBody, auth: "Bearer sk-a"})
	joiner := e.do(req{key: key, path: "/v1/responses", body: reqBody, auth: "Bearer sk-a"})
	journal := e.do(req{method: http.MethodGet, path: "/v1/responses/resp_05500b38c2cd9bfc00691c7c9d222481a3b595421266dab424?stream=true&starting_after=0", auth: "Bearer sk-a"})
	close(gate)
	read := func(name string, resp *http.Response) result {
		t.Helper()
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		r := parseResult(resp, raw, err)
		if r.status != 200 || r.readErr != nil || r.aborted {
			t.Fatalf("%s: got %d, read error %v, aborted %v (%q); want 200 and the provider's end", name, r.status, r.readErr, r.aborted, raw)
		}
		return r
	}
	if got := stripIDs(read("origin", origin).raw, false); got != body {
		t.Fatalf("origin: events:\n%s\nwant exactly the provider's:\n%s", got, body)
	}
	if got := stripIDs(read("joiner", joiner).raw, false); got != body {
		t.Fatalf("joiner: events:\n%s\nwant exactly the provider's:\n%s", got, body)
	}
	after0 := body[strings.Index(body, "event: response.in_progress\n"):]
	if got := stripIDs(read("journal", journal).raw, false); got != after0 {
		t.Fatalf("journal after 0: events:\n%s\nwant the provider's after sequence_number 0:\n%s", got, after0)
	}
	ki := e.waitState(key, "Bearer sk-a", cache.StateFailedRetryable)
	if ki.BodyStored || ki.Reason != "error_event" {
		t.Fatalf("key: stored %v, reason %q; want not stored, error_event", ki.BodyStored, ki.Reason)
	}
	info := e.fetch(req{method: http.MethodGet, path: "/keys/" + key, auth: "Bearer sk-a"})
	if info.status != 200 || gjson.GetBytes(info.raw, "state").String() != "failed_retryable" || gjson.GetBytes(info.raw, "reason").String() != "error_event" {
		t.Fatalf("GET /keys: got %d %s; want failed_retryable, error_event", info.status, info.raw)
	}
	again := e.fetch(req{key: key, path: "/v1/responses", body: reqBody, auth: "Bearer sk-a"})
	if again.replayed || again.aborted || stripIDs(again.raw, false) != body {
		t.Fatalf("repeat: replayed %v aborted %v (%q); want a new generation, relayed as it came", again.replayed, again.aborted, again.raw)
	}
	wantCount(t, "upstream calls", fs.calls.Load(), 2)
}

// TestProviderFailureSDK: openai-go, through the proxy, surfaces what the
// provider said as it does direct, for the recorded failure (its typed
// error event, then response.failed) and for a failure stated by
// response.failed alone: the same events, the same error (or none).
func TestProviderFailureSDK(t *testing.T) {
	t.Parallel()
	recorded := fixtureBody(t, "openai-responses-error-failed")
	i := strings.Index(recorded, "event: error\n")
	j := strings.Index(recorded, "event: response.failed\n")
	if i < 0 || j < i {
		t.Fatal("fixture: no error event before response.failed")
	}
	failedOnly := recorded[:i] + strings.Replace(recorded[j:], `"sequence_number":3`, `"sequence_number":2`, 1)
	for _, c := range []struct{ name, body string }{{"error event, then response.failed", recorded}, {"response.failed alone", failedOnly}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fs := newFaultServer(t, sseAnswer(c.body, "framed"))
			e := retryEnv(t, []string{fs.url}, oneAttempt)
			run := func(base string, opts ...option.RequestOption) (types []string, err error) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				cl := openai.NewClient(append([]option.RequestOption{option.WithBaseURL(base + "/v1/"), option.WithAPIKey("sk-a"),
					option.WithMaxRetries(0), option.WithHTTPClient(e.client)}, opts...)...)
				s := cl.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "gpt-5-nano",
					Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}, opts...)
				defer s.Close()
				for s.Next() {
					ev := s.Current()
					types = append(types, ev.Type)
					if ev.Type == "response.failed" && ev.Response.Error.Code != "insufficient_quota" {
						t.Errorf("response.failed: got error code %q; want insufficient_quota", ev.Response.Error.Code)
					}
				}
				return types, s.Err()
			}
			wantTypes, wantErr := run(fs.url)
			gotTypes, gotErr := run(e.url, option.WithHeader("Idempotency-Key", newKey("sdk-failed")))
			if !slices.Equal(gotTypes, wantTypes) {
				t.Fatalf("events: got %v through the proxy; want %v, as direct", gotTypes, wantTypes)
			}
			if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
				t.Fatalf("error: got %v through the proxy; want %v, as direct", gotErr, wantErr)
			}
			var se *ssestream.StreamError
			if wantErr != nil && (!errors.As(gotErr, &se) || gjson.GetBytes(se.Event.Data, "error.code").String() != "insufficient_quota") {
				t.Fatalf("error: got %#v; want the provider's typed error event, insufficient_quota", gotErr)
			}
			wantCount(t, "upstream calls", fs.calls.Load(), 2) // one direct, one through the proxy
		})
	}
}

// TestErrorObject2xxNotStored: a non-streaming 200 whose JSON body is an
// error object (OpenRouter's and several OpenAI-compatible servers' way to
// answer a failure) is relayed as it came and not stored: the key is free
// (failed_retryable, error_body), the repeat calls the upstream again, and
// the skipped metric counts it. A 200 whose "error" is null is an answer,
// stored as ever.
func TestErrorObject2xxNotStored(t *testing.T) {
	t.Parallel()
	const body = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	cases := []struct {
		name, answer string
		stored       bool
	}{
		{"OpenRouter error object", `{"error":{"message":"Provider returned error","code":502,"metadata":{"provider_name":"X"}},"user_id":"u"}`, false},
		{"Anthropic-style error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, false},
		{"error null is an answer", `{"id":"chatcmpl-1","object":"chat.completion","error":null,"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fs := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, c.answer) //nolint:errcheck // the test reads what arrived
			})
			e := retryEnv(t, []string{fs.url}, nil)
			key := newKey("error-object")
			for i := range 2 {
				got := e.fetch(req{key: key, body: body})
				if got.status != 200 || string(got.raw) != c.answer || got.replayed != (c.stored && i == 1) {
					t.Fatalf("request %d: got %d replayed %v %q; want 200, the upstream's body, replayed %v", i, got.status, got.replayed, got.raw, c.stored && i == 1)
				}
				if c.stored {
					e.waitState(key, "", cache.StateCommitted)
					continue
				}
				if ki := e.waitState(key, "", cache.StateFailedRetryable); ki.BodyStored || ki.Reason != "error_body" {
					t.Fatalf("request %d: key stored %v, reason %q; want not stored, error_body", i, ki.BodyStored, ki.Reason)
				}
			}
			want := int64(2)
			if c.stored {
				want = 1
			}
			wantCount(t, "upstream calls", fs.calls.Load(), want)
			if !c.stored {
				if got := metricValue(t, e.scrape(), `ssegate_cache_skipped_total{reason="error_body"}`); got != 2 {
					t.Fatalf("skipped{error_body}: got %v; want 2", got)
				}
			}
		})
	}
}

// TestProviderFailureWithoutEnd: a Responses stream whose error event is
// not followed by its response.failed (the upstream sends no more but
// keeps the body open) ends with the error, as the provider left it, once
// the short wait for response.failed is over: no stream_aborted, and no
// wait for -upstream-idle-timeout.
func TestProviderFailureWithoutEnd(t *testing.T) {
	t.Parallel()
	recorded := fixtureBody(t, "openai-responses-error-failed")
	j := strings.Index(recorded, "event: response.failed\n")
	if j < 0 {
		t.Fatal("fixture: no response.failed")
	}
	body := recorded[:j]
	fs := newFaultServer(t, sseGated(body, "", make(chan struct{})))
	e := retryEnv(t, []string{fs.url}, func(pc *Config) { oneAttempt(pc); pc.UpstreamIdleTimeout = time.Minute })
	key := newKey("failed-open")
	start := time.Now()
	got := e.fetch(req{key: key, path: "/v1/responses", body: `{"model":"gpt-5-nano","stream":true,"input":"hi"}`})
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("answered after %v; want the stream ended soon after the error event", took)
	}
	if got.status != 200 || got.aborted || stripIDs(got.raw, false) != body {
		t.Fatalf("got %d aborted %v (%q); want 200 and the provider's events to its error, nothing added", got.status, got.aborted, got.raw)
	}
	if ki := e.waitState(key, "", cache.StateFailedRetryable); ki.BodyStored || ki.Reason != "error_event" {
		t.Fatalf("key: stored %v, reason %q; want not stored, error_event", ki.BodyStored, ki.Reason)
	}
	wantCount(t, "upstream calls", fs.calls.Load(), 1)
}
