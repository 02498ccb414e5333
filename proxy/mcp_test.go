package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mcpmock"
)

// mcpEnv is ssegate on -mcp-path /mcp in front of the MCP mock server
// (the official Go SDK), stateless so that a bare tools/call is served;
// ended tells when each of the server's requests ended or was cancelled
// (its connection closed), whichever came first.
type mcpEnv struct {
	*env
	srv   *mcpmock.Server
	ended chan time.Time
}

func newMCPEnv(t *testing.T, mc mcpmock.Config, tune func(*Config)) *mcpEnv {
	t.Helper()
	return newMCPEnvOn(t, mcpmock.New(mc), tune)
}

// newMCPEnvOn is newMCPEnv in front of srv, which may be another's.
func newMCPEnvOn(t *testing.T, srv *mcpmock.Server, tune func(*Config)) *mcpEnv {
	t.Helper()
	me := &mcpEnv{srv: srv, ended: make(chan time.Time, 64)}
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		go func() {
			<-r.Context().Done()
			select {
			case me.ended <- time.Now():
			default:
			}
		}()
		srv.Handler().ServeHTTP(w, r)
	}))
	hs.Config.ConnContext = srv.ConnContext // a write with die cuts its connection
	hs.Start()
	// http.Server's Close, not httptest's, which would wait for a tool
	// the test left running (the SDK's handler waits for it).
	t.Cleanup(func() { hs.Config.Close() })
	pc := Config{MCPPaths: []string{mcpmock.Path}}
	if tune != nil {
		tune(&pc)
	}
	me.env = newEnvUpstream(t, hs.URL, nil, pc, cache.Config{})
	return me
}

// rpc is one JSON-RPC answer read from the proxy.
type rpc struct {
	status   int
	header   http.Header
	messages []map[string]any // every message, in order
}

// response is the JSON-RPC response among the messages.
func (r rpc) response(t *testing.T) map[string]any {
	t.Helper()
	for _, m := range r.messages {
		if _, ok := m["method"]; !ok {
			return m
		}
	}
	t.Fatalf("no JSON-RPC response in %d %v", r.status, r.messages)
	return nil
}

// callBody is a tools/call of tool with args, id, and _meta members.
func callBody(id any, tool string, args map[string]any, meta map[string]any) string {
	params := map[string]any{"name": tool, "arguments": args}
	if meta != nil {
		params["_meta"] = meta
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
	return string(b)
}

// post sends body to /mcp with the headers hdr (key, value pairs).
func (e *mcpEnv) post(body string, hdr ...string) *http.Response {
	e.t.Helper()
	rq, _ := http.NewRequest(http.MethodPost, e.url+mcpmock.Path, strings.NewReader(body))
	rq.Header.Set("Content-Type", "application/json")
	rq.Header.Set("Accept", "application/json, text/event-stream")
	rq.Header.Set("MCP-Protocol-Version", "2025-06-18")
	for i := 0; i+1 < len(hdr); i += 2 {
		rq.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.client.Do(rq)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// call posts body and reads the whole answer.
func (e *mcpEnv) call(body string, hdr ...string) rpc {
	e.t.Helper()
	resp := e.post(body, hdr...)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("reading the answer: %v", err)
	}
	return readRPC(e.t, resp, raw)
}

func readRPC(t *testing.T, resp *http.Response, raw []byte) rpc {
	t.Helper()
	r := rpc{status: resp.StatusCode, header: resp.Header}
	var datas []string
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		evs, _ := parseEvents(raw)
		for _, ev := range evs {
			datas = append(datas, ev.Data)
		}
	} else if len(strings.TrimSpace(string(raw))) > 0 {
		datas = []string{string(raw)}
	}
	for _, d := range datas {
		var m map[string]any
		if err := json.Unmarshal([]byte(d), &m); err != nil {
			t.Fatalf("not a JSON-RPC message: %q", d)
		}
		r.messages = append(r.messages, m)
	}
	return r
}

// wantResult checks that r is the result of a write under id.
func wantResult(t *testing.T, r rpc, id any) map[string]any {
	t.Helper()
	m := r.response(t)
	if r.status != 200 || fmt.Sprint(m["id"]) != fmt.Sprint(id) || m["result"] == nil {
		t.Fatalf("got %d %v; want a result under id %v", r.status, m, id)
	}
	return m["result"].(map[string]any)
}

// wantUnknown checks that r is the outcome-unknown error under id.
func wantUnknown(t *testing.T, r rpc, id any) {
	t.Helper()
	m := r.response(t)
	e, _ := m["error"].(map[string]any)
	if r.status != 200 || fmt.Sprint(m["id"]) != fmt.Sprint(id) || e == nil || e["code"] != float64(UnknownCode) {
		t.Fatalf("got %d %v; want the outcome-unknown error under id %v", r.status, m, id)
	}
	if r.header.Get("Ssegate-Outcome") != "unknown" && !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("the outcome-unknown answer has no Ssegate-Outcome: unknown: %v", r.header)
	}
}

