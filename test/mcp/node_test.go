package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
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

// step is one scenario of client.mjs: what it is given and where its
// outcome goes.
type step struct {
	url, scenario string
	opts          map[string]any
	out           any
}

// node runs client.mjs with steps, in one process, and decodes each
// step's outcome into its out.
func (w *world) node(steps ...step) {
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
	var plan []map[string]any
	for _, s := range steps {
		opts := map[string]any{"scenario": s.scenario, "url": s.url, "runs": w.up + mcpmock.RunsPath, "auth": w.auth}
		maps.Copy(opts, s.opts)
		plan = append(plan, opts)
	}
	arg, _ := json.Marshal(plan)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "client.mjs", string(arg))
	cmd.Dir = "node"
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		w.t.Fatalf("node client.mjs: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	var outs []json.RawMessage
	if err := json.Unmarshal(stdout.Bytes(), &outs); err != nil || len(outs) != len(steps) {
		w.t.Fatalf("node client.mjs: %v, %d outcomes in %q; want %d (stderr: %s)", err, len(outs), stdout.String(), len(steps), stderr.String())
	}
	for i, s := range steps {
		if err := json.Unmarshal(outs[i], s.out); err != nil {
			w.t.Fatalf("node client.mjs %s: %v in %s", s.scenario, err, outs[i])
		}
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
	forModes(t, nodeModes, func(t *testing.T, mode mode) {
		w := newWorld(t, mode, "-mcp-dedupe", "write", "-mcp-dedupe-window", "1m")
		plain := w.startGate() // the same server, no opt-in
		type reissued struct {
			Tools          []string
			Reissue, After tsResult
		}
		type calls struct{ Calls []tsResult }
		var (
			cut                             [2]reissued
			many, derived, keyless, dies    calls
			header, meta                    = unique("ts-header"), unique("ts-meta")
			manyT, derivedT, keylessT, dieT = unique("ts-many"), unique("ts-derived"), unique("ts-keyless"), unique("ts-dies")
		)
		w.node(
			step{w.gate.URL, "reissue", map[string]any{"target": header, "key": unique("key"), "carrier": "header"}, &cut[0]},
			step{w.gate.URL, "reissue", map[string]any{"target": meta, "key": unique("key"), "carrier": "meta"}, &cut[1]},
			step{w.gate.URL, "concurrent", map[string]any{"target": manyT, "key": unique("key")}, &many},
			step{w.gate.URL, "keyless", map[string]any{"target": derivedT}, &derived},
			step{plain.URL, "keyless", map[string]any{"target": keylessT, "ms": 50}, &keyless},
			step{w.gate.URL, "dies", map[string]any{"target": dieT, "key": unique("key")}, &dies},
		)
		// wantProgress is what a write's caller gets: each of its
		// notifications, under its own token, on an SSE answer.
		wantProgress := steps
		if mode.json {
			wantProgress = 0
		}
		check := func(what string, got tsResult, want string) {
			t.Helper()
			if got.Error != "" || got.Text != want || got.Progress != wantProgress {
				t.Errorf("%s: got %+v; want %q with %d progress notifications", what, got, want, wantProgress)
			}
		}
		for i, target := range []string{header, meta} {
			if len(cut[i].Tools) != 4 {
				t.Errorf("tools/list: got %v; want the mock's 4 tools", cut[i].Tools)
			}
			check(target+": re-issue after a cut", cut[i].Reissue, wrote(target))
			check(target+": re-issue after the end", cut[i].After, wrote(target))
		}
		if len(many.Calls) != 16 {
			t.Errorf("concurrent: got %d answers; want 16", len(many.Calls))
		}
		for i, c := range many.Calls {
			check(fmt.Sprintf("concurrent call %d", i), c, wrote(manyT))
		}
		for i, c := range derived.Calls {
			check(fmt.Sprintf("keyless call %d with -mcp-dedupe", i), c, wrote(derivedT))
		}
		for i, c := range dies.Calls {
			if !strings.Contains(strings.ToLower(c.Error), "unknown") {
				t.Errorf("call %d of a server that died: got %+v; want a JSON-RPC error saying the outcome is unknown", i, c)
			}
		}
		w.settleAll(map[string]int64{header: 1, meta: 1, manyT: 1, derivedT: 1, keylessT: 2, dieT: 1})
	})
}
