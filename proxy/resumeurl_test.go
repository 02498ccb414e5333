package proxy

import (
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
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
	rel := miss.Header.Get("Ssegate-Resume-Url")
	if !strings.HasPrefix(rel, "../../streams/"+url.PathEscape(key)+"?token=") {
		t.Fatalf("miss: Ssegate-Resume-Url %q; want ../../streams/{escaped key}?token=…, relative to /v1/chat/completions", rel)
	}
	u := resolve(t, "/v1/chat/completions", rel)
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
	gen, rest, _ := strings.Cut(rest, ".")
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
	g, _ := strconv.ParseUint(gen, 10, 64)
	expired := e.proxy.resumeToken(cache.Scope{Tenant: tenant, Key: key}, g, time.Now().Add(-time.Second))
	bad := map[string]string{
		"mac altered":        path + "?token=" + tenant + "." + gen + "." + exp + "." + flip(sig, len(sig)/2),
		"expiry altered":     path + "?token=" + tenant + "." + gen + "." + flip(exp, len(exp)-1) + "." + sig,
		"tenant altered":     path + "?token=" + flip(tenant, 0) + "." + gen + "." + exp + "." + sig,
		"generation altered": path + "?token=" + tenant + "." + flip(gen, len(gen)-1) + "." + exp + "." + sig,
		"no generation":      path + "?token=" + tenant + "." + exp + "." + sig,
		"two tokens":         u + "&token=" + token,
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

// resolve resolves the relative reference ref against the path of the
// request it answered, as a client does: the path and query to request.
func resolve(t *testing.T, from, ref string) string {
	t.Helper()
	r, err := url.Parse(ref)
	if err != nil {
		t.Fatalf("Ssegate-Resume-Url %q: %v", ref, err)
	}
	u := (&url.URL{Scheme: "http", Host: "gate", Path: from}).ResolveReference(r)
	return u.EscapedPath() + "?" + u.RawQuery
}

// TestResumeTokenOneSpelling: a token has one spelling. Every
// single-character alteration of it, at each position to each character a
// token may hold (the base64url alphabet, the dot, and padding), is refused
// with 403 invalid_resume_token: the mac is decoded strictly, so the
// unused bits of its last character count.
func TestResumeTokenOneSpelling(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	key := newKey("spelling")
	post := e.fetch(req{key: key, auth: "Bearer sk-spelling"})
	u := resolve(t, "/v1/chat/completions", post.header.Get("Ssegate-Resume-Url"))
	path, token, _ := strings.Cut(u, "?token=")
	if got := e.fetch(req{method: http.MethodGet, path: u}); got.status != 200 {
		t.Fatalf("GET %s: got %d; want 200", u, got.status)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.="
	type alteration struct{ pos, c int }
	work := make(chan alteration)
	var wg sync.WaitGroup
	const workers = 4
	// Each worker keeps its connection: a new one per request costs more
	// than the request.
	e.client.Transport.(*http.Transport).MaxIdleConnsPerHost = workers
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := range work {
				b := []byte(token)
				b[a.pos] = alphabet[a.c]
				got := e.fetch(req{method: http.MethodGet, path: path + "?token=" + url.QueryEscape(string(b))})
				if got.status != http.StatusForbidden || got.errType != "invalid_resume_token" {
					t.Errorf("token with byte %d changed from %q to %q: got %d %q; want 403 invalid_resume_token",
						a.pos, token[a.pos], alphabet[a.c], got.status, got.errType)
				}
			}
		}()
	}
	n := 0
	for pos := range len(token) {
		for c := range len(alphabet) {
			if alphabet[c] != token[pos] {
				work <- alteration{pos, c}
				n++
			}
		}
	}
	close(work)
	wg.Wait()
	t.Logf("%d alterations of a %d-byte token, each refused", n, len(token))
	e.wantCalls(1)
}

// tokenExpiry is the expiry a resume URL's token states.
func tokenExpiry(t *testing.T, u string) time.Time {
	t.Helper()
	_, token, _ := strings.Cut(u, "?token=")
	parts := strings.Split(token, ".")
	if len(parts) != 4 {
		t.Fatalf("token %q: got %d parts; want tenant.generation.expiry.mac", token, len(parts))
	}
	secs, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		t.Fatalf("token %q: expiry: %v", token, err)
	}
	return time.Unix(secs, 0)
}

