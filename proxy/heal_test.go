package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
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
	e := newEnv(t)
	body := `{"model":"gpt-4o-mini","stream":true,"background":true,"messages":[{"role":"user","content":"hi"}]}`
	got := e.fetch(req{body: body, header: map[string]string{"X-Mock-Fault": resetAfter}})
	if c := abortCode(t, got); c != "upstream_read_error" {
		t.Errorf("abort code %q; want upstream_read_error", c)
	}
	wantCount(t, "resumes", e.mock.Resumes(), 0)
	wantCount(t, "calls", e.mock.Calls(), 1)
}
