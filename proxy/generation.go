package proxy

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// gen is one request's upstream work feeding one Flight: the attempts,
// then the answer's body. Its goroutine owns resp; cancel may be called
// from any goroutine, the generation's own included, and interrupts a
// blocked read by closing the upstream connection under it, or a backoff
// by closing stop.
type gen struct {
	p    *Proxy
	f    *cache.Flight
	o    *origin     // the client whose request started it
	req  sse.Request // what the proxy reads of the request body (stream, n, include_usage, model)
	kind *kind       // what the call is: a model's generation, a tool call, a raw relay

	// mayRun is set, by the generation's goroutine, once an attempt failed
	// in a way that may have left the request running upstream (its
	// cause's state is commit_unknown): from then on a failed end, a cut
	// during a retry's wait included, stays commit_unknown (gen.fail).
	// No fallback follows it either: its model's route is pinned
	// (mayHaveRun).
	mayRun bool

	mu       sync.Mutex // guards resp, finished and cause
	resp     *fasthttp.Response
	finished bool
	cause    cause         // why the generation was cut short, if it was
	stop     chan struct{} // closed by cancel
	start    time.Time
	// upCall interrupts the upstream call in progress, also while it
	// awaits its head, when resp is not there yet (cancel).
	upCall upstream.Call

	// Owned by the generation's goroutine.
	ai         genAIOp         // the GenAI metrics' labels
	model      string          // the model of the calls being made
	fellBack   bool            // model is a fallback's
	firstSent  time.Time       // the first call's start
	lastSent   time.Time       // the latest call's start
	heldFailed bool            // the last attempt's held failure is being relayed (lossFailed)
	traceCtx   context.Context // the request's span; nil when tracing is off
	span       *callSpan       // the current call's span
}

// newGen makes the generation of flight f, a call of kind k, for the
// request req, whose client is its origin: that client's place in f
// (f.SubscribeOrigin, no follower, never refused) is taken here, before
// the generation can be launched, so that no joiner can come before it,
// and nothing the generation journals or ends with.
func (p *Proxy) newGen(f *cache.Flight, req sse.Request, k *kind) *gen {
	g := &gen{p: p, f: f, req: req, kind: k, stop: make(chan struct{}), start: time.Now()}
	g.o = &origin{p: p, g: g, f: f, sub: f.SubscribeOrigin()}
	if !req.Stream && !k.raw {
		g.o.known = make(chan struct{}) // its answer may be written by its handler (answerInHandler)
	}
	f.SetStopper(g)
	p.gens.Add(1)
	p.liveMu.Lock()
	p.live[g] = struct{}{}
	p.liveMu.Unlock()
	select {
	case <-p.done: // a request that raced Abort
		g.cancel(causeShutdown)
	default:
	}
	return g
}

// cancel cuts the generation short; the flight then fails with cause.
func (g *gen) cancel(c cause) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.finished || g.cause != causeNone {
		return
	}
	g.cause = c
	close(g.stop)
	if g.resp != nil {
		upstream.Interrupt(g.resp)
	} else {
		// A call that awaits its head: its connection is closed now,
		// not once the head came (within -head-timeout).
		g.upCall.Interrupt()
	}
}

// Stop is cancel for a stop of its tenant (cache.Stopper): the flight
// ends cancelled.
func (g *gen) Stop() { g.cancel(causeCancelled) }

func (g *gen) cutShort() cause {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cause
}

// drop releases the current attempt's response.
func (g *gen) drop() {
	g.mu.Lock()
	resp := g.resp
	g.resp = nil
	g.mu.Unlock()
	if resp != nil {
		if c := upstream.ConnOf(resp); c != nil {
			c.HoldBy(time.Time{}, nil)
			if c.Interrupted() {
				// Closed under a body that may have been read whole:
				// fasthttp would pool it again.
				resp.SetConnectionClose()
			}
		}
		resp.CloseBodyStream() //nolint:errcheck // the body is done with
		fasthttp.ReleaseResponse(resp)
	}
}

