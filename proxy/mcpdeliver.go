package proxy

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// toolCaller is one caller of a tool call. Every message it is given
// carries its own JSON-RPC id and progress token; the bytes are
// otherwise the server's.
type toolCaller struct {
	id, token []byte
	// session is the caller's own Mcp-Session-Id, which its answer
	// carries in place of the one that started the call: the caller's
	// SDK checks it against its session, and a replayed answer must not
	// hand one caller another's session.
	session []byte
	// origin: the caller that started the call, whose id and token the
	// server's messages already carry; requests of the server's
	// (sampling, elicitation) go to it alone, since only one answer to
	// each can go back.
	origin bool
	// sc and rd read the journal's events for events, on the goroutine
	// that writes the caller.
	sc *sse.Scanner
	rd bytes.Reader
}

var _ rewrite = (*toolCaller)(nil)

// message is data, one JSON-RPC message of the server's, as tc is given
// it; keep is false for one that is not for tc.
func (tc *toolCaller) message(data []byte) (out []byte, keep bool) {
	m := gjson.GetBytes(data, "method")
	if !m.Exists() {
		// The response, under the caller's id as it wrote it: a server
		// may write the origin's own id back in another spelling (1.0
		// for 1; sameRPCID). A response to another id is the origin's
		// as it came.
		id := gjson.GetBytes(data, "id")
		if tc.origin && (id.Raw == string(tc.id) || !sameID(id, tc.id)) {
			return data, true
		}
		return splice(data, id, tc.id), true
	}
	if tc.origin {
		return data, true
	}
	if gjson.GetBytes(data, "id").Exists() {
		return nil, false // a request of the server's: the origin answers it
	}
	if m.String() == "notifications/progress" {
		if tc.token == nil {
			return nil, false // progress the caller did not ask for
		}
		return splice(data, gjson.GetBytes(data, "params.progressToken"), tc.token), true
	}
	return data, true
}

// splice replaces the value r found in data with with.
func splice(data []byte, r gjson.Result, with []byte) []byte {
	if !r.Exists() || r.Index <= 0 || r.Index+len(r.Raw) > len(data) {
		return data
	}
	out := make([]byte, 0, len(data)-len(r.Raw)+len(with))
	out = append(out, data[:r.Index]...)
	out = append(out, with...)
	return append(out, data[r.Index+len(r.Raw):]...)
}

// head is h as tc's answer carries it: with tc's own session.
func (tc *toolCaller) head(h cache.Head) cache.Head {
	if tc.origin {
		return h
	}
	hs := make([]cache.Header, 0, len(h.Header)+1)
	for _, kv := range h.Header {
		if !strings.EqualFold(kv.Name, "Mcp-Session-Id") {
			hs = append(hs, kv)
		}
	}
	if len(tc.session) > 0 {
		hs = append(hs, cache.Header{Name: "Mcp-Session-Id", Value: string(tc.session)})
	}
	h.Header = hs
	return h
}

// events appends to dst the journal's encoded events wire as tc is given
// them: each message rewritten for tc, or left out, without the
// journal's ids (the protocol's streams are not resumed; a broken one is
// re-issued). The events are read with sse.Scanner and written with
// sse.AppendEvent, as every other stream is.
func (tc *toolCaller) events(dst, wire []byte) []byte {
	if tc.sc == nil {
		tc.sc = sse.NewScanner(nil, 0)
	}
	tc.rd.Reset(wire)
	tc.sc.Reset(&tc.rd)
	for tc.sc.Next() {
		ev := tc.sc.Event()
		if ev.Data == "" {
			continue
		}
		if msg, keep := tc.message([]byte(ev.Data)); keep {
			dst = sse.AppendEvent(dst, sse.ID{}, ev.Type, string(msg))
		}
	}
	return dst
}

// end appends to dst what ends tc's stream of a call that ended in state
// for reason: nothing after its response (a result, or the server's
// JSON-RPC error), the outcome-unknown error otherwise.
func (tc *toolCaller) end(dst []byte, state cache.State, reason string) []byte {
	if state == cache.StateCommitted || reason == causeErrorEvent.String() {
		return dst
	}
	return sse.AppendEvent(dst, sse.ID{}, "message", string(unknownMessage(tc.id)))
}

// unknownMessage is the JSON-RPC error of a tool call whose outcome is
// unknown, under the caller's id.
func unknownMessage(id []byte) []byte {
	b, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"id":      json.RawMessage(id),
		"error": map[string]any{
			"code": UnknownCode,
			"message": "ssegate: the outcome of this tool call is unknown: the server may have run it, and it was not run again " +
				"(DELETE /keys/{key} clears it)",
		},
	})
	return b
}

// unknownAnswer answers a re-issue of a tool call whose outcome is
// unknown: a JSON-RPC error in a 200, as the transport carries JSON-RPC
// errors, with the outcome-unknown marker.
func (p *Proxy) unknownAnswer(ctx *fasthttp.RequestCtx, tc *toolCaller) {
	fillUnknown(&ctx.Response, tc)
}

func fillUnknown(resp *fasthttp.Response, tc *toolCaller) {
	resp.Reset()
	resp.SetStatusCode(fasthttp.StatusOK)
	resp.Header.SetServer(serverName)
	resp.Header.SetContentType("application/json")
	if len(tc.session) > 0 {
		resp.Header.SetBytesV("Mcp-Session-Id", tc.session)
	}
	markUnknown(&resp.Header)
	resp.SetBody(unknownMessage(tc.id))
}

// replayTool answers a re-issue of a committed tool call from its result.
func (p *Proxy) replayTool(ctx *fasthttp.RequestCtx, r *cache.Result, tc *toolCaller) {
	data, err := r.After(0)
	if err != nil {
		p.writeError(ctx, causeStoreUnavailable.err(""))
		return
	}
	if !r.Head.Stream {
		p.whole(ctx, resultEnded(r, data), true, tc)
		return
	}
	out := tc.events(nil, data)
	p.takeOver(ctx, false, func(c *clientConn) {
		c.replayed = true
		c.answerHead(tc.head(r.Head))
		c.finish(c.write(out) == nil && c.end() == nil, nil)
	})
}

// followTool answers a caller of the live tool call f, its origin
// included: the server's answer as it comes, each message rewritten for
// the caller. The call goes on whatever becomes of its callers. sub is
// the origin's place in f, taken before the call went out (newGen); a
// re-issue, with sub nil, takes one among f's followers (-max-followers).
func (p *Proxy) followTool(ctx *fasthttp.RequestCtx, f *cache.Flight, sub *cache.Sub, tc *toolCaller, replayed bool) {
	if sub == nil {
		var ok bool
		if sub, ok = p.subscribe(ctx, f, 0); !ok {
			return
		}
	}
	p.waitFlight(ctx, f, sub, replayed, func(c *clientConn, h cache.Head) {
		c.answerHead(tc.head(h))
		ok := p.writeFollower(c, sub, f, false, tc)
		c.finish(ok && c.end() == nil, nil)
	}, func(c *clientConn) {
		p.answerEnded(c, flightEnded(f), tc)
	})
}

// UnknownCode is the JSON-RPC error code of the answer to a tool call
// whose outcome is unknown: the server may have run it, and ssegate does
// not run it again (docs/design.md, Tool calls). It is in JSON-RPC's
// range for implementation-defined server errors.
const UnknownCode = -32070
