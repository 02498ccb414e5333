package mockllm

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// bgEvent is what the background tests read of a Responses event.
type bgEvent struct {
	Type     string `json:"type"`
	Seq      int    `json:"sequence_number"`
	Response struct {
		ID         string `json:"id"`
		Background bool   `json:"background"`
	} `json:"response"`
}

// readEvents reads the data lines of an event stream until it ends or
// breaks, and says whether it broke.
func readBG(t *testing.T, body io.Reader) (evs []bgEvent, broke bool) {
	t.Helper()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev bgEvent
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		evs = append(evs, ev)
	}
	return evs, sc.Err() != nil && !errors.Is(sc.Err(), io.EOF)
}

func startBG(t *testing.T) (*Server, string) {
	t.Helper()
	s := New(Config{Tokens: 8})
	u, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, u
}

func postBG(t *testing.T, url, body, fault string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/responses", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if fault != "" {
		req.Header.Set("X-Mock-Fault", fault)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func getBG(t *testing.T, url string) *http.Response {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestBackgroundResume: a background stream reset after 5 events is
// resumed by GET from its last sequence number to response.completed,
// the same response (id), contiguous; one generation, one call, one
// resume.
func TestBackgroundResume(t *testing.T) {
	s, u := startBG(t)
	resp := postBG(t, u, `{"model":"gpt-4o-mini","input":"hi","stream":true,"background":true}`, "reset-after=5")
	first, broke := readBG(t, resp.Body)
	resp.Body.Close()
	if !broke || len(first) != 5 {
		t.Fatalf("first stream: %d events, broke %v; want 5, broken", len(first), broke)
	}
	id := first[0].Response.ID
	if !strings.HasPrefix(id, "resp_") || !first[0].Response.Background {
		t.Fatalf("response.created: id %q background %v", id, first[0].Response.Background)
	}
	r2 := getBG(t, u+"/v1/responses/"+id+"?stream=true&starting_after=4")
	if r2.StatusCode != 200 || !strings.HasPrefix(r2.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("resume: %d %s", r2.StatusCode, r2.Header.Get("Content-Type"))
	}
	rest, broke := readBG(t, r2.Body)
	r2.Body.Close()
	if broke || len(rest) == 0 {
		t.Fatalf("resume: %d events, broke %v", len(rest), broke)
	}
	all := append(first, rest...)
	for i, ev := range all {
		if ev.Seq != i {
			t.Fatalf("event %d has sequence_number %d", i, ev.Seq)
		}
	}
	last := all[len(all)-1]
	if last.Type != "response.completed" || last.Response.ID != id {
		t.Fatalf("last event %s of %q; want response.completed of %q", last.Type, last.Response.ID, id)
	}
	if len(all) != 8+8 {
		t.Errorf("%d events; want 16", len(all))
	}
	if s.Generations() != 1 || s.Calls() != 1 || s.Resumes() != 1 {
		t.Errorf("generations %d calls %d resumes %d; want 1 1 1", s.Generations(), s.Calls(), s.Resumes())
	}
}

// TestBackgroundRetrieveErrors: an unknown id is a 404, a stream that was
// not a background one a 400, both in OpenAI's error shape; a forgotten
// id is unknown.
func TestBackgroundRetrieveErrors(t *testing.T) {
	s, u := startBG(t)
	errorOf := func(r *http.Response) (int, string) {
		defer r.Body.Close()
		var e struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if err := json.NewDecoder(r.Body).Decode(&e); err != nil {
			t.Fatal(err)
		}
		if e.Error.Type != "invalid_request_error" {
			t.Errorf("error type %q", e.Error.Type)
		}
		return r.StatusCode, e.Error.Message
	}
	if st, _ := errorOf(getBG(t, u+"/v1/responses/resp_nope?stream=true")); st != 404 {
		t.Errorf("unknown id: %d; want 404", st)
	}
	resp := postBG(t, u, `{"input":"x","stream":true}`, "")
	evs, _ := readBG(t, resp.Body)
	resp.Body.Close()
	id := evs[0].Response.ID
	st, msg := errorOf(getBG(t, u+"/v1/responses/"+id+"?stream=true&starting_after=2"))
	if st != 400 || !strings.Contains(msg, "cannot be streamed because it was not created with background=true") {
		t.Errorf("not background: %d %q", st, msg)
	}
	resp = postBG(t, u, `{"input":"y","stream":true,"background":true}`, "")
	evs, _ = readBG(t, resp.Body)
	resp.Body.Close()
	s.ForgetResponses()
	if st, _ := errorOf(getBG(t, u+"/v1/responses/"+evs[0].Response.ID+"?stream=true")); st != 404 {
		t.Errorf("forgotten id: %d; want 404", st)
	}
	if s.Resumes() != 0 || s.Generations() != 2 {
		t.Errorf("resumes %d generations %d; want 0 2", s.Resumes(), s.Generations())
	}
}

// TestKeptBounded: the kept responses stay within maxKept.
func TestKeptBounded(t *testing.T) {
	var k keptResponses
	for i := range maxKept + 10 {
		k.keep("resp_"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+strings.Repeat("y", i/26), kept{})
	}
	if len(k.m) > maxKept {
		t.Errorf("%d kept; want at most %d", len(k.m), maxKept)
	}
}

// TestBackgroundFaultAtItsEvent: the fault of a background response fires
// at its own event of the response: a resume from before it breaks there
// again, one from past it runs to the end.
func TestBackgroundFaultAtItsEvent(t *testing.T) {
	_, u := startBG(t)
	resp := postBG(t, u, `{"input":"z","stream":true,"background":true}`, "reset-after=5")
	first, _ := readBG(t, resp.Body)
	resp.Body.Close()
	id := first[0].Response.ID
	r := getBG(t, u+"/v1/responses/"+id+"?stream=true&starting_after=1")
	evs, broke := readBG(t, r.Body)
	r.Body.Close()
	if !broke || len(evs) != 3 || evs[0].Seq != 2 || evs[2].Seq != 4 {
		t.Fatalf("resume from 1: %d events (broke %v): %+v; want 2..4, broken", len(evs), broke, evs)
	}
	r = getBG(t, u+"/v1/responses/"+id+"?stream=true")
	evs, broke = readBG(t, r.Body)
	r.Body.Close()
	if !broke || len(evs) != 5 || evs[0].Seq != 0 {
		t.Fatalf("resume from the start: %d events (broke %v); want 0..4, broken", len(evs), broke)
	}
}
