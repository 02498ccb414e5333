package proxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// MetaKey is the params._meta member of a tools/call that carries its
// idempotency key, for clients that cannot set a header per call.
const MetaKey = "ssegate/idempotency-key"

// toolCall is what the proxy reads of an MCP tools/call request.
type toolCall struct {
	id      []byte // the JSON-RPC id, raw
	token   []byte // params._meta.progressToken, raw; nil when absent
	name    string
	metaKey string // params._meta[MetaKey]
	fp      string // the fingerprint: the request without what a re-issue changes
	args    []byte // the arguments, canonical JSON (sorted keys)
}

// mcpPath reports whether the request's path is one of -mcp-path.
func (p *Proxy) mcpPath(ctx *fasthttp.RequestCtx) bool {
	for _, mp := range p.cfg.MCPPaths {
		if string(ctx.Path()) == mp { // compared without a copy: every request asks
			return true
		}
	}
	return false
}

// serveMCP serves a request on an MCP path: a tools/call with a key is
// one intent (serveTool); everything else, a tools/call without a key
// included, is relayed as it is, its answer as the server sent it.
func (p *Proxy) serveMCP(ctx *fasthttp.RequestCtx) {
	call, ok := parseToolCall(ctx)
	if !ok || p.store == nil {
		p.relayMCP(ctx)
		return
	}
	key, derived := string(p.requestKey(ctx)), false
	if key == "" {
		key = call.metaKey
	}
	if key == "" && p.dedupes(call.name) {
		key, derived = derivedKey(call), true
	}
	if key == "" {
		p.hooks.tool("relay", false)
		p.relayMCP(ctx)
		return
	}
	p.serveTool(ctx, call, key, derived)
}

// dedupes reports whether -mcp-dedupe names tool (or is "*").
func (p *Proxy) dedupes(tool string) bool {
	for _, t := range p.cfg.MCPDedupe {
		if t == tool || t == "*" {
			return true
		}
	}
	return false
}

// relayMCP relays a request on an MCP path without recording it: its
// answer, an event stream included, goes to the client as the server
// sent it (its own event ids included), never retried once sent, and
// the call is cancelled when the client leaves (origin.onGone).
func (p *Proxy) relayMCP(ctx *fasthttp.RequestCtx) {
	if !p.acquireSlot() {
		p.refuse(ctx, causeMaxStreams, fmt.Sprintf("%d calls", p.cfg.MaxStreams))
		return
	}
	p.hooks.decided(ctx, decisionRelay, 0)
	f := cache.NewDetached(p.cfg.MaxStreamBytes)
	// A GET is the server's stream of its own messages: no head comes
	// later than a stream's, and it may go on longer than an answer.
	g := p.newGen(f, sse.Request{Stream: ctx.IsGet()}, rawKind)
	g.o.onGone = func() { g.cancel(causeClientGone) }
	g.launch(upstream.NewTemplate(ctx))
	p.serveOrigin(ctx, g)
}