// finish marks the generation over, so a late cancel no longer touches
// resp, and releases what it holds.
func (g *gen) finish() {
	g.drop()
	g.mu.Lock()
	g.finished = true
	g.mu.Unlock()
	p := g.p
	p.liveMu.Lock()
	delete(p.live, g)
	p.liveMu.Unlock()
	p.releaseSlot()
	p.gens.Done()
}

// call sends req to up and returns the response with its body still to be
// read. It releases req.
func (g *gen) call(up *upstream.Upstream, req *fasthttp.Request) (*fasthttp.Response, error) {
	resp := fasthttp.AcquireResponse()
	var err error
	if g.kind.send != nil {
		err = g.kind.send(g, req, resp)
	} else {
		err = up.DoCall(req, resp, g.req.Stream, &g.upCall)
	}
	fasthttp.ReleaseRequest(req)
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		return nil, err
	}
	g.mu.Lock()
	g.resp = resp
	cut := g.cause
	g.mu.Unlock()
	if g.kind.streamOnHead && !g.req.Stream && isEventStream(string(resp.Header.ContentType())) {
		upstream.ConnOf(resp).AsStream()
	}
	if cut != causeNone {
		// Cancelled while waiting: nothing of the answer is read. Unless
		// its head says the upstream did not run the request, it may
		// have: the flight's end is commit_unknown (gen.fail).
		if !g.saidNotRun(resp) {
			g.mayRun = true
		}
		g.drop()
		return nil, errCancelled
	}
	return resp, nil
}

// saidNotRun reports whether an upstream's answer says the request did not
// run: an error status that neither carries the outcome-unknown marker
// nor is one the kind finds ambiguous (-ambiguous-status for a model's; a
// tool call's says so only with 429 or 503).
func (g *gen) saidNotRun(resp *fasthttp.Response) bool {
	st := resp.StatusCode()
	if g.kind.ranOnAnswer && st != fasthttp.StatusTooManyRequests && st != fasthttp.StatusServiceUnavailable {
		return false
	}
	return st >= 400 && !markedUnknown(resp) && !g.kind.ambiguous(&g.p.cfg, st)
}

// markedUnknown reports whether an upstream's answer carries the
// outcome-unknown marker: an ssegate behind (or anything that speaks its
// marker) says the request went on from it and its outcome is unknown.
func markedUnknown(resp *fasthttp.Response) bool {
	return bytes.EqualFold(bytes.TrimSpace(resp.Header.Peek(outcomeHeader)), []byte("unknown"))
}

// logsInfo reports whether info lines are logged: a line's attributes,
// boxed into its arguments, cost allocations even when it is not.
func (g *gen) logsInfo() bool { return g.p.log.Enabled(context.Background(), slog.LevelInfo) }

// errCancelled is call's answer when the generation was cut short while
// it waited for the head: the answer is dropped unread, and the attempt
// is not retried (the cause ends the flight).
var errCancelled = errors.New("the generation was cut short")

// mark records the key's state and logs the change.
func (g *gen) mark(state cache.State, attempt, status int) {
	f := g.f
	f.Mark(state, attempt, status)
	if f.Gen != 0 && g.logsInfo() {
		g.p.log.Info("state", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "generation", f.Gen,
			"attempt", attempt, "state", state, "upstream_status", status)
	}
}

// launch runs the generation on a goroutine of its own (a worker's) and
// lets it go first: it sends the upstream call before the request's goroutine goes
// on to take the client's connection over, which is not on the way to the
// first event (the upstream's answer is), so that the upstream's time to
// answer begins a scheduling delay earlier (about 15 µs here).
func (g *gen) launch(tmpl *fasthttp.Request) {
	g.p.work.run(func() { g.run(tmpl) })
	runtime.Gosched()
}

