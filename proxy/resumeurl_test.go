package proxy

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
)

// TestResumeURL: every answer of a keyed stream (miss, join, hit, resume)
// carries a signed resume URL; a GET of it with no credential serves that
// key's stream as GET /streams/{key} does for its tenant, Last-Event-ID
// included. A token altered anywhere, expired, or used on another key's
// path gets 403 invalid_resume_token and learns nothing of the key.
func TestResumeURL(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(5*time.Millisecond, 40))
	const auth = "Bearer sk-tenant-a"
	key := "a/key?with%odd#chars-" + newKey("r")
	other := newKey("other")
	miss := e.do(req{key: key, auth: auth})
	u := miss.Header.Get("Ssegate-Resume-Url")
	if !strings.HasPrefix(u, "/streams/"+url.PathEscape(key)+"?token=") {
		t.Fatalf("miss: Ssegate-Resume-Url %q; want /streams/{escaped key}?token=…", u)
	}
	join := e.do(req{key: key, auth: auth})
	if join.Header.Get("Ssegate-Resume-Url") == "" {
		t.Fatal("join: no Ssegate-Resume-Url")
	}
	missRes := readAll(t, miss)
	readAll(t, join)
	e.waitState(key, auth, cache.StateCommitted)
	hit := e.fetch(req{key: key, auth: auth})
	if hit.header.Get("Ssegate-Resume-Url") == "" || !hit.replayed {
		t.Fatalf("hit: replayed %v, Ssegate-Resume-Url %q; want both", hit.replayed, hit.header.Get("Ssegate-Resume-Url"))
	}
	resumed := e.fetch(req{key: key, auth: auth, lastEventID: missRes.ids[10]})
	if resumed.header.Get("Ssegate-Resume-Url") == "" {
		t.Fatal("resume: no Ssegate-Resume-Url")
	}
	e.fetch(req{key: other, auth: auth})

	// The URL alone, no credential: the whole stream, and from an id on.
	whole := e.fetch(req{method: http.MethodGet, path: u})
	if whole.status != 200 || string(eventBytes(whole.raw)) != string(eventBytes(missRes.raw)) {
		t.Fatalf("GET resume URL: got %d, %d events; want 200 and the stream", whole.status, len(whole.events))
	}
	after := e.fetch(req{method: http.MethodGet, path: u, lastEventID: missRes.ids[30]})
	if id, _ := sse.ParseID(after.ids[0]); len(after.events) != len(missRes.events)-31 || id.Seq != 32 {
		t.Fatalf("GET resume URL after id 31: got %d events from %q; want the %d after it", len(after.events), after.ids[0], len(missRes.events)-31)
	}
	// Without the token, no credential: another tenant's key is not found.
	if got := e.fetch(req{method: http.MethodGet, path: "/streams/" + url.PathEscape(key)}); got.status != http.StatusNotFound {
		t.Fatalf("GET without token or credential: got %d; want 404", got.status)
	}

	path, token, _ := strings.Cut(u, "?token=")
	tenant, rest, _ := strings.Cut(token, ".")
	exp, sig, _ := strings.Cut(rest, ".")
	flip := func(s string, i int) string {
		b := []byte(s)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	expired := e.proxy.resumeToken(cache.Scope{Tenant: tenant, Key: key}, time.Now().Add(-time.Second))
	bad := map[string]string{
		"mac altered":        path + "?token=" + tenant + "." + exp + "." + flip(sig, len(sig)/2),
		"expiry altered":     path + "?token=" + tenant + "." + flip(exp, len(exp)-1) + "." + sig,
		"tenant altered":     path + "?token=" + flip(tenant, 0) + "." + exp + "." + sig,
		"expired":            path + "?token=" + expired,
		"another key":        "/streams/" + url.PathEscape(other) + "?token=" + token,
		"empty":              path + "?token=",
		"not a token":        path + "?token=xyz",
		"an unknown key too": "/streams/never-was?token=" + token,
	}
	for name, p := range bad {
		got := e.fetch(req{method: http.MethodGet, path: p})
		if got.status != http.StatusForbidden || got.errType != "invalid_resume_token" {
			t.Errorf("%s: got %d %q; want 403 invalid_resume_token", name, got.status, got.errType)
		}
		if strings.Contains(string(got.raw), key) {
			t.Errorf("%s: the answer names the key: %s", name, got.raw)
		}
	}
	e.wantCalls(2)
}

func readAll(t *testing.T, resp *http.Response) result {
	t.Helper()
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return parseResult(resp, raw, err)
}