func (e *mcpEnv) wantRuns(target string, want int64) {
	e.t.Helper()
	wantCount(e.t, "runs of "+target, e.srv.Runs(target), want)
}

// TestToolReissueAfterCut: a caller whose stream broke mid-call re-issues
// it with a new id, a new progress token and the same key: it joins the
// call, which went on without its first caller, and gets the result and
// the progress under its own id and token; the tool ran once.
func TestToolReissueAfterCut(t *testing.T) {
	t.Parallel()
	e := newMCPEnv(t, mcpmock.Config{Stateless: true, Delay: 800 * time.Millisecond}, nil)
	key := newKey("cut")
	resp := e.post(callBody(1, "write", map[string]any{"target": key}, map[string]any{"progressToken": "tok-1"}), "Idempotency-Key", key)
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("first line %q, %v, %s", line, err, resp.Header.Get("Content-Type"))
	}
	resp.Body.Close() // the cut
	e.client.CloseIdleConnections()
	r := e.call(callBody("two", "write", map[string]any{"target": key}, map[string]any{"progressToken": "tok-2"}), "Idempotency-Key", key)
	wantResult(t, r, "two")
	if r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the re-issue's answer is not marked replayed: %v", r.header)
	}
	progress := 0
	for _, m := range r.messages {
		if m["method"] == "notifications/progress" {
			progress++
			if tok := m["params"].(map[string]any)["progressToken"]; tok != "tok-2" {
				t.Fatalf("progress under token %v; want the caller's tok-2", tok)
			}
		}
	}
	if progress == 0 {
		t.Fatal("the re-issue got no progress of the call it joined")
	}
	e.wantRuns(key, 1)
	e.waitState(key, "", cache.StateCommitted)
	resp, err := e.client.Get(e.url + "/keys/" + key)
	if err != nil {
		t.Fatal(err)
	}
	var ki keyInfo
	json.NewDecoder(resp.Body).Decode(&ki) //nolint:errcheck // checked below
	resp.Body.Close()
	if ki.Tool != "write" || ki.Kind != "tool_call" || ki.State != cache.StateCommitted {
		t.Fatalf("GET /keys: %+v; want the tool write, a tool_call, committed", ki)
	}
}