// runsInHandler reports whether g runs on its request's own goroutine
// (the handler's) rather than a worker's: a keyed generation of a
// request that is not a stream's, whose answer that goroutine waits for
// anyway (answerInHandler), when the store never ends a flight itself.
// Its client sees the same answer at the same time: a whole answer is
// written once the generation is over either way, and it is recorded
// whole, within -max-stream-bytes and -max-live-bytes, either way. What
// it saves is the hand-off to the worker and back (docs/design.md, A
// request's own cost). An upstream that answers an event stream to such
// a request is relayed once that stream ended, rather than as it comes.
// A store that can end a flight (Redis, a lease it lost) needs its
// handler free to answer then (attach), so its generations run on a
// worker; a stream's always do, its client being written as they go.
func (g *gen) runsInHandler() bool {
	return g.o.known != nil && g.f.Gen != 0 && !g.p.storeEnds
}

// run is the generation's goroutine, for every kind of call: call the
// upstream, retrying where upstream.Verdict and the kind say it is safe and only
// before any event was journaled, then record the answer into the flight
// until it ends. When every attempt for the request's model failed in a
// way that says the model could not answer (causeRow.fallback), the next
// model of its -fallback rule is tried the same way.
func (g *gen) run(tmpl *fasthttp.Request) {
	rawPassed := false
	defer func() {
		fasthttp.ReleaseRequest(tmpl)
		if rawPassed {
			// Last, once the run's end is counted (runEnded): the
			// origin relays the body on this goroutine, and ends the
			// generation with it.
			g.passRaw()
			return
		}
		rest := g.o.advance() // the end of the answer, to the client the generation writes
		g.finish()
		if rest {
			// An answer that is not a stream, written whole once the
			// generation is over, on its goroutine rather than a new one.
			g.o.answerRest()
		}
	}()
	p, f := g.p, g.f
	p.budget.Request(g.start)
	models := []string{""}
	if g.kind.model {
		g.ai = p.m.genAI.op(tmpl.URI().Path(), g.req.Model)
		models = g.models(tmpl.Body())
	}
	calls := 0 // upstream calls made, over every model
	defer func() { p.hooks.runEnded(g, calls) }()
	var tried []cache.Fallback
	var given attempt // the last attempt of the model given up on
	for i, model := range models {
		req := tmpl
		if i > 0 {
			req = withModel(tmpl, model)
			defer fasthttp.ReleaseRequest(req)
		}
		if model != "" {
			f.SetModel(model, tried)
		}
		g.model, g.fellBack = model, i > 0
		more := i+1 < len(models)
		t := g.attempts(req, model, more, calls)
		calls = t.calls
		switch t.end {
		case passedRaw:
			rawPassed = true
			return
		case settled:
			return
		}
		if t.end == failedAll && more && g.fallBack(t.last, model, models[i+1], calls) {
			tried = append(tried, cache.Fallback{Model: model, Reason: t.last.reason()})
			given = t.last
			p.hooks.fallback(g, t.last, models[i+1])
			continue
		}
		if t.prev.head.Status == 0 {
			t.prev = given // relay the given-up model's answer rather than a failure to reach the next
		}
		g.giveUp(t)
		return
	}
}

// pause waits d, or until the generation is cut short (g.stop); it
// reports whether all of d passed.
func (g *gen) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-g.stop:
		return false
	}
}

// passRaw gives the origin the upstream's answer to a request without a
// key that is not an event stream, to relay as it comes (origin.answerRaw),
// with the end of the generation.
func (g *gen) passRaw() {
	g.mu.Lock()
	resp := g.resp
	g.resp = nil
	g.mu.Unlock()
	g.o.answerRaw(resp)
}

