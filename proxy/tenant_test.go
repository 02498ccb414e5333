package proxy

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/valyala/fasthttp"
)

// TestTenantCredentials: every credential a request carries makes its
// tenant: a second request with the same key and body and another value
// of any credential is a miss, never a replay of the first; the same
// value is a hit; the same value under another name is another tenant.
// A request without a credential neither sees nor learns of the key.
func TestTenantCredentials(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withConfig(func(c *Config) { c.TenantHeaders = []string{"X-Org-Id"} }))
	path := "/v1/chat/completions"
	cases := []struct {
		name string
		a, b req // a first, then b: another value of the same credential
	}{
		{"Authorization", req{auth: "Bearer sk-a"}, req{auth: "Bearer sk-b"}},
		{"x-api-key", req{header: map[string]string{"x-api-key": "A"}}, req{header: map[string]string{"x-api-key": "B"}}},
		{"api-key", req{header: map[string]string{"api-key": "A"}}, req{header: map[string]string{"api-key": "B"}}},
		{"x-goog-api-key", req{header: map[string]string{"x-goog-api-key": "A"}}, req{header: map[string]string{"x-goog-api-key": "B"}}},
		{"key parameter", req{path: path + "?alt=sse&key=A"}, req{path: path + "?alt=sse&key=B"}},
		{"-tenant-header", req{auth: "Bearer shared", header: map[string]string{"x-org-id": "org-1"}},
			req{auth: "Bearer shared", header: map[string]string{"x-org-id": "org-2"}}},
		{"moved to another header", req{header: map[string]string{"api-key": "A"}}, req{header: map[string]string{"x-goog-api-key": "A"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key := newKey("cred")
			calls := e.calls()
			c.a.key, c.b.key = key, key
			if r := e.fetch(c.a); r.status != 200 || r.replayed {
				t.Fatalf("first request: got %d, replayed %v; want 200, not replayed", r.status, r.replayed)
			}
			if r := e.fetch(c.b); r.status != 200 || r.replayed {
				t.Fatalf("other credential: got %d, replayed %v; want 200 from a generation of its own", r.status, r.replayed)
			}
			if r := e.fetch(c.a); !r.replayed {
				t.Fatalf("same credential again: got %d, replayed %v; want a replay", r.status, r.replayed)
			}
			if got := e.calls() - calls; got != 2 {
				t.Fatalf("upstream calls: got %d; want 2", got)
			}
			for _, p := range []string{"/keys/", "/streams/"} {
				if r := e.fetch(req{method: http.MethodGet, path: p + key}); r.status != 404 {
					t.Fatalf("GET %s without a credential: got %d; want 404", p, r.status)
				}
			}
		})
	}
}

// TestTenantIsolation: another credential with the same key and body
// never sees, joins or resumes the first tenant's stream.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(5*time.Millisecond, 20))
	key := newKey("tenant")
	a := e.fetch(req{key: key, auth: "Bearer sk-tenant-a"})
	b := e.fetch(req{key: key, auth: "Bearer sk-tenant-b"})
	if b.replayed {
		t.Fatalf("tenant b got a replay of tenant a's stream")
	}
	e.wantCalls(2)
	// Resume and key lookups are scoped too.
	got := e.fetch(req{method: http.MethodGet, path: "/streams/" + key, auth: "Bearer sk-tenant-c"})
	if got.status != 404 {
		t.Fatalf("GET /streams by tenant c: got %d; want 404", got.status)
	}
	got = e.fetch(req{key: key, auth: "Bearer sk-tenant-c", lastEventID: a.ids[2]})
	if got.status != 410 {
		t.Fatalf("POST resume by tenant c: got %d; want 410", got.status)
	}
	got = e.fetch(req{method: http.MethodGet, path: "/keys/" + key, auth: "x"})
	if got.status != 404 {
		t.Fatalf("GET /keys by another tenant: got %d; want 404", got.status)
	}
	e.wantCalls(2)
}

