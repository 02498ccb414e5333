package proxy

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ssegate/ssegate/cache"
)

// homeUpstream is a real upstream on loopback that counts every request it
// gets and fails the test when one carries a resume token or a path under
// /streams, in any spelling: such a request was ssegate's own.
func homeUpstream(t *testing.T) *faultServer {
	t.Helper()
	var mu sync.Mutex
	return newFaultServer(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if leaked(r.RequestURI) {
			t.Errorf("upstream got %s %s: a resume URL left ssegate", r.Method, r.RequestURI)
		}
		okStream(w)
	})
}

// leaked reports whether a request URI names a resume token or a path
// under /streams, however escaped.
func leaked(uri string) bool {
	s := uri
	for range 4 {
		if u, err := url.PathUnescape(s); err == nil {
			s = u
		}
	}
	s = strings.ToLower(s)
	p, _, _ := strings.Cut(s, "?")
	return strings.Contains(s, "token=") || strings.Contains(p, "/streams") ||
		strings.HasPrefix(path.Clean("/"+strings.ReplaceAll(p, "\\", "/")), "/streams")
}

// TestResumeURLStaysHome: whatever the method and however the path is
// spelled, a request under /streams/ (and so every resume URL) is answered
// by ssegate and never relayed: GET serves the stream, HEAD its head,
// DELETE (a stop) needs the key's credential, not the URL's token,
// anything else 405 with Allow. Every usable key, however odd, is resumed
// by the URL ssegate gave for it. The upstream counts one call per key.
func TestResumeURLStaysHome(t *testing.T) {
	t.Parallel()
	up := homeUpstream(t)
	e := newEnvUpstream(t, up.url, nil, Config{}, cache.Config{})
	const auth = "Bearer sk-home"
	keys := []string{
		"plain", "a/b", "/lead", "trail/", "a//b", "./x", "x/./y", "x/../y", "../../v1/chat/completions",
		"..%2F..%2Fv1%2Fchat%2Fcompletions", "%2e%2e", "%", "%zz", "100%", "q?x=1&token=t", "frag#x", "a\\b",
		"~!$&'()*+,;=:@", `"<>[]^{|}` + "`", ".x", "x.", "...", "streams", "/streams/x",
	}
	methods := []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, "PROPFIND"}
	for _, key := range keys {
		post := e.fetch(req{key: key, auth: auth})
		if post.status != 200 || post.lastData() != "[DONE]" {
			t.Fatalf("POST key %q: got %d; want 200 and a whole stream", key, post.status)
		}
		rel := post.header.Get("Ssegate-Resume-Url")
		u := resolve(t, "/v1/chat/completions", rel)
		for _, m := range methods {
			got := e.fetch(req{method: m, path: u, body: "{}"})
			switch m {
			case http.MethodGet:
				if got.status != 200 || string(eventBytes(got.raw)) != string(eventBytes(post.raw)) {
					t.Errorf("GET %s (key %q): got %d; want 200 and the key's stream", u, key, got.status)
				}
			case http.MethodHead:
				if got.status != 200 || len(got.raw) != 0 || !strings.HasPrefix(got.header.Get("Content-Type"), "text/event-stream") ||
					got.header.Get("Ssegate-Resume-Url") == "" {
					t.Errorf("HEAD %s (key %q): got %d, %q, %d bytes; want 200, the stream's head and resume URL, no body",
						u, key, got.status, got.header.Get("Content-Type"), len(got.raw))
				}
			case http.MethodDelete:
				// A stop needs the key's credential: a resume URL's token
				// grants reading the stream, not stopping it.
				if got.status != http.StatusNotFound || got.errType != "stream_not_found" {
					t.Errorf("DELETE %s (key %q) without the credential: got %d %q; want 404 stream_not_found", u, key, got.status, got.errType)
				}
			default:
				if got.status != http.StatusMethodNotAllowed || got.errType != "invalid_request" || got.header.Get("Allow") != "GET, HEAD, DELETE" {
					t.Errorf("%s %s (key %q): got %d %q, Allow %q; want 405 invalid_request, Allow GET, HEAD, DELETE",
						m, u, key, got.status, got.errType, got.header.Get("Allow"))
				}
			}
		}
	}
	// Other spellings of a resume URL's path: whatever they get, it is not
	// the upstream's answer.
	post := e.fetch(req{key: "k/sp", auth: auth})
	u := resolve(t, "/v1/chat/completions", post.header.Get("Ssegate-Resume-Url"))
	q := u[strings.Index(u, "?"):]
	for _, p := range []string{
		"//streams/k%2Fsp", "/./streams/k%2Fsp", "/v1/../streams/k%2Fsp", "/v1/..%2Fstreams/k%2Fsp", "/%73treams/k%2Fsp",
		"/streams%2Fk%2Fsp", "/streams/k/sp", "/streams/..%2F..%2Fv1%2Fchat%2Fcompletions", "/streams/../v1/chat/completions",
		"/streams", "/streams/", "/v1/%2e%2e/streams/k%2Fsp", "/v1/%252e%252e/streams/k%2Fsp", "/x/..%5Cstreams/k%2Fsp",
	} {
		for _, m := range methods {
			got := e.fetch(req{method: m, path: p + q, body: "{}"})
			if got.header.Get("Content-Type") == "text/event-stream" && got.status == 200 && m != http.MethodGet && m != http.MethodHead {
				t.Errorf("%s %s: got a stream; want ssegate's refusal", m, p)
			}
		}
	}
	// The token spelled otherwise in the query is still seen as one.
	path, token, _ := strings.Cut(u, "?token=")
	for _, q := range []string{"?%74oken=" + token, "?x=1&token=" + token, "?token=" + url.QueryEscape(token)} {
		if got := e.fetch(req{method: http.MethodGet, path: path + q}); got.status != 200 {
			t.Errorf("GET %s: got %d; want 200 (the token)", path+q, got.status)
		}
	}
	wantCount(t, "upstream calls", up.calls.Load(), int64(len(keys)+1))
}