// giveUp ends the flight after the last attempts (t.last, and t.prev
// before it) brought no answer worth recording as a result.
func (g *gen) giveUp(t tries) {
	f, a := g.f, t.last
	if a.head.Status == 0 && t.prev.head.Status != 0 && a.verdict() != upstream.Ambiguous && !g.mayRun {
		// Relay the upstream's own last answer rather than a connect
		// error; not after a call that may have run (its answer said
		// "not run", a later call's outcome is unknown).
		a = t.prev
	}
	g.p.hooks.gaveUp(g, t.last) // the last call, not a: an earlier one relayed was heard of when it was retried
	if a.held != nil && !g.mayRun {
		// The upstream's error inside its stream, before any output: the
		// stream as it came, the error included. Not after an attempt
		// that may have run: a 200 stream's head goes out before its end
		// could carry the outcome-unknown marker, so that end is the
		// marked error answer instead.
		f.Mark(cache.StateExecutionStarted, t.calls, a.held.head.Status)
		g.heldFailed = true // its tokens are counted: conclude does not again
		a.held.relayFailure()
		return
	}
	f.Mark(cache.StateExecutionStarted, t.calls, a.head.Status) // the count and the last status; fail records the state
	if a.head.Status != 0 {
		f.SetHead(a.head)
	}
	g.fail(a.cause, a.head.Status, a.body)
}

// commit ends the flight with its whole answer (body: a non-streaming
// one's), and logs the end. With fail, it is the only way a generation's
// flight ends (TestOneWayToEnd), as singleflight's doCall is the only
// way a call ends.
func (g *gen) commit(body []byte) {
	g.skipped(g.f.Commit(body))
	g.p.hooks.ended(g, "", false)
	g.logEnd()
}

// fail ends the flight without a result, for c (with the upstream's
// status and body when c is its error answer), as failState says; a
// credential the upstream refused is denied (Flight.Deny). It counts the
// ends whose outcome is unknown, and logs the end.
func (g *gen) fail(c cause, status int, body []byte) {
	f := g.f
	state := g.failState(c)
	var ended bool
	if c == causeUpstreamRefused && state == cache.StateFailedTerminal && (status == fasthttp.StatusUnauthorized || status == fasthttp.StatusForbidden) {
		// The credential was refused: nothing was generated, and the key
		// holds no place in the ledger past this answer.
		ended = f.Deny(c.reason(status), body)
	} else {
		ended = f.Fail(state, c.reason(status), body)
	}
	g.p.hooks.ended(g, errorType(c, status), ended && state == cache.StateCommitUnknown)
	g.logEnd()
}

// failState is the state a failed end for c leaves. Before the answer
// started (no head in the flight) it is c's own; after it, an aborted
// answer is no result and leaves failed_retryable (docs/design.md,
// Abort), unless it is the upstream's own error answer. Once an attempt
// may have left the request running upstream (mayRun: an ambiguous one,
// repeated under -retry-ambiguous) it is commit_unknown, whatever came
// after: that attempt's outcome is still unknown. A stop by the tenant
// leaves cancelled, whatever came before.
func (g *gen) failState(c cause) cache.State {
	if c == causeCancelled {
		return cache.StateCancelled // whatever came before: the tenant's word
	}
	if s, ok := g.kind.failed(c); ok {
		return s
	}
	if g.mayRun {
		return cache.StateCommitUnknown
	}
	if _, started := g.f.Head(); started && !causes[c].byStatus {
		return cache.StateFailedRetryable
	}
	return causes[c].state
}

// logEnd logs the flight's end: its state line.
func (g *gen) logEnd() {
	f := g.f
	if f.Gen == 0 || !g.logsInfo() {
		return // unkeyed: nothing was decided
	}
	state, reason, _ := f.Outcome()
	h, _ := f.Head()
	attrs := []any{"key", f.Scope.Key, "tenant", f.Scope.Tenant, "generation", f.Gen,
		"state", state, "reason", reason, "upstream_status", h.Status, "events", f.Events(),
		"duration_ms", time.Since(g.start).Milliseconds()}
	if t := f.FirstEventAt(); !t.IsZero() {
		attrs = append(attrs, "first_event_ms", t.Sub(g.start).Milliseconds())
	}
	g.p.log.Info("generation ended", attrs...)
}

