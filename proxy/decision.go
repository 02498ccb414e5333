package proxy

import (
	"errors"
	"fmt"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// serveKeyed takes the decision of docs/design.md, Request decision, for a POST with an Idempotency-Key.
func (p *Proxy) serveKeyed(ctx *fasthttp.RequestCtx, key string) {
	sc, ok := p.keyScope(ctx, key)
	if !ok {
		return
	}
	fp := fingerprint(ctx)
	if lei := ctx.Request.Header.Peek("Last-Event-ID"); len(lei) > 0 {
		p.resume(ctx, sc, fp, string(lei))
		return
	}
	body := sse.ParseRequest(ctx.Request.Body())
	if body.Duplicate != "" {
		p.refuseDuplicate(ctx, body.Duplicate)
		return
	}
	b, err := p.store.Begin(sc, fp)
	if err != nil {
		if p.cfg.RelayWhenStoreDown && errors.Is(err, cache.ErrUnavailable) {
			p.logDecision(ctx, decisionUnprotected, sc, fp, "err", err.Error())
			p.relay(ctx)
			return
		}
		p.storeError(ctx, sc, err)
		return
	}
	// Every answer of the key's stream carries its resume URL (offerResume):
	// hit, join and miss; a refusal has no stream to resume.
	p.answerBegun(ctx, b, onBegun{
		sc: sc, fp: fp,
		hit: func(r *cache.Result) {
			p.hooks.saved(r.Usage)
			p.offerResume(ctx, sc, r.Gen)
			p.replay(ctx, r, 0)
		},
		join: func(f *cache.Flight) {
			p.offerResume(ctx, sc, f.Gen)
			p.serveFlight(ctx, f, 0, true)
		},
		miss: func(f *cache.Flight) {
			if b.Regenerated {
				p.hooks.missingBody()
			}
			if !p.claimSlot(ctx, f) {
				return
			}
			g := p.newGen(f, body, llmKind)
			p.hooks.generationStarted(g, ctx)
			p.hooks.answerFrom(ctx, f, "", "")
			here := g.runsInHandler()
			if here {
				// Its answer is one a shutdown waits for before the
				// generation ends (Wait: the generations, then these).
				p.handing(ctx)
			} else {
				g.launch(upstream.NewTemplate(ctx))
			}
			// What the answer's head and the log need is done before the
			// call, or while it is on its way.
			p.offerResume(ctx, sc, f.Gen)
			p.logDecision(ctx, decisionMiss, sc, fp, "generation", f.Gen, "regenerated", b.Regenerated)
			if here {
				g.run(upstream.NewTemplate(ctx))
			}
			p.serveOrigin(ctx, g)
		},
	})
}

// onBegun is what a kind of keyed call answers to the store's decisions
// (answerBegun), besides the refusals every kind answers alike: the key's
// scope and the request's fingerprint, for the decision's log; unknown,
// for a kind whose store holds calls of unknown outcome, answers a key
// held so.
type onBegun struct {
	sc      cache.Scope
	fp      string
	call    *toolCall // a tool call's: its decisions are counted among the tools' too (logTool)
	hit     func(r *cache.Result)
	join    func(f *cache.Flight)
	miss    func(f *cache.Flight) // logs its own decision, once the call is on its way
	unknown func()
}

// answerBegun answers a keyed call as the store's decision b says, for
// every kind of call: 422 for another request under the key, 410 for a
// result no longer held, 409 for a call in flight under -inflight
// conflict or a key its tenant stopped; on's answers otherwise.
func (p *Proxy) answerBegun(ctx *fasthttp.RequestCtx, b cache.Begun, on onBegun) {
	switch b.Decision {
	case cache.Conflict:
		p.logBegun(ctx, &on, decisionConflict)
		p.writeError(ctx, causeConflict.err(""))
	case cache.Gone:
		p.logBegun(ctx, &on, decisionGone)
		p.writeError(ctx, causeGone.err("the committed result of this key is no longer held"))
	case cache.Unknown:
		p.logBegun(ctx, &on, decisionUnknown)
		if on.unknown == nil {
			// A key another kind of call holds with its outcome unknown.
			p.writeError(ctx, failedAnswer(cache.StateCommitUnknown, ""))
			return
		}
		on.unknown()
	case cache.Cancelled:
		p.logBegun(ctx, &on, decisionCancelled)
		p.writeError(ctx, causeCancelled.err(""))
	case cache.Hit:
		p.logBegun(ctx, &on, decisionHit, "generation", b.Result.Gen, "events", b.Result.Events())
		on.hit(b.Result)
	case cache.Join:
		if p.cfg.Inflight == InflightConflict {
			p.logBegun(ctx, &on, decisionInFlight, "generation", b.Flight.Gen)
			p.writeError(ctx, causeInFlight.err(""))
			return
		}
		p.logBegun(ctx, &on, decisionJoin, "generation", b.Flight.Gen)
		on.join(b.Flight)
	case cache.Miss:
		on.miss(b.Flight)
	}
}

// logBegun counts and logs the decision d on a keyed call, with attrs.
func (p *Proxy) logBegun(ctx *fasthttp.RequestCtx, on *onBegun, d decision, attrs ...any) {
	if on.call != nil {
		p.logTool(ctx, d, on.sc, on.call, attrs...)
		return
	}
	p.logDecision(ctx, d, on.sc, on.fp, attrs...)
}

// requestKey is the idempotency key the request carries: its
// Idempotency-Key header, or else the first header of -key-header it
// has; nil when it has none.
func (p *Proxy) requestKey(ctx *fasthttp.RequestCtx) []byte {
	key := ctx.Request.Header.Peek("Idempotency-Key")
	for _, h := range p.cfg.KeyHeaders {
		if key != nil {
			break
		}
		key = ctx.Request.Header.Peek(h)
	}
	return key
}

// claimSlot takes a slot for the upstream call of the flight f a miss
// claimed; at -max-streams it ends f, refuses the request and reports
// false. No call was made: the one end of a flight that no generation
// owns.
func (p *Proxy) claimSlot(ctx *fasthttp.RequestCtx, f *cache.Flight) bool {
	if p.acquireSlot() {
		return true
	}
	f.Fail(causes[causeMaxStreams].state, causeMaxStreams.String(), nil)
	if ctx != nil { // nil: a WebSocket turn's, refused with an error frame
		p.refuse(ctx, causeMaxStreams, fmt.Sprintf("%d calls", p.cfg.MaxStreams))
	}
	return false
}
