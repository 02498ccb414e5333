package mcp_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/mcpmock"
	"github.com/ssegate/ssegate/internal/poll"
)

// wrote is the write tool's answer to its first run for target.
func wrote(target string) string { return fmt.Sprintf("wrote %s (run 1)", target) }

// checkProgress checks that c got all of a write's progress notifications
// under token and none under another (SSE mode only: a JSON answer has
// none).
func checkProgress(t *testing.T, jsonMode bool, c *caller, tokens ...string) {
	t.Helper()
	if jsonMode {
		return
	}
	// The SDK hands notifications to the handler apart from the result.
	poll.For(t, 2*time.Second, fmt.Sprintf("%d progress notifications for each of %v", steps, tokens), func() bool {
		for _, tok := range tokens {
			if c.progressOf(tok) != steps {
				return false
			}
		}
		return true
	})
	got := c.tokens()
	slices.Sort(got)
	want := slices.Sorted(slices.Values(tokens))
	if !slices.Equal(got, want) {
		t.Fatalf("progress tokens: got %v; want %v (each caller's own)", got, want)
	}
}

// TestReissueAfterCut: the caller's connection is cut while the tool runs
// and the call is re-issued by a new session, with a new JSON-RPC id and
// the same key (the Idempotency-Key header, or params._meta): the re-issue
// joins the run and gets its result under its own id and progress token;
// a re-issue after the end replays it. The tool ran once.
func TestReissueAfterCut(t *testing.T) {
	forModes(t, modes, func(t *testing.T, mode mode) {
		for _, carrier := range []string{"header", "meta"} {
			t.Run(carrier, func(t *testing.T) {
				t.Parallel()
				w := newWorld(t, mode)
				target, key := unique("cut"), unique("key")
				header, meta := key, ""
				if carrier == "meta" {
					header, meta = "", key
				}
				a := w.dial(w.gate.URL, header)
				go a.callTool(call("write", target, meta, "a", nil)) // ends when a's session closes
				w.waitRuns(target, 1)
				a.cut()

				b := w.dial(w.gate.URL, header)
				// tools/list first, so that b's call has another id than a's.
				if _, err := b.cs.ListTools(context.Background(), nil); err != nil {
					t.Fatalf("tools/list: %v", err)
				}
				r, err := b.callTool(call("write", target, meta, "b", nil))
				if err != nil {
					t.Fatalf("re-issue: %v", err)
				}
				if got := mcpmock.Text(r); got != wrote(target) {
					t.Fatalf("re-issue: got %q; want %q", got, wrote(target))
				}
				checkProgress(t, mode.json, b, "b")

				c := w.dial(w.gate.URL, header)
				r, err = c.callTool(call("write", target, meta, "c", nil))
				if err != nil || mcpmock.Text(r) != wrote(target) {
					t.Fatalf("re-issue after the end: got %v, %v; want %q", r, err, wrote(target))
				}
				checkProgress(t, mode.json, c, "c")
				w.settle(target, 1)
			})
		}
	})
}

// TestConcurrentReissues: 16 re-issues of one call at once, each with its
// own JSON-RPC id and progress token on one session: one run, and every
// caller gets the result and the progress under its own id and token.
func TestConcurrentReissues(t *testing.T) {
	forModes(t, modes, func(t *testing.T, mode mode) {
		w := newWorld(t, mode)
		target, key := unique("many"), unique("key")
		c := w.dial(w.gate.URL, "")
		const n = 16
		var wg sync.WaitGroup
		errs := make([]error, n)
		texts := make([]string, n)
		var tokens []string
		for i := range n {
			tok := fmt.Sprintf("t%d", i)
			tokens = append(tokens, tok)
			wg.Go(func() {
				r, err := c.callTool(call("write", target, key, tok, nil))
				if errs[i] = err; err == nil {
					texts[i] = mcpmock.Text(r)
				}
			})
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil || texts[i] != wrote(target) {
				t.Fatalf("call %d: got %q, %v; want %q", i, texts[i], errs[i], wrote(target))
			}
		}
		checkProgress(t, mode.json, c, tokens...)
		w.settle(target, 1)
	})
}

// TestDerivedKey: with -mcp-dedupe write, two keyless calls of write with
// the same arguments are one intent (one run, both answered), while other
// arguments are another; without the opt-in two keyless calls run twice.
func TestDerivedKey(t *testing.T) {
	forModes(t, modes, func(t *testing.T, mode mode) {
		w := newWorld(t, mode, "-mcp-dedupe", "write", "-mcp-dedupe-window", "1m")
		target, other := unique("derived"), unique("other")
		a, b := w.dial(w.gate.URL, ""), w.dial(w.gate.URL, "")
		var wg sync.WaitGroup
		for _, c := range []*caller{a, b} {
			wg.Go(func() {
				r, err := c.callTool(call("write", target, "", "", nil))
				if err != nil || mcpmock.Text(r) != wrote(target) {
					t.Errorf("keyless write: got %v, %v; want %q", r, err, wrote(target))
				}
			})
		}
		wg.Wait()
		if r, err := a.callTool(call("write", other, "", "", nil)); err != nil || mcpmock.Text(r) != wrote(other) {
			t.Fatalf("keyless write of other arguments: got %v, %v; want %q", r, err, wrote(other))
		}
		w.settle(target, 1)
		w.settle(other, 1)

		plain := w.startGate() // the same server, no opt-in
		target = unique("keyless")
		c := w.dial(plain.URL, "")
		for range 2 {
			if _, err := c.callTool(call("write", target, "", "", map[string]any{"ms": 50})); err != nil {
				t.Fatalf("keyless write without the opt-in: %v", err)
			}
		}
		w.wantRuns(target, 2)
	})
}

