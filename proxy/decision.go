package proxy

import (
	"errors"
	"fmt"
	"slices"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// A decision is what the proxy made of a request: the decision log's
// "decision" and the label of ssegate_requests_total. Its row in decisions
// is everything the log and the metrics know of it; adding one is a
// constant, a row, and its line in docs/metrics.md (TestDecisionsDocumented).
type decision uint8

const (
	decisionNone decision = iota // not counted (causeRow.refusal)
	decisionMiss
	decisionHit
	decisionJoin
	decisionResume
	decisionHead
	decisionConflict
	decisionInFlight
	decisionGone
	decisionInvalid
	decisionRefused
	decisionDenied
	decisionRelay
	decisionUnprotected
	decisionUnknown

	numDecisions
)

type decisionRow struct {
	label string
	note  string // what the label does not say, for the metric's help
	// suppressed: answered without a new upstream generation, and so
	// counted by ssegate_duplicates_suppressed_total too.
	suppressed bool
}

// decisions is the table of decisions.
var decisions = [numDecisions]decisionRow{
	decisionMiss:        {label: "miss"},
	decisionHit:         {label: "hit", suppressed: true},
	decisionJoin:        {label: "join", suppressed: true},
	decisionResume:      {label: "resume", suppressed: true},
	decisionHead:        {label: "head", note: "HEAD of a stream"},
	decisionConflict:    {label: "conflict"},
	decisionInFlight:    {label: "in_flight"},
	decisionGone:        {label: "gone"},
	decisionInvalid:     {label: "invalid"},
	decisionRefused:     {label: "refused", note: "a bound"},
	decisionDenied:      {label: "denied", note: "no credential under -anonymous-keys deny"},
	decisionRelay:       {label: "relay", note: "no key"},
	decisionUnprotected: {label: "unprotected", note: "keyed, relayed while Redis is down under -redis-down relay"},
	decisionUnknown:     {label: "unknown", note: "a tool call whose outcome is unknown, not run again", suppressed: true},
}

func (d decision) String() string { return decisions[d].label }

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
			g.launch(upstream.NewTemplate(ctx))
			// What the answer's head and the log need is done while the
			// upstream call is on its way.
			p.offerResume(ctx, sc, f.Gen)
			p.logDecision(ctx, decisionMiss, sc, fp, "generation", f.Gen, "regenerated", b.Regenerated)
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
// conflict; on's answers otherwise.
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

// storeError answers a failure of the store itself, or a bound it holds,
// for the key of sc. The answer's message is the cause's fixed text: the
// store's error (a Redis client's names addresses, users and the server's
// own words) goes to the log only, beside the key and the tenant's hash.
func (p *Proxy) storeError(ctx *fasthttp.RequestCtx, sc cache.Scope, err error) {
	c := causeStoreUnavailable
	switch {
	case errors.Is(err, cache.ErrTenantFull):
		// Only this credential's new keys are refused: its known keys,
		// and every other credential's, are decided as usual.
		c = causeTenantFull
	case errors.Is(err, cache.ErrStoreFull):
		c = causeStoreFull
	}
	p.refuse(ctx, c, "", "key", sc.Key, "tenant", sc.Tenant, "err", err.Error())
}

// flightHead waits for the live flight f's head; when the flight ended
// without one, it answers the failure and reports false.
func (p *Proxy) flightHead(ctx *fasthttp.RequestCtx, f *cache.Flight) (cache.Head, bool) {
	<-f.HeadReady()
	h, ok := f.Head()
	if !ok {
		state, reason, _ := f.Outcome()
		p.writeError(ctx, failedAnswer(state, reason))
	}
	return h, ok
}

// serveFlight answers from a live flight: the upstream's head once known,
// then its events after seq after, following it to its end.
func (p *Proxy) serveFlight(ctx *fasthttp.RequestCtx, f *cache.Flight, after uint64, replayed bool) {
	if replayed && p.tracer != nil {
		p.hooks.answerFrom(ctx, f, "", f.Trace())
	}
	if p.awaits(f) {
		p.await(ctx, f, after, replayed)
		return
	}
	h, ok := p.flightHead(ctx, f)
	if !ok {
		return
	}
	if !h.Stream {
		<-f.Done()
		e := flightEnded(f)
		if replayed && e.state == cache.StateCommitted {
			p.hooks.saved(f.Usage())
		}
		p.whole(ctx, e, replayed, nil)
		return
	}
	sub, ok := p.subscribe(ctx, f, after)
	if !ok {
		return
	}
	writeHead(ctx, h, replayed)
	select {
	case <-f.Done(): // ended before this answer's head: it can say how
		state, _, _ := f.Outcome()
		outcomeHead(&ctx.Response.Header, state, f.Unstored())
	default:
	}
	p.stream(ctx, func(c *clientConn) bool {
		ok := p.writeFollower(c, sub, f, !replayed, nil)
		if ok && replayed {
			if st, _, _ := f.Outcome(); st == cache.StateCommitted {
				p.hooks.saved(f.Usage())
			}
		}
		return ok
	}, nil)
}

// replay answers from a committed result, from the event after seq.
func (p *Proxy) replay(ctx *fasthttp.RequestCtx, r *cache.Result, after uint64) {
	p.hooks.answerFrom(ctx, nil, cache.StateCommitted, r.Trace)
	data, err := r.After(after)
	if err != nil {
		p.writeError(ctx, causeInvalidLastEventID.err("it names an event this stream never had"))
		return
	}
	if r.Head.Stream && after > 0 && len(data) == 0 {
		// Nothing after that id, and nothing will come: 204 tells a
		// browser's EventSource to stop reconnecting.
		ctx.SetStatusCode(fasthttp.StatusNoContent)
		ctx.Response.Header.Set("Idempotent-Replayed", "true")
		return
	}
	if !r.Head.Stream {
		p.whole(ctx, resultEnded(r, data), true, nil)
		return
	}
	writeHead(ctx, r.Head, true)
	p.stream(ctx, func(c *clientConn) bool { return c.write(data) == nil }, nil)
}

// whole answers with e on the client's own connection, as a goroutine
// of its own writes it (answerEnded): in pieces, each within
// -slow-client-timeout (clientConn.answerWhole), so that a client that
// stops reading a large stored body is dropped rather than held, and one
// that reads it steadily gets it whole. An answer that has nothing to
// relay is refused at once.
func (p *Proxy) whole(ctx *fasthttp.RequestCtx, e finalAnswer, replayed bool, tc *toolCaller) {
	if e.failed() && (tc == nil || e.state != cache.StateCommitUnknown) {
		p.writeError(ctx, failedAnswer(e.state, e.reason))
		return
	}
	p.takeOver(ctx, false, func(c *clientConn) {
		c.replayed = replayed
		p.answerEnded(c, e, tc)
	})
}

// writeHead sets the status and headers of an answer, with the signed
// resume URL of a keyed stream (offerResume).
func writeHead(ctx *fasthttp.RequestCtx, h cache.Head, replayed bool) {
	setHead(&ctx.Response.Header, h, replayed)
	if u := resumeURL(ctx); u != "" {
		ctx.Response.Header.Set(resumeURLHeader, u)
	}
}

// outcomeHead marks the head of an answer from a flight that ended in
// state: the outcome-unknown marker when the key is commit_unknown, and
// storedHeader when the answer came whole and the store did not keep it
// (unstored: Flight.Unstored).
func outcomeHead(rh *fasthttp.ResponseHeader, state cache.State, unstored bool) {
	if state == cache.StateCommitUnknown {
		markUnknown(rh)
	}
	if unstored {
		rh.Set(storedHeader, "false")
	}
}

// endedHead is h with the headers outcomeHead sets for the ended flight
// f, for a stream's head written once f had ended. An upstream head never
// carries them (skipResponseHeader), so they are only added; the flight's
// own head is shared, and clipped so that it is never written to.
func endedHead(f *cache.Flight, h cache.Head) cache.Head {
	state, _, _ := f.Outcome()
	if state == cache.StateCommitUnknown {
		h.Header = append(slices.Clip(h.Header), cache.Header{Name: outcomeHeader, Value: "unknown"})
	}
	if f.Unstored() {
		h.Header = append(slices.Clip(h.Header), cache.Header{Name: storedHeader, Value: "false"})
	}
	return h
}

func setHead(rh *fasthttp.ResponseHeader, h cache.Head, replayed bool) {
	rh.SetStatusCode(h.Status)
	rh.SetServer(serverName)
	for _, kv := range h.Header {
		rh.Add(kv.Name, kv.Value)
	}
	if h.ContentType != "" {
		rh.SetContentType(h.ContentType)
	}
	if replayed {
		rh.Set("Idempotent-Replayed", "true")
	}
	if h.Stream {
		rh.Set("Cache-Control", "no-cache")
		rh.Set("X-Accel-Buffering", "no")
	}
}