// TestAnonymousKeys: a keyed request, a resume or a key lookup without a
// credential is the shared anonymous tenant by default, and 401
// credential_required under AnonymousDeny; unkeyed requests and requests
// with a credential are served either way.
func TestAnonymousKeys(t *testing.T) {
	t.Parallel()
	t.Run("allow", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		key := newKey("anon")
		e.fetch(req{key: key})
		if r := e.fetch(req{key: key}); !r.replayed {
			t.Fatalf("anonymous repeat: got %d, replayed %v; want a replay", r.status, r.replayed)
		}
		if r := e.fetch(req{method: http.MethodGet, path: "/keys/" + key}); r.status != 200 {
			t.Fatalf("GET /keys anonymous: got %d; want 200", r.status)
		}
	})
	t.Run("deny", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, withConfig(func(c *Config) { c.AnonymousKeys = AnonymousDeny }))
		key := newKey("anon")
		for what, r := range map[string]req{
			"keyed POST":         {key: key},
			"resume by POST":     {key: key, lastEventID: "1-1"},
			"GET /streams/{key}": {method: http.MethodGet, path: "/streams/" + key},
			"GET /keys/{key}":    {method: http.MethodGet, path: "/keys/" + key},
		} {
			got := e.fetch(r)
			if got.status != 401 || got.errType != "credential_required" || got.header.Get("WWW-Authenticate") == "" {
				t.Fatalf("%s without a credential: got %d %q; want 401 credential_required with WWW-Authenticate", what, got.status, got.errType)
			}
		}
		e.wantCalls(0)
		if r := e.fetch(req{}); r.status != 200 {
			t.Fatalf("unkeyed request: got %d; want 200 (relayed)", r.status)
		}
		if r := e.fetch(req{key: key, header: map[string]string{"api-key": "A"}}); r.status != 200 {
			t.Fatalf("keyed request with api-key: got %d; want 200", r.status)
		}
		if r := e.fetch(req{method: http.MethodGet, path: "/keys/" + key, header: map[string]string{"api-key": "A"}}); r.status != 200 {
			t.Fatalf("GET /keys with the credential: got %d; want 200", r.status)
		}
	})
}

// TestTenantSecret: the tenant is an HMAC keyed by Config.Secret: the
// same credential is the same tenant under the same secret, another
// under another secret; a secret shorter than MinSecretBytes is refused.
func TestTenantSecret(t *testing.T) {
	t.Parallel()
	tenantUnder := func(secret string) string {
		p, err := New(Config{Upstreams: []string{"http://127.0.0.1:1"}, Secret: []byte(secret)})
		if err != nil {
			t.Fatal(err)
		}
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.Set("Authorization", "Bearer sk-weak")
		tn, ok := p.tenant(&ctx)
		if !ok {
			t.Fatal("Authorization: not taken as a credential")
		}
		return tn
	}
	s1, s2 := "0123456789abcdef-one", "0123456789abcdef-two"
	if a, b := tenantUnder(s1), tenantUnder(s1); a != b {
		t.Fatalf("one secret: tenants %s and %s; want one", a, b)
	}
	if a, b := tenantUnder(s1), tenantUnder(s2); a == b {
		t.Fatalf("two secrets: both tenant %s; want two", a)
	}
	if a, b := tenantUnder(""), tenantUnder(""); a == b {
		t.Fatalf("no secret, two proxies: both tenant %s; want a random secret each", a)
	}
	if _, err := New(Config{Upstreams: []string{"http://127.0.0.1:1"}, Secret: []byte("short")}); err == nil {
		t.Fatal("a 5-byte secret: accepted; want an error")
	}
}

// TestNoCredentialInLogs: a whole keyed exchange, miss, hit, resume and
// lookups, with every kind of credential, logs none of them at debug level.
func TestNoCredentialInLogs(t *testing.T) {
	t.Parallel()
	var logs gatetest.LogBuffer
	e := newEnv(t, withConfig(func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.TenantHeaders = []string{"x-org"}
	}))
	creds := map[string]string{"Authorization": "Bearer cred-1", "x-api-key": "cred-2", "api-key": "cred-3",
		"x-goog-api-key": "cred-4", "x-org": "cred-5"}
	key := newKey("nolog")
	path := "/v1/chat/completions?key=cred-6"
	first := e.fetch(req{key: key, path: path, header: creds})
	e.fetch(req{key: key, path: path, header: creds})
	e.fetch(req{key: key, path: path, header: creds, lastEventID: first.ids[1]})
	e.fetch(req{key: key, path: path, header: creds, body: `{"other":1}`})
	e.fetch(req{method: http.MethodGet, path: "/streams/" + key + "?key=cred-6", header: creds})
	e.fetch(req{method: http.MethodGet, path: "/keys/" + key + "?key=cred-6", header: creds})
	if !strings.Contains(logs.String(), `"decision":"hit"`) {
		t.Fatalf("no decision logged:\n%s", logs.String())
	}
	for i := 1; i <= 6; i++ {
		if c := fmt.Sprintf("cred-%d", i); strings.Contains(logs.String(), c) {
			t.Errorf("the log carries credential %s:\n%s", c, logs.String())
		}
	}
}

