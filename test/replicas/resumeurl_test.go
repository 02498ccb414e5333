package replicas_test

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/mockllm"
)

// resolved is the resume URL ref, relative to the request to base that it
// answered, made absolute as a client makes it.
func resolved(t *testing.T, base, ref string) string {
	t.Helper()
	b, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	r, err := url.Parse(ref)
	if err != nil {
		t.Fatalf("Ssegate-Resume-Url %q: %v", ref, err)
	}
	return b.ResolveReference(r).String()
}

// TestResumeURLGeneration: a resume URL opens the generation it was
// issued for, on every replica, and no later one. A's first generation of
// a key aborts; B runs the next. A's URL then answers 410 stream_gone on
// both replicas (Redis's generation numbers tell them apart), while the
// URL B's answer carries opens B's generation on A.
func TestResumeURLGeneration(t *testing.T) {
	backends(t, func(t *testing.T, be backend) {
		e := be.newEnv(t, mockllm.Config{Tokens: 5, Delay: time.Millisecond})
		a, b := e.start("A"), e.start("B")
		cred := map[string]string{"Authorization": "Bearer sk-gen"}
		faulty := map[string]string{"Authorization": "Bearer sk-gen", "X-Mock-Fault": "eof-after=2"}
		first := send(t, http.MethodPost, a.URL+"/v1/chat/completions", "g1", faulty)
		if first.aborted() == "" {
			t.Fatalf("first generation on A: status %d, clean %v; want it aborted", first.status, first.clean())
		}
		old := resolved(t, a.URL+"/v1/chat/completions", first.header.Get("Ssegate-Resume-Url"))
		second := send(t, http.MethodPost, b.URL+"/v1/chat/completions", "g1", cred)
		if second.status != 200 || !second.clean() {
			t.Fatalf("second generation on B: status %d, clean %v; want a whole stream", second.status, second.clean())
		}
		fresh := resolved(t, b.URL+"/v1/chat/completions", second.header.Get("Ssegate-Resume-Url"))
		for _, g := range []string{a.URL, b.URL} {
			u := g + old[len(a.URL):]
			if s := send(t, http.MethodGet, u, "", nil); s.status != http.StatusGone {
				t.Errorf("A's first URL on %s after B's generation: got %d; want 410", g, s.status)
			}
		}
		onA := a.URL + fresh[len(b.URL):]
		if s := send(t, http.MethodGet, onA, "", nil); s.status != 200 || !s.clean() {
			t.Errorf("B's URL on A: got %d, clean %v; want 200 and B's stream", s.status, s.clean())
		}
		if n := e.mock.Calls(); n != 2 {
			t.Fatalf("upstream calls: got %d; want 2", n)
		}
	})
}
