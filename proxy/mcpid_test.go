package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mcpmock"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// respeller is an http.ResponseWriter that writes the server's id member
// from in the spelling to: a server that holds ids as floats, or escapes
// what it need not.
type respeller struct {
	http.ResponseWriter
	from, to []byte
	wrote    bool
}

func (w *respeller) WriteHeader(code int) {
	w.Header().Del("Content-Length") // the body's length changes
	w.wrote = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *respeller) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	_, err := w.ResponseWriter.Write(bytes.ReplaceAll(b, w.from, w.to))
	return len(b), err
}

func (w *respeller) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *respeller) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// newRespellingMCPEnv is ssegate on /mcp in front of the MCP mock server
// (the official SDK), whose answers go out with the id member from
// written as to.
func newRespellingMCPEnv(t *testing.T, mc mcpmock.Config, from, to string) *mcpEnv {
	t.Helper()
	srv := mcpmock.New(mc)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.Handler().ServeHTTP(&respeller{ResponseWriter: w, from: []byte(from), to: []byte(to)}, r)
	}))
	t.Cleanup(func() { hs.Config.Close() })
	me := &mcpEnv{srv: srv, ended: make(chan time.Time, 64)}
	me.env = newEnvUpstream(t, hs.URL, nil, Config{MCPPaths: []string{mcpmock.Path}}, cache.Config{})
	return me
}

// rpcResponseIDs returns the raw id of every JSON-RPC response (a message
// without a method) in an answer's body.
func rpcResponseIDs(resp *http.Response, raw []byte) []string {
	var datas []string
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		evs, _ := parseEvents(raw)
		for _, ev := range evs {
			datas = append(datas, ev.Data)
		}
	} else {
		datas = []string{string(raw)}
	}
	var ids []string
	for _, d := range datas {
		if !gjson.Get(d, "method").Exists() {
			ids = append(ids, gjson.Get(d, "id").Raw)
		}
	}
	return ids
}

// TestToolIDRespelled: an MCP server that writes a call's id back in
// another spelling (1 as 1.0 or 1e0, "A" as "\u0041") answered the call:
// the caller gets one answer, the result, under its id as it wrote it;
// the key commits (not commit_unknown); a re-issue replays under its own
// id; the tool ran once.
func TestToolIDRespelled(t *testing.T) {
	t.Parallel()
	cases := []struct{ id, respelled string }{
		{`1`, `1.0`},
		{`2`, `2e0`},
		{`30`, `3E+1`},
		{`"A"`, `"\u0041"`},
	}
	for _, mode := range []struct {
		name string
		json bool
	}{{"stream", false}, {"json", true}} {
		for _, c := range cases {
			t.Run(mode.name+"/"+c.id, func(t *testing.T) {
				t.Parallel()
				e := newRespellingMCPEnv(t, mcpmock.Config{Stateless: true, JSON: mode.json, Delay: 50 * time.Millisecond},
					`"id":`+c.id+`,`, `"id":`+c.respelled+`,`)
				key := newKey("respelled")
				body := func(id string) string {
					return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"write","arguments":{"target":"` + key + `"}}}`
				}
				for i, id := range []string{c.id, `"again"`} {
					resp := e.post(body(id), "Idempotency-Key", key)
					raw, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil {
						t.Fatal(err)
					}
					ids := rpcResponseIDs(resp, raw)
					if resp.StatusCode != 200 || len(ids) != 1 || ids[0] != id {
						t.Fatalf("call %d: got %d, responses under ids %v (%s); want one, under %s", i, resp.StatusCode, ids, raw, id)
					}
					r := readRPC(t, resp, raw)
					if m := r.response(t); m["result"] == nil || m["error"] != nil {
						t.Fatalf("call %d: got %v; want the result", i, m)
					}
					if i == 0 {
						e.waitState(key, "", cache.StateCommitted)
					} else if resp.Header.Get("Idempotent-Replayed") != "true" {
						t.Fatalf("the re-issue is not a replay: %v", resp.Header)
					}
				}
				e.wantRuns(key, 1)
			})
		}
	}
}

// TestToolMemberNamesExact: JSON-RPC's member names are matched as the
// specification writes them, as servers match them: "ID" is not "id",
// "Method" not "method", "Name" not "name". A keyed call with such a
// member beside its own is the call its own members say: its answer is
// recognised, and a repeat replays (the tool ran once).
func TestToolMemberNamesExact(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, extra string }{
		{"ID", `"ID":99`},
		{"Method", `"Method":"ping"`},
		{"Name", `"Name":"runs"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newMCPEnv(t, mcpmock.Config{Stateless: true, Delay: 50 * time.Millisecond}, nil)
			key := newKey("members")
			// The foreign member after the real one: encoding/json's
			// case-insensitive match takes the last.
			params := `{"name":"write","arguments":{"target":"` + key + `"}}`
			if c.name == "Name" {
				params = `{"name":"write","arguments":{"target":"` + key + `"},` + c.extra + `}`
			}
			body := `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":` + params
			if c.name != "Name" {
				body += `,` + c.extra
			}
			body += `}`
			for i := range 2 {
				resp := e.post(body, "Idempotency-Key", key)
				raw, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if ids := rpcResponseIDs(resp, raw); resp.StatusCode != 200 || len(ids) != 1 || ids[0] != "5" {
					t.Fatalf("call %d: got %d, responses under ids %v (%s); want one, under 5", i, resp.StatusCode, ids, raw)
				}
				if m := readRPC(t, resp, raw).response(t); m["result"] == nil {
					t.Fatalf("call %d: got %v; want the result", i, m)
				}
				if i == 0 {
					e.waitState(key, "", cache.StateCommitted)
				}
			}
			e.wantRuns(key, 1)
		})
	}
}