// TestMACsKept: a tenant and a resume token are the HMAC-SHA256, keyed by
// the secret, of their length-prefixed parts, however the proxy computes
// them: replicas of two releases share a store, and its keys are scoped
// by the tenant. Each MAC is computed twice, so a reused state shows.
func TestMACsKept(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef-kept")
	p, err := New(Config{Upstreams: []string{"http://127.0.0.1:1"}, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	want := func(parts ...string) [sha256.Size]byte {
		m := hmac.New(sha256.New, secret)
		for _, s := range parts {
			m.Write(binary.AppendUvarint(nil, uint64(len(s))))
			m.Write([]byte(s))
		}
		var sum [sha256.Size]byte
		m.Sum(sum[:0])
		return sum
	}
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.Set("Authorization", "Bearer sk-one")
	ctx.Request.Header.Set("x-api-key", "sk-two")
	ctx.Request.SetRequestURI("/v1/chat/completions?key=sk-three")
	w := want("tenant", "authorization", "Bearer sk-one", "x-api-key", "sk-two", "?key", "sk-three")
	for range 2 {
		if got, _ := p.tenant(&ctx); got != hex.EncodeToString(w[:16]) {
			t.Errorf("tenant: got %s; want %s", got, hex.EncodeToString(w[:16]))
		}
	}
	w = want("resume", "tenant-a", "key-b", "7", "1800000000")
	for range 2 {
		if got := p.resumeMAC("tenant-a", "key-b", "7", "1800000000"); got != w {
			t.Errorf("resume MAC: got %x; want %x", got, w)
		}
	}
}

// TestMACWiped: a MAC state given back to be reused holds none of the
// credentials it hashed.
func TestMACWiped(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Upstreams: []string{"http://127.0.0.1:1"}, Secret: []byte("0123456789abcdef-wiped")})
	if err != nil {
		t.Fatal(err)
	}
	m := p.newMAC("tenant")
	m.add("authorization")
	m.add("Bearer sk-wiped")
	p.sumMAC(m)
	if all := m.parts[:cap(m.parts)]; bytes.Contains(all, []byte("sk-wiped")) {
		t.Fatalf("a MAC given back holds %q; want its parts wiped", m.parts)
	}
	// The hash's state keeps the last block it hashed unless reset.
	if held := heldBytes(reflect.ValueOf(m.h), map[uintptr]bool{}); bytes.Contains(held, []byte("sk-wiped")) {
		t.Fatal("a MAC given back holds the credential in its hash's state; want it wiped")
	}
}

// heldBytes returns every byte v holds in byte arrays and slices,
// following pointers, interfaces and fields, exported or not.
func heldBytes(v reflect.Value, seen map[uintptr]bool) []byte {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		if v.Kind() == reflect.Pointer {
			if seen[v.Pointer()] {
				return nil
			}
			seen[v.Pointer()] = true
		}
		return heldBytes(v.Elem(), seen)
	case reflect.Struct:
		var out []byte
		for i := range v.NumField() {
			out = append(out, heldBytes(v.Field(i), seen)...)
		}
		return out
	case reflect.Array, reflect.Slice:
		var out []byte
		for i := range v.Len() {
			if e := v.Index(i); e.Kind() == reflect.Uint8 {
				out = append(out, byte(e.Uint()))
			} else {
				out = append(out, heldBytes(e, seen)...)
			}
		}
		return out
	}
	return nil
}

