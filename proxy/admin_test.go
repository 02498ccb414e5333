package proxy

import (
	"net/http"
	"strings"
	"testing"
)

// TestHealth: /healthz always answers; /readyz answers 503 while draining.
func TestHealth(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if got := e.fetch(req{method: http.MethodGet, path: "/healthz"}); got.status != 200 {
		t.Fatalf("healthz: got %d; want 200", got.status)
	}
	if got := e.fetch(req{method: http.MethodGet, path: "/readyz"}); got.status != 200 {
		t.Fatalf("readyz: got %d %s; want 200", got.status, got.raw)
	}
	e.proxy.Drain()
	got := e.fetch(req{method: http.MethodGet, path: "/readyz"})
	if got.status != 503 || !strings.Contains(string(got.raw), "draining") {
		t.Fatalf("readyz while draining: got %d %s; want 503 draining", got.status, got.raw)
	}
}