func (e *mcpEnv) scrape() string {
	e.t.Helper()
	resp, err := e.client.Get(e.url + "/metrics")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestToolConflict: the same key with other arguments is 422
// idempotency_conflict; the id, the progress token, trace context and
// the _meta key are no part of the request.
func TestToolConflict(t *testing.T) {
	t.Parallel()
	e := newMCPEnv(t, mcpmock.Config{Stateless: true, JSON: true, Delay: 10 * time.Millisecond}, nil)
	key := newKey("conflict")
	wantResult(t, e.call(callBody(1, "write", map[string]any{"target": key}, map[string]any{"progressToken": 7}), "Idempotency-Key", key), 1)
	same := callBody(2, "write", map[string]any{"target": key}, map[string]any{"progressToken": 8, "traceparent": "00-abc-def-01", MetaKey: "ignored"})
	r := e.call(same, "Idempotency-Key", key, "Mcp-Session-Id", "another")
	wantResult(t, r, 2)
	if got := r.header.Get("Mcp-Session-Id"); got != "another" {
		t.Fatalf("the replay's Mcp-Session-Id: %q; want the caller's own", got)
	}
	r = e.call(callBody(3, "write", map[string]any{"target": key + "-other"}, nil), "Idempotency-Key", key)
	if r.status != http.StatusUnprocessableEntity {
		t.Fatalf("other arguments: got %d; want 422", r.status)
	}
	e.wantRuns(key, 1)
	e.wantRuns(key+"-other", 0)
}

// TestToolMetaKey: a client that cannot set headers per call (the Go SDK)
// puts the key in params._meta; its second call, with a new id, replays
// the first.
func TestToolMetaKey(t *testing.T) {
	t.Parallel()
	e := newMCPEnv(t, mcpmock.Config{Delay: 50 * time.Millisecond}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.url + mcpmock.Path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	key := newKey("meta")
	for i := range 2 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "write", Arguments: map[string]any{"target": key},
			Meta: mcp.Meta{MetaKey: key}})
		if err != nil || res.IsError {
			t.Fatalf("call %d: %v %v", i, res, err)
		}
	}
	e.wantRuns(key, 1)
	// Without a key, each call runs.
	for range 2 {
		if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "write", Arguments: map[string]any{"target": key + "-free"}}); err != nil {
			t.Fatal(err)
		}
	}
	e.wantRuns(key+"-free", 2)
	// tools/list and the session's other messages passed untouched.
	if tools, err := cs.ListTools(ctx, nil); err != nil || len(tools.Tools) == 0 {
		t.Fatalf("tools/list through the proxy: %v %v", tools, err)
	}
	if cs.ID() == "" {
		t.Fatal("no Mcp-Session-Id came through")
	}
}

// TestToolDerivedKey: with -mcp-dedupe write, an unkeyed write repeated
// with the same arguments runs once; another tool, or no -mcp-dedupe,
// runs each time.
func TestToolDerivedKey(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		dedupe []string
		want   int64
	}{{[]string{"write"}, 1}, {[]string{"*"}, 1}, {[]string{"refuse"}, 2}, {nil, 2}} {
		t.Run(fmt.Sprint(c.dedupe), func(t *testing.T) {
			t.Parallel()
			e := newMCPEnv(t, mcpmock.Config{Stateless: true, JSON: true, Delay: 10 * time.Millisecond},
				func(pc *Config) { pc.MCPDedupe = c.dedupe })
			target := newKey("derived")
			for i := range 2 {
				wantResult(t, e.call(callBody(i, "write", map[string]any{"target": target}, nil)), i)
			}
			e.wantRuns(target, c.want)
		})
	}
}

// TestToolIsErrorCommits: a result with isError is the tool's answer (it
// ran): committed, and a re-issue replays it.
func TestToolIsErrorCommits(t *testing.T) {
	t.Parallel()
	e := newMCPEnv(t, mcpmock.Config{Stateless: true}, nil)
	key := newKey("iserror")
	for i := range 2 {
		res := wantResult(t, e.call(callBody(i, "refuse", map[string]any{"target": key}, nil), "Idempotency-Key", key), i)
		if res["isError"] != true {
			t.Fatalf("got %v; want isError", res)
		}
	}
	e.wantRuns(key, 1)
	e.waitState(key, "", cache.StateCommitted)
}