// TestAccounts: a request's accounts are its distinct secret credential
// values, each alone, whatever carries it: a Bearer token and the same
// value in x-api-key, api-key, x-goog-api-key or ?key= are one account
// (the scheme and the spaces around it are no part of it), two values
// are two, a -tenant-header value is none. Past -max-credentials
// distinct values a keyed request gets 400 invalid_request and no
// upstream call; at it, it is served.
func TestAccounts(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Upstreams: []string{"http://127.0.0.1:1"}, Secret: []byte("0123456789abcdef-accounts"), TenantHeaders: []string{"x-org"}})
	if err != nil {
		t.Fatal(err)
	}
	accounts := func(uri string, kv ...string) []string {
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI(uri)
		for i := 0; i < len(kv); i += 2 {
			ctx.Request.Header.Add(kv[i], kv[i+1])
		}
		a, n := p.accounts(&ctx)
		if n != len(a) {
			t.Fatalf("%v: %d accounts, %d values; want as many", kv, len(a), n)
		}
		return a
	}
	one := accounts("/v1/chat/completions", "Authorization", "Bearer sk-one")
	if len(one) != 1 {
		t.Fatalf("Bearer sk-one: accounts %v; want one", one)
	}
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.Set("Authorization", "Bearer sk-one")
	if tn, _ := p.tenant(&ctx); tn == one[0] {
		t.Fatalf("the account of sk-one is its tenant's hash %s; want a MAC of another purpose", tn)
	}
	for _, c := range []struct {
		uri string
		kv  []string
	}{
		{"/", []string{"Authorization", "bearer   sk-one  "}},
		{"/", []string{"Authorization", "BEARER sk-one"}},
		{"/", []string{"Authorization", "sk-one"}},
		{"/", []string{"x-api-key", "sk-one"}},
		{"/", []string{"api-key", "sk-one"}},
		{"/", []string{"x-goog-api-key", "sk-one"}},
		{"/?key=sk-one", nil},
		{"/?key=sk-one", []string{"Authorization", "Bearer sk-one", "api-key", "sk-one", "x-org", "user-7"}},
	} {
		if got := accounts(c.uri, c.kv...); !slices.Equal(got, one) {
			t.Errorf("%s %v: accounts %v; want sk-one's alone, %v", c.uri, c.kv, got, one)
		}
	}
	two := accounts("/?key=sk-two", "Authorization", "Bearer sk-one", "x-org", "user-7")
	if len(two) != 2 || two[0] != one[0] || two[1] == one[0] {
		t.Errorf("sk-one and sk-two: accounts %v; want sk-one's, %v, then another", two, one)
	}
	if got := accounts("/", "x-org", "user-7"); got != nil {
		t.Errorf("a -tenant-header alone: accounts %v; want none (the tenant is its account)", got)
	}
	if got := accounts("/"); got != nil {
		t.Errorf("no credential: accounts %v; want none", got)
	}

	e := newEnv(t)
	creds := map[string]string{"x-api-key": "c-2", "api-key": "c-3", "x-goog-api-key": "c-4"}
	at := req{key: newKey("creds"), auth: "Bearer c-1", header: creds, path: "/v1/chat/completions?key=c-5"}
	if r := e.fetch(at); !clean(r) {
		t.Fatalf("5 credential values, -max-credentials 5: got %d %q; want a clean stream", r.status, r.raw)
	}
	calls := e.calls()
	past := req{key: newKey("creds"), auth: "Bearer c-1", header: creds, path: "/v1/chat/completions?key=c-5&key=c-6"}
	if r := e.fetch(past); r.status != http.StatusBadRequest || r.errType != "invalid_request" || !strings.Contains(string(r.raw), "-max-credentials") {
		t.Fatalf("6 credential values, -max-credentials 5: got %d %q; want 400 invalid_request naming -max-credentials", r.status, r.raw)
	}
	past.path = "/v1/chat/completions?key=c-5&key=c-1" // a value again: still 5
	if r := e.fetch(past); !clean(r) {
		t.Fatalf("5 distinct values of 6: got %d %q; want a clean stream", r.status, r.raw)
	}
	wantCount(t, "upstream calls", e.calls()-calls, 1)
}