// TestParseToolCallMembers: the tools/call parser reads members by
// their exact names, and takes nothing else for them.
func TestParseToolCallMembers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		body     string
		ok       bool
		id, name string
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w"}}`, true, `1`, "w"},
		{`{"jsonrpc":"2.0","ID":1,"method":"tools/call","params":{"name":"w"}}`, false, "", ""},
		{`{"jsonrpc":"2.0","Id":1,"method":"tools/call","params":{"name":"w"}}`, false, "", ""},
		{`{"jsonrpc":"2.0","id":1,"Method":"tools/call","params":{"name":"w"}}`, false, "", ""},
		{`{"jsonrpc":"2.0","id":1,"METHOD":"tools/call","params":{"name":"w"}}`, false, "", ""},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","ID":2,"params":{"name":"w"}}`, true, `1`, "w"},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","Method":"ping","params":{"name":"w"}}`, true, `1`, "w"},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w","Name":"x"}}`, true, `1`, "w"},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","Params":{"name":"w"}}`, true, `1`, ""},
		{`{"jsonrpc":"2.0","id":"a\u0062","method":"tools\/call","params":{"name":"w"}}`, true, `"a\u0062"`, "w"},
		{`{"jsonrpc":"2.0","id":1.50,"method":"tools/call","params":{"name":"w"}}`, true, `1.50`, "w"},
		{`{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"w"}}`, false, "", ""},
		{`{"jsonrpc":"2.0","id":{"a":1},"method":"tools/call","params":{"name":"w"}}`, false, "", ""},
		{`{"jsonrpc":"2.0","id":true,"method":"tools/call","params":{"name":"w"}}`, false, "", ""},
	} {
		ctx := mcpRequest(c.body)
		call, ok := parseToolCall(ctx)
		switch {
		case ok != c.ok:
			t.Errorf("%s: got a call %v; want %v", c.body, ok, c.ok)
		case ok && (string(call.id) != c.id || call.name != c.name):
			t.Errorf("%s: got id %s, name %q; want id %s, name %q", c.body, call.id, call.name, c.id, c.name)
		}
	}
	// The fingerprint is of the members as written: "ID" is no id, and a
	// call with it is another request.
	a, _ := parseToolCall(mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"w"}}`))
	b, _ := parseToolCall(mcpRequest(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"w"}}`))
	d, _ := parseToolCall(mcpRequest(`{"jsonrpc":"2.0","id":1,"method":"tools/call","ID":3,"params":{"name":"w"}}`))
	if a.fp != b.fp || a.fp == d.fp {
		t.Errorf("fingerprints: id 1 %x, id 2 %x, with ID 3 %x; want the first two the same, the third another", a.fp[:4], b.fp[:4], d.fp[:4])
	}
}

func mcpRequest(body string) *fasthttp.RequestCtx {
	ctx := new(fasthttp.RequestCtx)
	ctx.Request.Header.SetMethod(http.MethodPost)
	ctx.Request.SetRequestURI(mcpmock.Path)
	ctx.Request.SetBodyString(body)
	return ctx
}
