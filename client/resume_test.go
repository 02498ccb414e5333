package client_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// TestResumeByResumeURL: a cut stream reconnects to the key's stream where
// the answer's Ssegate-Resume-Url says, resolved against the request's URL
// (so a path prefix in front of ssegate is kept), without the URL's token:
// the reconnection carries the request's own credential. A resume URL
// that leads to another host is not followed (the credential would go
// there): the reconnection goes to /streams/{key} on the request's host.
func TestResumeByResumeURL(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, base, header, want string
	}{
		{"none", "", "", "/streams/k%2F1"},
		{"relative", "", "../../streams/k%2F1?token=t.1.2.mac", "/streams/k%2F1"},
		{"under a prefix", "/llm", "../../streams/k%2F1?token=t.1.2.mac", "/llm/streams/k%2F1"},
		{"absolute path", "/llm", "/llm/streams/k%2F1?token=t.1.2.mac", "/llm/streams/k%2F1"},
		{"another host", "/llm", "http://elsewhere.invalid/llm/streams/k%2F1?token=t.1.2.mac", "/streams/k%2F1"},
		{"another host, no scheme", "/llm", "//elsewhere.invalid/llm/streams/k%2F1", "/streams/k%2F1"},
		{"another scheme", "/llm", "https://HOST/llm/streams/k%2F1", "/streams/k%2F1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var got []string
			var srv *httptest.Server
			srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet {
					mu.Lock()
					got = append(got, r.URL.EscapedPath()+"?"+r.URL.RawQuery+" "+r.Header.Get("Authorization"))
					mu.Unlock()
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, events(4, 9, 8))
					return
				}
				head := ""
				if c.header != "" {
					head = "Ssegate-Resume-Url: " + strings.Replace(c.header, "HOST", srv.Listener.Addr().String(), 1) + "\r\n"
				}
				cutHead(w, head, events(1, 3, 8))
			}))
			defer srv.Close()
			body, err := stream(t, fast(), srv.URL+c.base, "k/1")
			if err != nil || body != events(1, 9, 8) {
				t.Fatalf("read: %v; got %d bytes, want the whole stream", err, len(body))
			}
			mu.Lock()
			defer mu.Unlock()
			if want := c.want + "? Bearer sk-1"; len(got) != 1 || got[0] != want {
				t.Fatalf("reconnections: got %q; want one, %q", got, want)
			}
		})
	}
}