// TestToolErrorNotStored: a JSON-RPC error is relayed under the caller's
// id and not stored (failed_terminal): a re-issue runs the tool again.
func TestToolErrorNotStored(t *testing.T) {
	t.Parallel()
	for _, json := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%v", json), func(t *testing.T) {
			t.Parallel()
			e := newMCPEnv(t, mcpmock.Config{Stateless: true, JSON: json}, nil)
			key := newKey("rpcerror")
			for i := range 2 {
				m := e.call(callBody(i, "reject", map[string]any{"target": key}, nil), "Idempotency-Key", key).response(t)
				if m["error"] == nil || fmt.Sprint(m["id"]) != fmt.Sprint(i) {
					t.Fatalf("call %d: got %v; want a JSON-RPC error under its id", i, m)
				}
				e.waitState(key, "", cache.StateFailedTerminal)
			}
			e.wantRuns(key, 2)
		})
	}
}

// TestToolServerDies: a keyed call whose server dies mid-call ends
// commit_unknown: its caller, and every re-issue until DELETE /keys/{key},
// gets the outcome-unknown error and the tool does not run again; a
// running key cannot be deleted.
func TestToolServerDies(t *testing.T) {
	t.Parallel()
	// The write dies after its first progress step, a quarter of Delay:
	// long enough for a DELETE while it runs.
	e := newMCPEnv(t, mcpmock.Config{Stateless: true, Delay: 2 * time.Second}, nil)
	key := newKey("dies")
	args := map[string]any{"target": key, "die": true}
	first := make(chan rpc, 1)
	go func() { first <- e.call(callBody(1, "write", args, nil), "Idempotency-Key", key) }()
	waitFor(t, func() bool { return e.srv.Runs(key) == 1 })
	if d := e.del(key); d != http.StatusConflict {
		t.Fatalf("DELETE of a running key: %d; want 409", d)
	}
	wantUnknown(t, <-first, 1)
	e.waitState(key, "", cache.StateCommitUnknown)
	wantUnknown(t, e.call(callBody(2, "write", args, nil), "Idempotency-Key", key), 2)
	e.wantRuns(key, 1)
	if got := metricValue(t, e.scrape(), `ssegate_tool_calls_unknown`); got != 1 {
		t.Fatalf("tool calls unknown: %v; want 1", got)
	}
	if d := e.del(key, "Authorization", "Bearer another-tenant"); d != http.StatusNotFound {
		t.Fatalf("DELETE by another tenant: %d; want 404", d)
	}
	if d := e.del(key); d != http.StatusNoContent {
		t.Fatalf("DELETE: %d; want 204", d)
	}
	r := e.call(callBody(3, "write", map[string]any{"target": key}, nil), "Idempotency-Key", key)
	wantResult(t, r, 3)
	e.wantRuns(key, 2)
}