// notStored counts and logs an answer relayed whole as the upstream sent
// it and not stored, because it is not proven whole or is the provider's
// failure (c: causeErrorBody, or a cause whose row has relayEnd).
func (g *gen) notStored(c cause) {
	f := g.f
	if f.Gen == 0 {
		g.p.hooks.notStored("no_key")
		return
	}
	g.p.hooks.notStored(c.String())
	g.p.log.Info("answer not stored", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "generation", f.Gen, "reason", c.String())
}

// skipped counts a completed answer that is not stored.
func (g *gen) skipped(stored bool) {
	switch {
	case g.f.Gen == 0:
		g.p.hooks.notStored("no_key")
	case !stored:
		g.p.hooks.notStored("store_refused")
		if f := g.f; f.Unstored() {
			state, reason, _ := f.Outcome()
			// The answer came whole and went to its clients; the store
			// refused its commit, so a repeat of the key will not find it.
			g.p.log.Warn("whole answer not stored: its commit was refused", "key", f.Scope.Key, "tenant", f.Scope.Tenant,
				"generation", f.Gen, "state", state, "reason", reason, "events", f.Events())
		}
	}
}

// attempt is what one call to the upstream came to.
type attempt struct {
	// settled: the answer went into the flight, which ended with it;
	// nothing else is set.
	settled bool
	// raw: the answer to a request without a key is not an event stream,
	// and goes to the origin as it is (passRaw), error or not.
	raw        bool
	cause      cause      // why it brought no answer to record
	head       cache.Head // set when the upstream answered with a head worth relaying
	body       []byte     // an error answer's body, to relay if it is the last
	retryAfter time.Duration
	// fallbackCode is the error code of a 400 that -fallback-on-code
	// names (context_length_exceeded): another model may take it.
	fallbackCode string
	// marked: the upstream's error answer carries the outcome-unknown
	// marker (an ssegate behind, whose key is now commit_unknown and free:
	// a repeat would be a new generation there). Never repeated, never
	// fallen back from, -retry-ambiguous or not.
	marked bool
	// exhausted: the upstream said the model will not answer this
	// credential again soon (insufficient_quota in its stream): never
	// repeated on the model, but another model may take it.
	exhausted bool
	// held: a stream's events up to the upstream's error, before any
	// output; relayed as they came should the attempt be the last.
	held *preamble
	// usage, when used, is what the upstream reported of its tokens
	// before the attempt failed (ssegate_tokens_lost_total).
	usage cache.Usage
	used  bool
	// ambiguousStatus: the upstream's error status is one of
	// -ambiguous-status (504 by default: a gateway timed out, and the
	// request may be running behind it). Ambiguous: repeated only to an
	// upstream -retry-ambiguous names.
	ambiguousStatus bool
}

// unknown reports whether the attempt may have left the request running
// or run upstream: its cause leaves commit_unknown, or the upstream's
// answer said its outcome is unknown.
func (a attempt) unknown() bool {
	return causes[a.cause].state == cache.StateCommitUnknown || a.marked || a.ambiguousStatus
}

// reason names what the attempt came to, for logs, metrics and the
// ledger's fallbacks.
func (a attempt) reason() string {
	if a.fallbackCode != "" {
		return a.fallbackCode
	}
	return a.cause.reason(a.head.Status)
}

// verdict says whether the attempt may be made again (upstream.Verdict): by the
// upstream's status for its own answers, by the cause's row otherwise.
func (a attempt) verdict() upstream.Verdict {
	switch {
	case a.cause != causeNone && !causes[a.cause].byStatus:
		return causes[a.cause].verdict
	case a.marked, a.exhausted:
		return upstream.Final
	case a.ambiguousStatus:
		return upstream.Ambiguous
	}
	return upstream.StatusVerdict(a.head.Status)
}