// TestStreamsWithoutStore: a proxy with no store relays every request
// unrecorded, but still none under /streams/: GET and HEAD find no
// stream, other methods get 405.
func TestStreamsWithoutStore(t *testing.T) {
	t.Parallel()
	up := homeUpstream(t)
	p, err := New(Config{Upstreams: []string{up.url}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Server().Serve(ln)                     //nolint:errcheck // ends with Shutdown
	t.Cleanup(func() { p.Server().Shutdown() }) //nolint:errcheck
	for m, want := range map[string]int{http.MethodGet: 404, http.MethodHead: 404, http.MethodPost: 405, http.MethodOptions: 405} {
		r, _ := http.NewRequest(m, "http://"+ln.Addr().String()+"/streams/k?token=t.1.2.mac", strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s /streams/k: got %d; want %d", m, resp.StatusCode, want)
		}
	}
	wantCount(t, "upstream calls", up.calls.Load(), 0)
}

// TestResumeURLHead: HEAD of a resume URL answers what GET would, without
// the body: a stored whole answer's type and length, a stream's head, and
// 204 after a finished stream's last event.
func TestResumeURLHead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const auth = "Bearer sk-head"
	whole := newKey("head-whole")
	post := e.fetch(req{key: whole, auth: auth, body: `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`})
	e.waitState(whole, auth, cache.StateCommitted)
	u := resolve(t, "/v1/chat/completions", post.header.Get("Ssegate-Resume-Url"))
	get := e.fetch(req{method: http.MethodGet, path: u})
	head := e.fetch(req{method: http.MethodHead, path: u})
	if get.status != 200 || head.status != 200 || len(head.raw) != 0 ||
		head.header.Get("Content-Type") != get.header.Get("Content-Type") ||
		head.header.Get("Content-Length") != strconv.Itoa(len(get.raw)) {
		t.Fatalf("HEAD of a whole answer: got %d, %q, length %q; want 200, %q, %d as GET",
			head.status, head.header.Get("Content-Type"), head.header.Get("Content-Length"), get.header.Get("Content-Type"), len(get.raw))
	}
	streamed := newKey("head-stream")
	post = e.fetch(req{key: streamed, auth: auth})
	e.waitState(streamed, auth, cache.StateCommitted)
	u = resolve(t, "/v1/chat/completions", post.header.Get("Ssegate-Resume-Url"))
	if got := e.fetch(req{method: http.MethodHead, path: u, lastEventID: post.ids[len(post.ids)-1]}); got.status != http.StatusNoContent {
		t.Fatalf("HEAD after the last event: got %d; want 204 as GET", got.status)
	}
	e.wantCalls(2)
}
