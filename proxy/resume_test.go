package proxy

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
)

// TestResume: a client reads 20 of 80 events and drops; a resume by POST
// and one by GET /streams/{key} each get exactly events 21..80, from the
// live generation and from the committed one.
func TestResume(t *testing.T) {
	t.Parallel()
	for _, live := range []bool{true, false} {
		t.Run(fmt.Sprintf("live=%v", live), func(t *testing.T) {
			t.Parallel()
			// 78 tokens + role chunk + finish chunk = 80 data events, then [DONE].
			e := newEnv(t, slowMock(3*time.Millisecond, 78))
			key := newKey("resume")
			full := e.fetch(req{key: newKey("reference")})
			total := len(full.events)
			if total < 80 {
				t.Fatalf("reference stream has %d events; want at least 80", total)
			}
			last := readPrefix(t, e.do(req{key: key}), 20)
			id, err := sse.ParseID(last)
			if err != nil || id.Seq != 20 {
				t.Fatalf("20th id %q: got seq %d err %v; want 20", last, id.Seq, err)
			}
			if !live {
				e.waitState(key, "", cache.StateCommitted)
			}
			for _, r := range []req{
				{key: key, lastEventID: last},
				{method: http.MethodGet, path: "/streams/" + key, lastEventID: last},
			} {
				got := e.fetch(r)
				if got.status != 200 || !got.replayed {
					t.Fatalf("%s resume: got %d replayed %v; want 200 true", r.method, got.status, got.replayed)
				}
				if len(got.events) != total-20 {
					t.Fatalf("%s resume: got %d events; want %d", r.method, len(got.events), total-20)
				}
				for i, s := range got.ids {
					want := sse.ID{Gen: id.Gen, Seq: uint64(21 + i)}.String()
					if s != want {
						t.Fatalf("%s resume: event %d has id %q; want %q", r.method, i, s, want)
					}
					if got.events[i] != full.events[20+i] {
						t.Fatalf("%s resume: event %d differs from the reference", r.method, i)
					}
				}
			}
			e.wantCalls(2) // the reference and the resumed key
		})
	}
}

// TestResumeErrors: malformed ids, ids of an aborted or older generation,
// ids beyond the stream, unknown keys.
func TestResumeErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(0, 10))
	key := newKey("resume-err")
	first := e.fetch(req{key: key})
	e.waitState(key, "", cache.StateCommitted)
	gen, _ := sse.ParseID(first.ids[0])

	aborted := newKey("resume-aborted")
	bad := e.fetch(req{key: aborted, header: map[string]string{"X-Mock-Fault": "eof-after=4"}})
	e.waitState(aborted, "", cache.StateFailedRetryable)

	cases := []struct {
		name   string
		r      req
		status int
		typ    string
	}{
		{"malformed id", req{key: key, lastEventID: "not-an-id"}, 400, "invalid_last_event_id"},
		{"malformed id GET", req{method: http.MethodGet, path: "/streams/" + key, lastEventID: "12"}, 400, "invalid_last_event_id"},
		{"beyond the stream", req{key: key, lastEventID: sse.ID{Gen: gen.Gen, Seq: 999}.String()}, 400, "invalid_last_event_id"},
		{"older generation", req{key: key, lastEventID: sse.ID{Gen: gen.Gen - 1, Seq: 1}.String()}, 410, "stream_gone"},
		{"aborted generation", req{key: aborted, lastEventID: bad.ids[2]}, 410, "stream_gone"},
		{"aborted generation GET", req{method: http.MethodGet, path: "/streams/" + aborted, lastEventID: bad.ids[2]}, 410, "stream_gone"},
		{"unknown key GET", req{method: http.MethodGet, path: "/streams/nope"}, 404, "stream_not_found"},
		{"unknown key POST", req{key: "nope", lastEventID: first.ids[0]}, 410, "stream_gone"},
		{"other request POST", req{key: key, lastEventID: first.ids[0], body: `{"other":true}`}, 422, "idempotency_conflict"},
	}
	before := e.calls()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := e.fetch(c.r)
			if got.status != c.status || got.errType != c.typ {
				t.Fatalf("got %d %q; want %d %q", got.status, got.errType, c.status, c.typ)
			}
		})
	}
	e.wantCalls(before)

	// Resuming from the last event of a finished stream: 204, so an
	// EventSource stops reconnecting.
	end := e.fetch(req{method: http.MethodGet, path: "/streams/" + key, lastEventID: first.ids[len(first.ids)-1]})
	if end.status != 204 {
		t.Fatalf("resume at the end: got %d; want 204", end.status)
	}

	// A path-escaped key reaches the same stream.
	odd := "a/b?c"
	e.fetch(req{key: odd})
	e.waitState(odd, "", cache.StateCommitted)
	got := e.fetch(req{method: http.MethodGet, path: "/streams/a%2Fb%3Fc"})
	if got.status != 200 || got.lastData() != "[DONE]" {
		t.Fatalf("escaped key: got %d last %q; want 200 [DONE]", got.status, got.lastData())
	}
}
