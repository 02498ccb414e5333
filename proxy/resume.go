package proxy

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// resume serves a POST that repeats a key with Last-Event-ID: the events
// after that id, from the live generation or the committed one.
func (p *Proxy) resume(ctx *fasthttp.RequestCtx, sc cache.Scope, fp, lastEventID string) {
	id, err := sse.ParseID(lastEventID)
	if err != nil {
		p.refuse(ctx, causeInvalidLastEventID, "it is not an id this proxy issued")
		return
	}
	f, r, err := p.store.Attach(sc, fp, id, true)
	if err != nil {
		p.attachError(ctx, sc, err, causeGone.err("no generation of this key holds that Last-Event-ID"))
		return
	}
	p.offerResume(ctx, sc, id.Gen)
	p.logDecision(ctx, decisionResume, sc, fp, "generation", id.Gen, "after", id.Seq)
	p.serveAttached(ctx, f, r, id.Seq)
}

// serveAttached serves what Attach found, after journal position after:
// the live generation f, followed to its end, or else the stored r.
func (p *Proxy) serveAttached(ctx *fasthttp.RequestCtx, f *cache.Flight, r *cache.Result, after uint64) {
	if f != nil {
		p.serveFlight(ctx, f, after, true)
		return
	}
	p.replay(ctx, r, after)
}

// streamsAllow is what /streams/{key} answers: nothing under it is relayed.
const streamsAllow = "GET, HEAD, DELETE"

// serveStreams serves every request under /streams/, in any spelling
// (underPath): GET and HEAD of a key's stream, DELETE to stop it
// (stop.go), 405 for anything else.
// None of them goes upstream, whatever its method: its URL may carry a
// resume token.
func (p *Proxy) serveStreams(ctx *fasthttp.RequestCtx) {
	switch {
	case ctx.IsGet(), ctx.IsHead():
		p.serveStreamGet(ctx)
	case ctx.IsDelete():
		p.serveStreamStop(ctx)
	default:
		p.refuse(ctx, causeMethodNotAllowed, "")
		ctx.Response.Header.Set("Allow", streamsAllow)
	}
}

// serveStreamGet serves GET /streams/{key}: the key's stream, from the
// event after Last-Event-ID when the header is present. A browser's
// EventSource sends that header by itself when it reconnects. HEAD gets
// the same answer's status and head, without a body.
func (p *Proxy) serveStreamGet(ctx *fasthttp.RequestCtx) {
	key, err := keyFromPath(ctx, "/streams/")
	if err != nil {
		p.refuse(ctx, causeInvalidKey, err.Error())
		return
	}
	if p.store == nil {
		// Nothing is recorded, so no stream is known; still nothing
		// under /streams/ goes upstream.
		p.writeError(ctx, causeStreamNotFound.err(""))
		return
	}
	var id sse.ID
	lei := ctx.Request.Header.Peek("Last-Event-ID")
	hasID := len(lei) > 0
	parseID := func() bool {
		if hasID {
			if id, err = sse.ParseID(string(lei)); err != nil {
				p.refuse(ctx, causeInvalidLastEventID, "it is not an id this proxy issued")
				return false
			}
		}
		return true
	}
	var sc cache.Scope
	if token, ok := queryToken(ctx); ok {
		// A signed resume URL: the token, not a credential, names the
		// scope and the generation, and a bad one learns nothing of the
		// key.
		g, ok := p.tokenGrant(token, key, time.Now())
		if !ok {
			p.refuse(ctx, causeInvalidResumeToken, "")
			return
		}
		if !parseID() {
			return
		}
		if hasID && id.Gen != g.gen {
			p.writeError(ctx, causeGone.err("the resume URL is for another generation than Last-Event-ID"))
			return
		}
		// The token opens its own generation only: the store answers
		// ErrGone when the key holds another one now.
		sc, id, hasID = g.sc, sse.ID{Gen: g.gen, Seq: id.Seq}, true
		ctx.SetUserValue(grantKey, g.expires)
	} else {
		var ok bool
		if sc, ok = p.scope(ctx, key); !ok || !parseID() {
			return
		}
	}
	f, r, err := p.store.Attach(sc, "", id, hasID)
	if err != nil {
		if errors.Is(err, cache.ErrGone) && ctx.UserValue(grantKey) != nil {
			p.writeError(ctx, causeGone.err("the generation this resume URL was issued for is no longer held; the key's later answers carry a URL of their own"))
			return
		}
		p.attachError(ctx, sc, err, causeStreamNotFound.err(""))
		return
	}
	gen := id.Gen
	if f != nil {
		gen = f.Gen
	} else if r != nil {
		gen = r.Gen
	}
	p.offerResume(ctx, sc, gen)
	if ctx.IsHead() {
		p.logDecision(ctx, decisionHead, sc, "", "generation", gen)
		p.serveHead(ctx, f, r, id.Seq)
		return
	}
	p.logDecision(ctx, decisionResume, sc, "", "generation", gen, "after", id.Seq)
	p.serveAttached(ctx, f, r, id.Seq)
}

