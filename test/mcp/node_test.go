package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/mcpmock"
)

// nodeModes are the server's modes the TypeScript client is tested
// against: it speaks 2025-11-25, with sessions or without.
var nodeModes = []mode{{"sse-sessions", false, false}, {"json-stateless", true, true}}

// tsResult is one call's outcome as client.mjs reports it.
type tsResult struct {
	Text     string `json:"text"`
	IsError  bool   `json:"isError"`
	Error    string `json:"error"`
	Progress int    `json:"progress"`
}

// node runs client.mjs's scenario through g with opts (url, runs and auth
// are set here) and decodes what it prints into out.
func (w *world) node(url, scenario string, opts map[string]any, out any) {
	w.t.Helper()
	bin, err := exec.LookPath("node")
	if err != nil {
		if isCI() {
			w.t.Fatalf("node is not installed: %v", err)
		}
		w.t.Skipf("the TypeScript SDK client needs node: %v", err)
	}
	if _, err := os.Stat(filepath.Join("node", "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		if isCI() {
			w.t.Fatalf("the TypeScript SDK is not installed (npm ci in test/mcp/node): %v", err)
		}
		w.t.Skipf("the TypeScript SDK is not installed: run npm ci in test/mcp/node (%v)", err)
	}
	opts["url"], opts["runs"], opts["auth"] = url, w.up+mcpmock.RunsPath, w.auth
	arg, _ := json.Marshal(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "client.mjs", scenario, string(arg))
	cmd.Dir = "node"
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		w.t.Fatalf("node client.mjs %s: %v\nstdout: %s\nstderr: %s", scenario, err, stdout.String(), stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		w.t.Fatalf("node client.mjs %s: %v in %q (stderr: %s)", scenario, err, stdout.String(), stderr.String())
	}
}

// isCI reports whether the tests run in CI, where a missing node or SDK
// is a broken set-up, not a reason to skip.
func isCI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v != "" && v != "false" && v != "0"
}

// TestTypeScriptSDK drives the TypeScript SDK's client through ssegate:
// a call cut and re-issued by a new session (a new id, the key in the
// header or in _meta), 16 re-issues at once, the derived key and keyless
// calls without it, and a server that dies mid-call. Every case counts
// the tool's runs.
func TestTypeScriptSDK(t *testing.T) {
	for _, mode := range nodeModes {
		t.Run(mode.name, func(t *testing.T) {
			w := newWorld(t, mode, "-mcp-dedupe", "write", "-mcp-dedupe-window", "1m")
			// wantProgress is what a write's caller gets: each of its
			// notifications, under its own token, on an SSE answer.
			wantProgress := steps
			if mode.json {
				wantProgress = 0
			}
			check := func(what string, got tsResult, want string) {
				t.Helper()
				if got.Error != "" || got.Text != want || got.Progress != wantProgress {
					t.Fatalf("%s: got %+v; want %q with %d progress notifications", what, got, want, wantProgress)
				}
			}

			for _, carrier := range []string{"header", "meta"} {
				target := unique("ts-cut")
				var out struct {
					Tools          []string
					Reissue, After tsResult
				}
				w.node(w.gate.URL, "reissue", map[string]any{"target": target, "key": unique("key"), "carrier": carrier}, &out)
				if len(out.Tools) != 4 {
					t.Fatalf("tools/list: got %v; want the mock's 4 tools", out.Tools)
				}
				check(carrier+" key: re-issue after a cut", out.Reissue, wrote(target))
				check(carrier+" key: re-issue after the end", out.After, wrote(target))
				w.settle(target, 1)
			}

			target := unique("ts-many")
			var many struct{ Calls []tsResult }
			w.node(w.gate.URL, "concurrent", map[string]any{"target": target, "key": unique("key")}, &many)
			if len(many.Calls) != 16 {
				t.Fatalf("concurrent: got %d answers; want 16", len(many.Calls))
			}
			for i, c := range many.Calls {
				check(fmt.Sprintf("concurrent call %d", i), c, wrote(target))
			}
			w.settle(target, 1)

			target = unique("ts-derived")
			var derived struct{ Calls []tsResult }
			w.node(w.gate.URL, "keyless", map[string]any{"target": target}, &derived)
			for i, c := range derived.Calls {
				check(fmt.Sprintf("keyless call %d with -mcp-dedupe", i), c, wrote(target))
			}
			w.settle(target, 1)

			plain := w.startGate()
			target = unique("ts-keyless")
			var keyless struct{ Calls []tsResult }
			w.node(plain.URL, "keyless", map[string]any{"target": target, "ms": 50}, &keyless)
			if got := w.mock.Runs(target); got != 2 {
				t.Fatalf("runs of two keyless calls without the opt-in: got %d; want 2 (%+v)", got, keyless.Calls)
			}

			target = unique("ts-dies")
			var dies struct{ Calls []tsResult }
			w.node(w.gate.URL, "dies", map[string]any{"target": target, "key": unique("key")}, &dies)
			for i, c := range dies.Calls {
				if !strings.Contains(strings.ToLower(c.Error), "unknown") {
					t.Fatalf("call %d of a server that died: got %+v; want a JSON-RPC error saying the outcome is unknown", i, c)
				}
			}
			w.settle(target, 1)
		})
	}
}
