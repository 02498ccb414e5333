package mcp_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ssegate/ssegate/internal/mcpmock"
	"github.com/ssegate/ssegate/internal/redistest"
)

// TestReplicas: two replicas on one Redis share the tool calls' keys. A
// call cut on one replica while it runs is joined by its re-issue on the
// other and replayed by both after its end; a call whose server died on
// one is commit_unknown on the other too. The tool runs once.
func TestReplicas(t *testing.T) {
	// Keys and targets are unique, so the test may share a Redis (db 0)
	// with other packages' tests.
	url := "redis://" + redistest.Shared(t) + "/0"
	forModes(t, modes, func(t *testing.T, mode mode) {
		w := newWorld(t, mode, "-redis", url)
		other := w.startGate("-redis", url)
		target, key := unique("replicas"), unique("key")

		a := w.dial(w.gate.URL, "")
		go a.callTool(call("write", target, key, "a", nil)) // ends when a's session closes
		w.waitRuns(target, 1)
		a.cut()
		b := w.dial(other.URL, "")
		if _, err := b.cs.ListTools(context.Background(), nil); err != nil {
			t.Fatalf("tools/list on the other replica: %v", err)
		}
		r, err := b.callTool(call("write", target, key, "b", nil))
		if err != nil || mcpmock.Text(r) != wrote(target) {
			t.Fatalf("re-issue on the other replica: got %v, %v; want %q", r, err, wrote(target))
		}
		checkProgress(t, mode.json, b, "b")
		for _, url := range []string{w.gate.URL, other.URL} {
			c := w.dial(url, "")
			if r, err := c.callTool(call("write", target, key, "c", nil)); err != nil || mcpmock.Text(r) != wrote(target) {
				t.Fatalf("re-issue on %s after the end: got %v, %v; want %q", url, r, err, wrote(target))
			}
		}
		w.settle(target, 1)

		target, key = unique("replicas-dies"), unique("key")
		for _, url := range []string{w.gate.URL, other.URL} {
			c := w.dial(url, "")
			_, err := c.callTool(call("write", target, key, "p", map[string]any{"die": true}))
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown") {
				t.Fatalf("call on %s: got %v; want a JSON-RPC error saying the outcome is unknown", url, err)
			}
		}
		w.settle(target, 1)
	})
}