// del deletes key by DELETE /keys/{key}, and returns the status.
func (e *mcpEnv) del(key string, hdr ...string) int {
	e.t.Helper()
	rq, _ := http.NewRequest(http.MethodDelete, e.url+"/keys/"+key, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		rq.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.client.Do(rq)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestToolUnkeyedCancelled: an unkeyed call is relayed as it is, and
// cancelled when its caller leaves: the server's handler ends long before
// the tool would have.
func TestToolUnkeyedCancelled(t *testing.T) {
	t.Parallel()
	e := newMCPEnv(t, mcpmock.Config{Stateless: true, Delay: 10 * time.Second}, nil)
	target := newKey("unkeyed")
	resp := e.post(callBody(1, "write", map[string]any{"target": target}, map[string]any{"progressToken": 1}))
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return e.srv.Runs(target) == 1 })
	cut := time.Now()
	resp.Body.Close()
	e.client.CloseIdleConnections()
	select {
	case at := <-e.ended:
		// A progress step is 2.5 s: only a cancel at the caller's
		// departure, not one at the next write that fails, is this soon.
		if at.Sub(cut) > 2*time.Second {
			t.Fatalf("the server's call ended %v after its caller left", at.Sub(cut))
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the server's call went on after its caller left")
	}
	if st := e.store.Stats(); st.Keys != 0 {
		t.Fatalf("an unkeyed call was recorded: %d keys", st.Keys)
	}
}

// TestToolStreamOutlivesAttemptTimeout: a tool call answered with an event
// stream is bounded by the server's silences, not by -attempt-timeout,
// which bounds a JSON answer whole (and the wait for any head): a call
// that streams longer than it gets its result, keyed or not, and runs
// once.
func TestToolStreamOutlivesAttemptTimeout(t *testing.T) {
	t.Parallel()
	// The bound leaves a loaded machine a second for the head; the tool
	// streams three times as long.
	e := newMCPEnv(t, mcpmock.Config{Stateless: true, Delay: 3 * time.Second}, func(c *Config) {
		c.Retry.AttemptTimeout = time.Second
	})
	for i, hdr := range [][]string{nil, {"Idempotency-Key", newKey("long")}} {
		target := fmt.Sprintf("long-%d-%s", i, newKey("t"))
		// Progress asked for: the server's head and first notification
		// come at once, its result three seconds later.
		wantResult(t, e.call(callBody(i, "write", map[string]any{"target": target}, map[string]any{"progressToken": "p"}), hdr...), i)
		e.wantRuns(target, 1)
	}
}

// TestToolChainedUnknown: behind another ssegate, whose call's outcome is
// unknown, the answer it gives (a 200 JSON-RPC error marked
// Ssegate-Outcome: unknown) leaves this one's key commit_unknown too,
// held: a re-issue is answered so and not sent again.
func TestToolChainedUnknown(t *testing.T) {
	t.Parallel()
	wantHeldUnknown(t, "chained", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Ssegate-Outcome", "unknown")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":1,"error":{"code":%d,"message":"the outcome is unknown"}}`, UnknownCode)
	})
}

// wantHeldUnknown calls a keyed tool twice through ssegate in front of a
// server that answers with answer: the first call's outcome must be
// unknown and held, so that the re-issue is answered so without a second
// call to the server.
func wantHeldUnknown(t *testing.T, name string, answer http.HandlerFunc) {
	t.Helper()
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		answer(w, r)
	}))
	t.Cleanup(up.Close)
	e := &mcpEnv{env: newEnvUpstream(t, up.URL, nil, Config{MCPPaths: []string{mcpmock.Path}}, cache.Config{})}
	key := newKey(name)
	for i := range 2 {
		wantUnknown(t, e.call(callBody(i+1, "write", map[string]any{"target": key}, nil), "Idempotency-Key", key), i+1)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("calls to the server: got %d; want 1", n)
	}
	e.waitState(key, "", cache.StateCommitUnknown)
}

// TestToolTenants: a tool call's key, given or derived, is its tenant's,
// whichever header carries the credential (x-api-key as Authorization):
// the same key and arguments from another tenant run the tool again, and
// a re-issue under the same credential does not.
func TestToolTenants(t *testing.T) {
	t.Parallel()
	e := newMCPEnv(t, mcpmock.Config{Stateless: true, JSON: true, Delay: 10 * time.Millisecond},
		func(pc *Config) { pc.MCPDedupe = []string{"write"} })
	for _, keyed := range []bool{true, false} {
		target := newKey("tenants")
		calls := [][]string{
			{"Authorization", "Bearer tenant-a"},
			{"x-api-key", "tenant-b"},
			{"x-api-key", "tenant-b"}, // a re-issue: no run
			{"x-api-key", "tenant-c"}, // were x-api-key no credential, b's
			{"Authorization", "Bearer tenant-a"},
		}
		for i, hdr := range calls {
			if keyed {
				hdr = append(hdr, "Idempotency-Key", target)
			}
			wantResult(t, e.call(callBody(i, "write", map[string]any{"target": target}, nil), hdr...), i)
		}
		e.wantRuns(target, 3)
	}
}

// TestToolCutBodyNotCommitted: a JSON answer that ends where the server
// closed its connection, cut inside its result, is no whole answer: the
// call is commit_unknown, not a stored result replayed to re-issues.
func TestToolCutBodyNotCommitted(t *testing.T) {
	t.Parallel()
	wantHeldUnknown(t, "cutbody", func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" +
			`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ab`)
		buf.Flush()
	})
}