// queryToken returns the request's resume token: its token query
// parameter, however the name is escaped. Present twice it is no token at
// all: "" and ok, which no token verifies.
func queryToken(ctx *fasthttp.RequestCtx) (string, bool) {
	var token string
	n := 0
	for k, v := range ctx.QueryArgs().All() {
		if string(k) == "token" {
			token = string(v)
			n++
		}
	}
	if n > 1 {
		return "", true
	}
	return token, n == 1
}

// serveHead answers HEAD of a stream: the status and head a GET would get
// (waiting, as a GET does, for a live generation's), with no body and no
// events read.
func (p *Proxy) serveHead(ctx *fasthttp.RequestCtx, f *cache.Flight, r *cache.Result, after uint64) {
	if f != nil {
		h, ok := p.flightHead(ctx, f)
		if !ok {
			return
		}
		writeHead(ctx, h, true)
		ctx.Response.Header.SetContentLength(-1) // a GET's is chunked, or runs until its end
		return
	}
	data, err := r.After(after)
	switch {
	case err != nil:
		p.writeError(ctx, causeInvalidLastEventID.err("it names an event this stream never had"))
	case r.Head.Stream && after > 0 && len(data) == 0:
		ctx.SetStatusCode(fasthttp.StatusNoContent) // as replay answers
		ctx.Response.Header.Set("Idempotent-Replayed", "true")
	default:
		writeHead(ctx, r.Head, true)
		if r.Head.Stream {
			ctx.Response.Header.SetContentLength(-1)
		} else {
			ctx.Response.Header.SetContentLength(len(data))
		}
	}
}

// attachError maps the store's answer to a resume onto the errors of docs/design.md, Errors;
// notFound is what an unknown key gets.
func (p *Proxy) attachError(ctx *fasthttp.RequestCtx, sc cache.Scope, err error, notFound *apiError) {
	switch {
	case errors.Is(err, cache.ErrNotFound):
		p.writeError(ctx, notFound)
	case errors.Is(err, cache.ErrGone):
		p.writeError(ctx, causeGone.err("the generation that Last-Event-ID names aborted or is no longer held"))
	case errors.Is(err, cache.ErrPosition):
		p.refuse(ctx, causeInvalidLastEventID, "it names an event this stream never had")
	case errors.Is(err, cache.ErrConflict):
		p.writeError(ctx, causeConflict.err(""))
	default:
		p.storeError(ctx, sc, err)
	}
}

// keyInfo is the JSON answer of GET /keys/{key}.
type keyInfo struct {
	Key string `json:"key"`
	// Kind is what the key names: a keyed request, an MCP tool call
	// (its name in KeyInfo.Tool) or a WebSocket turn.
	Kind string `json:"kind"`
	cache.KeyInfo
}

// The kinds of key keyInfo shows.
const (
	keyKindRequest = "request"
	keyKindTool    = "tool_call"
	keyKindWSTurn  = "websocket_turn"
)

// newKeyInfo is the answer about key, from what the store knows of it. A
// keyed WebSocket turn is held as a tool call is (BeginTool, under
// wsTurnTool): it is shown as the turn it is.
func newKeyInfo(key string, ki cache.KeyInfo) keyInfo {
	kind := keyKindRequest
	switch ki.Tool {
	case "":
	case wsTurnTool:
		kind, ki.Tool = keyKindWSTurn, ""
	default:
		kind = keyKindTool
	}
	return keyInfo{Key: key, Kind: kind, KeyInfo: ki}
}

// serveKeyInfo serves GET /keys/{key}: what the store knows of the key.
func (p *Proxy) serveKeyInfo(ctx *fasthttp.RequestCtx) {
	sc, ok := p.pathScope(ctx)
	if !ok {
		return
	}
	if p.store == nil {
		p.writeError(ctx, causeKeyNotFound.err(""))
		return
	}
	ki, ok := p.store.Info(sc)
	if !ok {
		p.writeError(ctx, causeKeyNotFound.err(""))
		return
	}
	b, _ := json.Marshal(newKeyInfo(sc.Key, ki))
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// serveKeyDelete serves DELETE /keys/{key}: the key, if it is not running,
// is forgotten with its answer, whatever it ended in; a tool call whose
// outcome is unknown is free to run again after it.
func (p *Proxy) serveKeyDelete(ctx *fasthttp.RequestCtx) {
	sc, ok := p.pathScope(ctx)
	if !ok {
		return
	}
	var err error = cache.ErrNotFound
	if ts, ok := p.store.(ToolStore); ok {
		err = ts.Forget(sc)
	}
	switch {
	case err == nil:
		p.log.Info("key deleted", "key", sc.Key, "tenant", sc.Tenant)
		ctx.SetStatusCode(fasthttp.StatusNoContent)
	case errors.Is(err, cache.ErrLive):
		p.writeError(ctx, causeInFlight.err("the key's call is running: it can be deleted once it ended"))
	case errors.Is(err, cache.ErrNotFound):
		p.writeError(ctx, causeKeyNotFound.err(""))
	default:
		p.storeError(ctx, sc, err)
	}
}