// TestResumeTokenNotProlonged: the resume URL of an answer authorised by a
// token expires no later than that token, however often it is polled; an
// answer authorised by a credential gets the full -ttl.
func TestResumeTokenNotProlonged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const auth = "Bearer sk-poll"
	key := newKey("poll")
	post := e.fetch(req{key: key, auth: auth})
	u := resolve(t, "/v1/chat/completions", post.header.Get("Ssegate-Resume-Url"))
	e.waitState(key, auth, cache.StateCommitted)
	gen, _ := sse.ParseID(post.ids[0])
	short := time.Now().Add(5 * time.Second).Truncate(time.Second)
	path, _, _ := strings.Cut(u, "?token=")
	next := path + "?token=" + e.proxy.resumeToken(cache.Scope{Tenant: e.tenantOf(auth), Key: key}, gen.Gen, short)
	for i := range 3 {
		got := e.fetch(req{method: http.MethodGet, path: next})
		if got.status != 200 {
			t.Fatalf("poll %d: got %d; want 200", i, got.status)
		}
		rel := got.header.Get("Ssegate-Resume-Url")
		if rel == "" {
			t.Fatalf("poll %d: no Ssegate-Resume-Url", i)
		}
		next = resolve(t, path, rel)
		if exp := tokenExpiry(t, next); exp.After(short) {
			t.Fatalf("poll %d: the derived URL expires at %v; want no later than its token's %v", i, exp, short)
		}
	}
	byCredential := e.fetch(req{method: http.MethodGet, path: path, auth: auth})
	long := tokenExpiry(t, resolve(t, path, byCredential.header.Get("Ssegate-Resume-Url")))
	if time.Until(long) < 23*time.Hour {
		t.Fatalf("GET by credential: resume URL expires in %v; want -ttl (24h)", time.Until(long))
	}
	e.wantCalls(1)
}

// TestResumeTokenGeneration: a resume URL opens the generation it was
// issued for and no other. Once its key has a later generation (after an
// abort here; after the TTL likewise), the old URL answers 410
// stream_gone, with or without a Last-Event-ID of either generation, and
// the later generation's answers carry a URL of their own that opens it.
func TestResumeTokenGeneration(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const auth = "Bearer sk-gen"
	key := newKey("gen")
	first := e.fetch(req{key: key, auth: auth, header: map[string]string{"X-Mock-Fault": "eof-after=4"}})
	e.waitState(key, auth, cache.StateFailedRetryable)
	old := resolve(t, "/v1/chat/completions", first.header.Get("Ssegate-Resume-Url"))
	if got := e.fetch(req{method: http.MethodGet, path: old}); got.status != http.StatusGone {
		t.Fatalf("old URL after its generation aborted: got %d; want 410", got.status)
	}
	second := e.fetch(req{key: key, auth: auth})
	if !clean(second) {
		t.Fatalf("second generation: got %d, last %q; want a whole stream", second.status, second.lastData())
	}
	e.waitState(key, auth, cache.StateCommitted)
	fresh := resolve(t, "/v1/chat/completions", second.header.Get("Ssegate-Resume-Url"))
	for name, r := range map[string]req{
		"no Last-Event-ID":             {method: http.MethodGet, path: old},
		"its own generation's id":      {method: http.MethodGet, path: old, lastEventID: first.ids[1]},
		"the later generation's id":    {method: http.MethodGet, path: old, lastEventID: second.ids[1]},
		"the later generation's start": {method: http.MethodHead, path: old},
	} {
		if got := e.fetch(r); got.status != http.StatusGone || (r.method != http.MethodHead && got.errType != "stream_gone") {
			t.Errorf("old URL, %s: got %d %q; want 410 stream_gone", name, got.status, got.errType)
		}
	}
	if fresh == old {
		t.Fatal("the later generation got the old URL")
	}
	got := e.fetch(req{method: http.MethodGet, path: fresh})
	if got.status != 200 || string(eventBytes(got.raw)) != string(eventBytes(second.raw)) {
		t.Fatalf("the later generation's URL: got %d; want 200 and its stream", got.status)
	}
	// A URL issued by a resume carries the generation it served.
	again := resolve(t, "/streams/x", got.header.Get("Ssegate-Resume-Url"))
	if got := e.fetch(req{method: http.MethodGet, path: again}); got.status != 200 {
		t.Fatalf("the URL a resume gave: got %d; want 200", got.status)
	}
	e.wantCalls(2)
}

// TestResumeTokenQueryCredential: a stream whose only credential is the
// key query parameter (Gemini's form) gets a resume URL that carries no
// trace of it and opens the stream without it; the same key under another
// query credential is another tenant's, a new generation of its own.
func TestResumeTokenQueryCredential(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	key := newKey("query")
	first := e.fetch(req{key: key, path: "/v1/chat/completions?key=k-query-one"})
	if !clean(first) {
		t.Fatalf("first: got %d, last %q; want a whole stream", first.status, first.lastData())
	}
	u := first.header.Get("Ssegate-Resume-Url")
	if u == "" || strings.Contains(u, "k-query-one") || strings.Contains(u, "key=") {
		t.Fatalf("resume URL %q: want one that names no credential", u)
	}
	got := e.fetch(req{method: http.MethodGet, path: resolve(t, "/v1/chat/completions", u)})
	if got.status != 200 || string(eventBytes(got.raw)) != string(eventBytes(first.raw)) {
		t.Fatalf("resume by URL alone: got %d; want 200 and the stream", got.status)
	}
	other := e.fetch(req{key: key, path: "/v1/chat/completions?key=k-query-two"})
	if !clean(other) || other.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("another query credential: got %d, replayed %q; want a new generation of its own", other.status, other.header.Get("Idempotent-Replayed"))
	}
	e.wantCalls(2)
}