// TestServerDiesMidCall: a keyed call whose server dies after the tool
// began is commit_unknown: its caller gets a JSON-RPC error saying the
// outcome is unknown, a re-issue gets the same and does not run the tool
// again, GET /keys/{key} shows the tool and the state, and only
// DELETE /keys/{key} frees the key for a new run.
func TestServerDiesMidCall(t *testing.T) {
	forModes(t, modes, func(t *testing.T, mode mode) {
		w := newWorld(t, mode)
		target, key := unique("dies"), unique("key")
		die := map[string]any{"die": true}
		for i := range 2 {
			c := w.dial(w.gate.URL, "")
			_, err := c.callTool(call("write", target, key, "p", die))
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown") {
				t.Fatalf("call %d: got %v; want a JSON-RPC error saying the outcome is unknown", i, err)
			}
		}
		w.settle(target, 1)
		status, body := w.keyState(w.gate, key)
		if status != http.StatusOK || !strings.Contains(body, "commit_unknown") || !strings.Contains(body, `"tool"`) || !strings.Contains(body, "write") {
			t.Fatalf("GET /keys/%s: got %d %s; want 200 with state commit_unknown and tool write", key, status, body)
		}
		if status, body := w.keyRequest(w.gate, http.MethodDelete, key); status/100 != 2 {
			t.Fatalf("DELETE /keys/%s: got %d %s; want 2xx", key, status, body)
		}
		c := w.dial(w.gate.URL, "")
		c.callTool(call("write", target, key, "p", die))
		w.wantRuns(target, 2)
	})
}

// TestToolOutcomes: a result with isError is the tool's answer, kept and
// replayed (one run); a JSON-RPC error is relayed and not kept, so a
// re-issue runs the tool again.
func TestToolOutcomes(t *testing.T) {
	forModes(t, modes, func(t *testing.T, mode mode) {
		w := newWorld(t, mode)
		refused, rejected := unique("refused"), unique("rejected")
		rkey, jkey := unique("key"), unique("key")
		for i := range 2 {
			c := w.dial(w.gate.URL, "")
			r, err := c.callTool(call("refuse", refused, rkey, "", nil))
			if want := fmt.Sprintf("refused %s (run 1)", refused); err != nil || !r.IsError || mcpmock.Text(r) != want {
				t.Fatalf("refuse, call %d: got %v, %v; want isError %q", i, r, err, want)
			}
			_, err = c.callTool(call("reject", rejected, jkey, "", nil))
			if want := fmt.Sprintf("rejected %s (run %d)", rejected, i+1); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("reject, call %d: got %v; want a JSON-RPC error %q", i, err, want)
			}
		}
		w.wantRuns(refused, 1)
		w.wantRuns(rejected, 2)
	})
}

// TestPassThrough: initialize, tools/list and an unkeyed call's progress
// notifications come through ssegate as the server sent them, sessions
// included.
func TestPassThrough(t *testing.T) {
	forModes(t, modes, func(t *testing.T, mode mode) {
		w := newWorld(t, mode)
		const (
			initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
			list       = `{"jsonrpc":"2.0","id":41,"method":"tools/list"}`
		)
		// exchange initializes a session on url and lists its tools.
		exchange := func(url string) (init, tools answer) {
			init = w.rawPost(url, initialize, nil)
			hdr := map[string]string{"Mcp-Protocol-Version": "2025-11-25"}
			if sid := init.header.Get("Mcp-Session-Id"); sid != "" {
				hdr["Mcp-Session-Id"] = sid
				w.rawPost(url, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr)
			}
			return init, w.rawPost(url, list, hdr)
		}
		dinit, dlist := exchange(w.up)
		pinit, plist := exchange(w.gate.URL)
		if got, want := pinit.header.Get("Mcp-Session-Id") != "", !mode.stateless; got != want {
			t.Fatalf("initialize through ssegate: Mcp-Session-Id given: %v; want %v", got, want)
		}
		for _, ex := range []struct {
			what          string
			direct, proxy answer
		}{{"initialize", dinit, pinit}, {"tools/list", dlist, plist}} {
			d, p := ex.direct, ex.proxy
			if d.status != http.StatusOK || p.status != d.status || p.header.Get("Content-Type") != d.header.Get("Content-Type") || string(p.body) != string(d.body) {
				t.Fatalf("%s through ssegate: got %d %s %q; want %d %s %q", ex.what,
					p.status, p.header.Get("Content-Type"), p.body, d.status, d.header.Get("Content-Type"), d.body)
			}
		}

		c := w.dial(w.gate.URL, "")
		target := unique("plain")
		if r, err := c.callTool(call("write", target, "", "tok", nil)); err != nil || mcpmock.Text(r) != wrote(target) {
			t.Fatalf("unkeyed write: got %v, %v; want %q", r, err, wrote(target))
		}
		checkProgress(t, mode.json, c, "tok")
	})
}
