package replicas_test

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mockllm"
)

// send makes one request with the given headers (and no other credential)
// and reads its answer whole.
func send(t *testing.T, method, url, key string, header map[string]string) *stream {
	t.Helper()
	rd := strings.NewReader("")
	if method == http.MethodPost {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	s := &stream{status: resp.StatusCode, header: resp.Header, resp: resp, r: bufio.NewReader(resp.Body)}
	return s.readAll()
}

// TestTenantAcrossReplicas: replicas on one Redis, started without
// -secret, share the secret Redis keeps, so one credential is one tenant
// on all of them: a keyed request on A is a hit on B. The same value in
// another credential header is another tenant there, and a request with
// no credential learns nothing of the key.
func TestTenantAcrossReplicas(t *testing.T) {
	backends(t, func(t *testing.T, be backend) {
		e := be.newEnv(t, mockllm.Config{Tokens: 5, Delay: time.Millisecond})
		a, b := e.start("A"), e.start("B")
		azure := map[string]string{"api-key": "azure-A"}
		first := send(t, http.MethodPost, a.URL+"/v1/chat/completions", "k1", azure)
		if first.status != 200 || !first.clean() {
			t.Fatalf("first request on A: status %d, clean %v; want 200, clean", first.status, first.clean())
		}
		onB := send(t, http.MethodPost, b.URL+"/v1/chat/completions", "k1", azure)
		if onB.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(onB.raw, first.raw) {
			t.Fatalf("same credential on B: status %d, Idempotent-Replayed %q; want A's stream replayed", onB.status, onB.header.Get("Idempotent-Replayed"))
		}
		moved := send(t, http.MethodPost, b.URL+"/v1/chat/completions", "k1", map[string]string{"x-goog-api-key": "azure-A"})
		if moved.status != 200 || moved.header.Get("Idempotent-Replayed") == "true" {
			t.Fatalf("the value under x-goog-api-key on B: status %d, Idempotent-Replayed %q; want a generation of its own", moved.status, moved.header.Get("Idempotent-Replayed"))
		}
		for _, g := range []*gatetest.Process{a, b} {
			for _, p := range []string{"/keys/k1", "/streams/k1"} {
				if s := send(t, http.MethodGet, g.URL+p, "", nil); s.status != 404 {
					t.Fatalf("GET %s on %s without a credential: got %d; want 404", p, g.Name, s.status)
				}
			}
		}
		// The signed resume URL A gave opens the stream on B with no
		// credential (the replicas share the secret); altered, it does not.
		u := first.header.Get("Ssegate-Resume-Url")
		if u == "" {
			t.Fatal("first request on A: no Ssegate-Resume-Url")
		}
		u = resolved(t, b.URL+"/v1/chat/completions", u)
		if s := send(t, http.MethodGet, u, "", nil); s.status != 200 || !bytes.Equal(s.raw, first.raw) {
			t.Fatalf("A's resume URL on B: got %d; want 200 and A's stream", s.status)
		}
		if s := send(t, http.MethodGet, u[:len(u)-2]+"xx", "", nil); s.status != 403 {
			t.Fatalf("A's resume URL altered, on B: got %d; want 403", s.status)
		}
		if n := e.mock.Calls(); n != 2 {
			t.Fatalf("upstream calls: got %d; want 2", n)
		}
		ctx := context.Background()
		secret, err := e.rc.Do(ctx, e.rc.B().Get().Key("ssg:secret").Build()).ToString()
		if err != nil || len(secret) < 16 {
			t.Fatalf("ssg:secret: got %q (%v); want the shared secret", secret, err)
		}
		for _, k := range e.keys("*") {
			if k != "ssg:secret" && k != "ssg:keys:{all}" && k != "ssg:strangers:{all}" && !strings.HasPrefix(k, "ssg:{") && !strings.HasPrefix(k, "ssg:tenant:{") {
				t.Fatalf("Redis key %q: want ssg:secret, ssg:keys:{all}, ssg:strangers:{all}, ssg:{hash of tenant and key}:… or ssg:tenant:{tenant}…", k)
			}
		}
	})
}