// parseToolCall reads a single JSON-RPC tools/call request; ok is false
// for anything else (a batch, a notification, a response, another
// method, an id that is neither a string nor a number, a body that is
// not JSON). Member names are matched as JSON-RPC and MCP spell them,
// case and all, as servers match them: "ID" is not the id, nor "Method"
// the method (encoding/json's struct fields would take them). Of a
// member written twice, the last counts, as encoding/json's maps and
// JavaScript's JSON.parse have it.
func parseToolCall(ctx *fasthttp.RequestCtx) (*toolCall, bool) {
	if !ctx.IsPost() {
		return nil, false
	}
	body := bytes.TrimSpace(ctx.Request.Body())
	if len(body) == 0 || body[0] != '{' {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // numbers are kept as written, for the fingerprint
	var msg map[string]any
	if dec.Decode(&msg) != nil || dec.More() {
		return nil, false
	}
	var head, params, meta map[string]json.RawMessage
	var method string
	if json.Unmarshal(body, &head) != nil || json.Unmarshal(head["method"], &method) != nil || method != "tools/call" {
		return nil, false
	}
	id := head["id"]
	if len(id) == 0 || id[0] != '"' && !numberStart(id[0]) {
		return nil, false // a notification (no id, or null), or an id JSON-RPC does not allow
	}
	c := &toolCall{id: id}
	// params, its name and _meta, when there, must be what MCP says.
	if !unmarshalMember(head, "params", &params) || !unmarshalMember(params, "name", &c.name) ||
		!unmarshalMember(params, "_meta", &meta) {
		return nil, false
	}
	if t, ok := meta["progressToken"]; ok {
		c.token = t
	}
	if k, ok := meta[MetaKey]; ok {
		json.Unmarshal(k, &c.metaKey) //nolint:errcheck // a key that is no string is no key
	}
	// What a re-issue changes is left out of the fingerprint: the id,
	// the progress token, trace context and the key itself.
	delete(msg, "id")
	paramsAny, _ := msg["params"].(map[string]any)
	if meta, ok := paramsAny["_meta"].(map[string]any); ok {
		for _, k := range []string{"progressToken", "traceparent", "tracestate", MetaKey} {
			delete(meta, k)
		}
		if len(meta) == 0 {
			delete(paramsAny, "_meta")
		}
	}
	canon, err := json.Marshal(msg) // map keys sorted: canonical
	if err != nil {
		return nil, false
	}
	c.args, _ = json.Marshal(paramsAny["arguments"])
	c.fp = fingerprintOf(ctx, canon)
	return c, true
}

// unmarshalMember decodes the member name of obj into v, when obj has
// it; it reports false for a member that is not of v's type.
func unmarshalMember(obj map[string]json.RawMessage, name string, v any) bool {
	raw, ok := obj[name]
	return !ok || json.Unmarshal(raw, v) == nil
}

// derivedKey is the key of a call without one, for a tool of
// -mcp-dedupe: its name and canonical arguments (the tenant scopes it as
// any key).
func derivedKey(c *toolCall) string {
	h := sha256.New()
	h.Write([]byte(c.name))
	h.Write([]byte{0})
	h.Write(c.args)
	return "mcp-" + hex.EncodeToString(h.Sum(nil))
}

// serveTool takes the decision of docs/design.md, Request decision, for a
// keyed tools/call: a re-issue joins or replays the call under its own
// id, and a call whose outcome is unknown is not run again.
func (p *Proxy) serveTool(ctx *fasthttp.RequestCtx, call *toolCall, key string, derived bool) {
	sc, ok := p.keyScope(ctx, key)
	if !ok {
		return
	}
	ts, ok := p.store.(ToolStore)
	if !ok {
		p.relayMCP(ctx) // checked by New: a store without tool calls is a test's
		return
	}
	t := cache.Tool{Name: call.name, UnknownTTL: p.cfg.MCPUnknownTTL}
	if derived {
		t.Keep = p.cfg.MCPDedupeWindow
	}
	b, err := ts.BeginTool(sc, call.fp, t)
	if err != nil {
		if p.cfg.RelayWhenStoreDown && errors.Is(err, cache.ErrUnavailable) {
			p.logTool(ctx, decisionUnprotected, sc, call, "err", err.Error())
			p.relayMCP(ctx)
			return
		}
		p.storeError(ctx, sc, err)
		return
	}
	caller := &toolCaller{id: call.id, token: call.token, session: bytes.Clone(ctx.Request.Header.Peek("Mcp-Session-Id"))}
	p.answerBegun(ctx, b, onBegun{
		sc: sc, fp: call.fp, call: call,
		unknown: func() { p.unknownAnswer(ctx, caller) },
		hit:     func(r *cache.Result) { p.replayTool(ctx, r, caller) },
		join:    func(f *cache.Flight) { p.followTool(ctx, f, nil, caller, true) },
		miss: func(f *cache.Flight) {
			if !p.claimSlot(ctx, f) {
				return
			}
			// A JSON answer's whole time is -attempt-timeout's (it comes
			// when the tool is done); an event stream's silences are
			// bounded instead. The caller's place in the call (g.o.sub)
			// is taken by newGen, before the call goes out: no re-issue
			// can take it first.
			g := p.newGen(f, sse.Request{}, toolKind(call.id))
			g.launch(upstream.NewTemplate(ctx))
			p.logTool(ctx, decisionMiss, sc, call, "generation", f.Gen, "derived_key", derived)
			caller.origin = true
			p.followTool(ctx, f, g.o.sub, caller, false)
		},
	})
}

// logTool counts and logs the decision d on a tool call, among the tool
// decisions too.
func (p *Proxy) logTool(ctx *fasthttp.RequestCtx, d decision, sc cache.Scope, call *toolCall, attrs ...any) {
	p.hooks.tool(d.String(), decisions[d].suppressed)
	p.logDecision(ctx, d, sc, call.fp, append([]any{"tool", call.name}, attrs...)...)
}
