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
	p.logDecision(ctx, "resume", sc, fp, "generation", id.Gen, "after", id.Seq)
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

// serveStreamGet serves GET /streams/{key}: the key's stream, from the
// event after Last-Event-ID when the header is present. A browser's
// EventSource sends that header by itself when it reconnects.
func (p *Proxy) serveStreamGet(ctx *fasthttp.RequestCtx, _ string) {
	key, err := keyFromPath(ctx, "/streams/")
	if err != nil {
		p.refuse(ctx, causeInvalidKey, err.Error())
		return
	}
	var sc cache.Scope
	var ok bool
	if token := ctx.QueryArgs().Peek("token"); token != nil {
		// A signed resume URL: the token, not a credential, names the
		// scope, and a bad one learns nothing of the key.
		if sc, ok = p.tokenScope(string(token), key, time.Now()); !ok {
			p.refuse(ctx, causeInvalidResumeToken, "")
			return
		}
	} else if sc, ok = p.scope(ctx, key); !ok {
		return
	}
	p.offerResume(ctx, sc)
	var id sse.ID
	lei := ctx.Request.Header.Peek("Last-Event-ID")
	if len(lei) > 0 {
		if id, err = sse.ParseID(string(lei)); err != nil {
			p.refuse(ctx, causeInvalidLastEventID, "it is not an id this proxy issued")
			return
		}
	}
	f, r, err := p.store.Attach(sc, "", id, len(lei) > 0)
	if err != nil {
		p.attachError(ctx, sc, err, causeStreamNotFound.err(""))
		return
	}
	p.logDecision(ctx, "resume", sc, "", "generation", id.Gen, "after", id.Seq)
	p.serveAttached(ctx, f, r, id.Seq)
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
	cache.KeyInfo
}

// serveKeyInfo serves GET /keys/{key}: what the store knows of the key.
func (p *Proxy) serveKeyInfo(ctx *fasthttp.RequestCtx, _ string) {
	key, err := keyFromPath(ctx, "/keys/")
	if err != nil {
		p.refuse(ctx, causeInvalidKey, err.Error())
		return
	}
	sc, ok := p.scope(ctx, key)
	if !ok {
		return
	}
	ki, ok := p.store.Info(sc)
	if !ok {
		p.writeError(ctx, causeKeyNotFound.err(""))
		return
	}
	b, _ := json.Marshal(keyInfo{Key: key, KeyInfo: ki})
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
