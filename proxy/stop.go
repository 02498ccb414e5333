package proxy

import (
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// A stop is a tenant's word that a live generation is no longer wanted:
// DELETE /streams/{key}, or POST /v1/responses/{id}/cancel for a
// Responses stream's id (an alias of its key, as GET /v1/responses/{id}
// resolves it). The generation's upstream call is cut (gen.Stop: the
// connection is closed under its read, its head awaited included,
// upstream.Call; a keyed WebSocket turn's upstream socket is closed,
// wsConn.stopTurn), every client of its flight gets
// stream_aborted with code cancelled, nothing is stored, and the key is
// left cancelled: held, so that a repeat of it is refused (409
// stream_cancelled) rather than paid for again, until DELETE /keys/{key}
// or -ttl (as long as an answer is kept). On any replica: with Redis, a
// replica that does not run the generation asks its owner through the
// owner's inbox (cache/redis, Store.Stop).
//
// The answer is the key's state once the generation ended, waited for
// within -stop-timeout: 200 when it is cancelled (by this stop or an
// earlier one: a stop is idempotent), 202 when the generation had not
// been seen to end by then (the stop may be repeated), 409 stream_ended
// when it had ended otherwise (committed, failed), 404 stream_not_found
// for a key or id the tenant does not have.

// stopStore is a store whose generations may run on other replicas: it
// tells their owner of a stop (redis.Store).
type stopStore interface {
	Stop(sc cache.Scope, gen uint64) error
}

// The results of a stop: the label of ssegate_stops_total.
const (
	stopStopped     = "stopped"     // the generation ended cancelled
	stopUnconfirmed = "unconfirmed" // not seen to end within -stop-timeout
	stopEnded       = "ended"       // it had ended otherwise
	stopNotFound    = "not_found"   // no such key or id for the tenant
)

var stopResults = []string{stopStopped, stopUnconfirmed, stopEnded, stopNotFound}

// serveStreamStop serves DELETE /streams/{key}: the stop of the key's
// live generation, answered with the key's info (GET /keys/{key}).
func (p *Proxy) serveStreamStop(ctx *fasthttp.RequestCtx) {
	key, err := keyFromPath(ctx, "/streams/")
	if err != nil {
		p.refuse(ctx, causeInvalidKey, err.Error())
		return
	}
	if p.store == nil {
		p.stopAnswered(stopNotFound)
		p.writeError(ctx, causeStreamNotFound.err(""))
		return
	}
	sc, ok := p.scope(ctx, key)
	if !ok {
		return
	}
	p.stop(ctx, sc, 0, func(ki cache.KeyInfo) []byte {
		b, _ := json.Marshal(newKeyInfo(sc.Key, ki))
		return b
	})
}

// responseCancelID returns the {id} of POST …/responses/{id}/cancel, or "".
func responseCancelID(path string) string {
	rest, ok := strings.CutSuffix(path, "/cancel")
	if !ok {
		return ""
	}
	return responseID(rest)
}

// responseStopped is the answer to POST /v1/responses/{id}/cancel: the
// part of OpenAI's response object a stop knows (its id and status), with
// the key's info beside it.
type responseStopped struct {
	ID     string  `json:"id"`
	Object string  `json:"object"`
	Status string  `json:"status"` // cancelled, or in_progress when not seen to end
	Key    keyInfo `json:"ssegate_key"`
}

// serveResponseCancel serves POST /v1/responses/{id}/cancel (what the
// OpenAI SDKs' Responses.Cancel sends): the stop of the keyed Responses
// stream whose response.created named id, for the tenant whose key it is.
// An id that names no keyed stream of the tenant is 404: ssegate cannot
// tell what an upstream would do with it, and a stop that went upstream
// would not stop the call ssegate holds open.
func (p *Proxy) serveResponseCancel(ctx *fasthttp.RequestCtx, id string) {
	as, ok := p.store.(aliasStore)
	if !ok {
		p.stopAnswered(stopNotFound)
		p.writeError(ctx, causeStreamNotFound.err("no keyed Responses stream has this id"))
		return
	}
	tenant, ok := p.keyTenant(ctx)
	if !ok {
		p.refuse(ctx, causeCredentialRequired, "")
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="ssegate"`)
		return
	}
	a, ok := as.ResolveAlias(tenant, id)
	if !ok {
		p.stopAnswered(stopNotFound)
		p.writeError(ctx, causeStreamNotFound.err("no keyed Responses stream has this id"))
		return
	}
	sc, ok := p.scope(ctx, a.Key)
	if !ok {
		return
	}
	p.stop(ctx, sc, a.Gen, func(ki cache.KeyInfo) []byte {
		status := "cancelled"
		if ki.State.Live() {
			status = "in_progress"
		}
		b, _ := json.Marshal(responseStopped{ID: id, Object: "response", Status: status, Key: newKeyInfo(sc.Key, ki)})
		return b
	})
}

// stop stops the live generation of sc (gen only, when not 0) and
// answers as the comment at the top of this file says; body makes the
// answer's JSON from the key's info.
func (p *Proxy) stop(ctx *fasthttp.RequestCtx, sc cache.Scope, gen uint64, body func(cache.KeyInfo) []byte) {
	ki, ok := p.store.Info(sc)
	if ok && ki.State.Live() && (gen == 0 || ki.Generation == gen) {
		if err := p.stopFlight(sc, ki.Generation); err != nil {
			p.storeError(ctx, sc, err)
			return
		}
		ki, ok = p.store.Info(sc)
	}
	if !ok || (gen != 0 && ki.Generation != gen) {
		p.stopAnswered(stopNotFound)
		p.writeError(ctx, causeStreamNotFound.err(""))
		return
	}
	status, result := fasthttp.StatusOK, stopStopped
	switch {
	case ki.State == cache.StateCancelled:
	case ki.State.Live():
		status, result = fasthttp.StatusAccepted, stopUnconfirmed
	default:
		p.stopAnswered(stopEnded)
		p.writeError(ctx, causeStreamEnded.err("it ended "+string(ki.State)))
		return
	}
	p.stopAnswered(result)
	p.log.Info("stop", "key", sc.Key, "tenant", sc.Tenant, "generation", ki.Generation, "state", ki.State, "result", result)
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(body(ki))
}

// stopFlight stops the live generation gen of sc, here or through the
// store at the replica that runs it, and waits, within -stop-timeout, for
// its flight to end. A generation found ended meanwhile is no error.
func (p *Proxy) stopFlight(sc cache.Scope, gen uint64) error {
	f, _, err := p.store.Attach(sc, "", sse.ID{}, false)
	switch {
	case errors.Is(err, cache.ErrNotFound), errors.Is(err, cache.ErrGone), errors.Is(err, cache.ErrConflict):
		return nil
	case err != nil:
		return err
	case f == nil || f.Gen != gen:
		return nil // ended, committed
	}
	if !f.Stop() {
		ss, ok := p.store.(stopStore)
		if !ok {
			return nil // ended meanwhile
		}
		if err := ss.Stop(sc, gen); err != nil && !errors.Is(err, cache.ErrNotFound) {
			return err
		}
	}
	t := time.NewTimer(p.cfg.StopTimeout)
	defer t.Stop()
	select {
	case <-f.Done():
	case <-t.C:
	}
	return nil
}

// stopAnswered counts a stop by its result.
func (p *Proxy) stopAnswered(result string) { p.hooks.stopped(result) }
