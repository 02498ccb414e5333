package proxy

import (
	"bytes"
	"errors"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// gen is one request's upstream work feeding one Flight: the attempts,
// then the answer's body. Its goroutine owns resp; cancel may be called
// from any goroutine, the generation's own included, and interrupts a
// blocked read by closing the upstream connection under it, or a backoff
// by closing stop.
type gen struct {
	p   *Proxy
	f   *cache.Flight
	o   *origin     // the client whose request started it
	req sse.Request // what the proxy reads of the request body (stream, n, include_usage, model)
	// relayRaw, for a request without a key: a final answer that is not an
	// event stream goes to the origin as it is (origin.answerRaw), which
	// relays it as it comes and calls finish.
	relayRaw bool

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
}

func (p *Proxy) newGen(f *cache.Flight, req sse.Request) *gen {
	g := &gen{p: p, f: f, req: req, stop: make(chan struct{}), start: time.Now()}
	g.o = &origin{p: p, g: g, f: f}
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
		interrupt(g.resp)
	}
}

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
		if c := connOf(resp); c != nil {
			c.beforeRead = nil // set by relayBody: the connection may serve another generation next
			if c.interrupted.Load() {
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
func (g *gen) call(up *upstream, req *fasthttp.Request) (*fasthttp.Response, error) {
	resp := fasthttp.AcquireResponse()
	err := up.do(req, resp, g.req.Stream)
	fasthttp.ReleaseRequest(req)
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		return nil, err
	}
	g.mu.Lock()
	g.resp = resp
	cut := g.cause
	g.mu.Unlock()
	if cut != causeNone {
		// Cancelled while waiting: nothing of the answer is read. Unless
		// its head says the upstream did not run the request, it may
		// have: the flight's end is commit_unknown (gen.fail).
		if !g.p.saidNotRun(resp) {
			g.mayRun = true
		}
		g.drop()
		return nil, errCancelled
	}
	return resp, nil
}

// saidNotRun reports whether an upstream's answer says the request did not
// run: an error status that neither carries the outcome-unknown marker
// nor is one of -ambiguous-status.
func (p *Proxy) saidNotRun(resp *fasthttp.Response) bool {
	st := resp.StatusCode()
	return st >= 400 && !markedUnknown(resp) && !slices.Contains(p.cfg.AmbiguousStatus, st)
}

// markedUnknown reports whether an upstream's answer carries the
// outcome-unknown marker: an ssegate behind (or anything that speaks its
// marker) says the request went on from it and its outcome is unknown.
func markedUnknown(resp *fasthttp.Response) bool {
	return bytes.EqualFold(bytes.TrimSpace(resp.Header.Peek(outcomeHeader)), []byte("unknown"))
}

// errCancelled is call's answer when the generation was cut short while
// it waited for the head: the answer is dropped unread, and the attempt
// is not retried (the cause ends the flight).
var errCancelled = errors.New("the generation was cut short")

// mark records the key's state and logs the change.
func (g *gen) mark(state cache.State, attempt, status int) {
	f := g.f
	f.Mark(state, attempt, status)
	if f.Gen != 0 {
		g.p.log.Info("state", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "generation", f.Gen,
			"attempt", attempt, "state", state, "upstream_status", status)
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

// verdict says whether the attempt may be made again (retry.go): by the
// upstream's status for its own answers, by the cause's row otherwise.
func (a attempt) verdict() verdict {
	switch a.cause {
	case causeNone, causeUpstreamRefused, causeUpstreamFailed:
		switch {
		case a.marked:
			return final
		case a.ambiguousStatus:
			return ambiguous
		}
		return statusVerdict(a.head.Status)
	}
	return causes[a.cause].verdict
}

// launch runs the generation on a goroutine of its own and lets it go
// first: it sends the upstream call before the request's goroutine goes
// on to take the client's connection over, which is not on the way to the
// first event (the upstream's answer is), so that the upstream's time to
// answer begins a scheduling delay earlier (about 15 µs here).
func (g *gen) launch(tmpl *fasthttp.Request) {
	go g.run(tmpl)
	runtime.Gosched()
}

// run is the generation's goroutine: call the upstream, retrying where
// retry.go says it is safe and only before any event was journaled, then
// record the answer into the flight until it ends. When every attempt for
// the request's model failed in a way that says the model could not
// answer (causeRow.fallback), the next model of its -fallback rule is
// tried the same way.
func (g *gen) run(tmpl *fasthttp.Request) {
	rawPassed := false
	defer func() {
		fasthttp.ReleaseRequest(tmpl)
		if !rawPassed {
			g.o.push() // the end of the answer, to the client the generation writes
			g.finish()
		}
	}()
	p, f := g.p, g.f
	p.budget.request(g.start)
	models := g.models(tmpl.Body())
	calls := 0 // upstream calls made, over every model
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
			continue
		}
		if t.prev.head.Status == 0 {
			t.prev = given // relay the given-up model's answer rather than a failure to reach the next
		}
		g.giveUp(calls, t.last, t.prev)
		return
	}
}

// tries is what one model's attempts came to.
type tries struct {
	end   attemptsEnd
	last  attempt // when they all failed: the last attempt
	prev  attempt // and the one before it
	calls int     // the upstream calls made so far, over every model
}

// How a model's attempts ended.
type attemptsEnd uint8

const (
	failedAll  attemptsEnd = iota // last and prev say how the last attempts failed
	mayHaveRun                    // as failedAll, after an ambiguous failure was repeated (-retry-ambiguous): the model may have run the request
	settled                       // the flight has its answer (or its cut), and ended with it
	passedRaw                     // the answer went to the origin as it is (passRaw)
)

// attempts makes the attempts for one model, through its circuits, after
// calls calls for the models before it, and says how they ended. more
// says that another model may follow, so that a 400 that names a
// -fallback-on-code is not recorded as the answer.
func (g *gen) attempts(tmpl *fasthttp.Request, model string, more bool, calls int) tries {
	p := g.p
	jitter := newFullJitter(p.cfg.Retry.BaseBackoff, p.cfg.Retry.MaxBackoff)
	rt := route{model: modelKey(model)}
	t := tries{calls: calls}
	for n := 1; ; n++ {
		if c := g.cutShort(); c != causeNone {
			g.fail(c, 0, nil)
			t.end = settled
			return t
		}
		select {
		case <-g.f.Done():
			// The store ended the flight meanwhile (fenced, or
			// unreachable for a lease): no call is made for it.
			t.end = settled
			return t
		default:
		}
		up, idx, done, ok := rt.pick(p.ups)
		if !ok {
			t.last, t.end = attempt{cause: causeUpstreamUnavailable}, rt.failedEnd()
			return t
		}
		t.calls++
		g.mark(cache.StateExecutionStarted, t.calls, t.prev.head.Status)
		a := g.try(up, tmpl, done, more)
		if a.unknown() {
			g.mayRun = true
		}
		switch {
		case a.settled:
			p.m.attemptsPerOK.Observe(float64(t.calls))
			t.end = settled
			return t
		case a.raw:
			g.passRaw()
			t.end = passedRaw
			return t
		}
		g.drop()
		wait := max(jitter.next(), a.retryAfter)
		if !g.retry(n, a, up, wait) {
			t.last, t.end = a, rt.failedEnd()
			return t
		}
		t.prev = a
		rt.failed(a, up, idx)
		g.pause(wait) // a cut is seen at the loop's top
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

// route is the failover of one generation's attempts over the upstreams,
// through the circuits of its model.
type route struct {
	model  string
	next   int       // the upstream to try first
	pinned *upstream // after an ambiguous failure: the one upstream that may see the request again
}

// pick returns the upstream of the next attempt; ok is false when every
// one has its circuit open, or the pinned one has.
func (rt *route) pick(ups []*upstream) (up *upstream, idx int, done func(error), ok bool) {
	up, idx, done, ok = pick(ups, rt.next, rt.model)
	if ok && rt.pinned != nil && up != rt.pinned {
		// The pinned upstream's circuit is open. Another upstream cannot
		// deduplicate against the call that may be running.
		done(errNotCalled)
		return nil, 0, nil, false
	}
	return up, idx, done, ok
}

// failedEnd is how a model's attempts ended when they all failed: after
// an ambiguous one (the route is pinned to its upstream), the model may
// have run the request, whatever the later ones came to.
func (rt *route) failedEnd() attemptsEnd {
	if rt.pinned != nil {
		return mayHaveRun
	}
	return failedAll
}

// failed moves the route on after attempt a on up (ups[idx]) failed and
// is to be made again: to the next upstream, unless the upstream may be
// running the request (-retry-ambiguous), now or since an earlier attempt:
// only it can tell the repeat apart, so it gets every repeat.
func (rt *route) failed(a attempt, up *upstream, idx int) {
	if a.verdict() == ambiguous {
		rt.pinned = up
	}
	rt.next = idx + 1
	if rt.pinned != nil {
		rt.next = idx
	}
}

// retry decides whether attempt n, which failed as a says on up, is made
// again after wait: only when its verdict allows it (an ambiguous failure
// only for an upstream known to deduplicate on the key, -retry-ambiguous,
// so only with one), within -retry-attempts, Retry-After's bound,
// -retry-max-elapsed and the retry budget. It counts and logs the
// decision.
func (g *gen) retry(n int, a attempt, up *upstream, wait time.Duration) bool {
	p, f, rc := g.p, g.f, &g.p.cfg.Retry
	v := a.verdict()
	if v != safe && !(v == ambiguous && f.Gen != 0 && up.retryAmbiguous) {
		return false
	}
	why := ""
	switch {
	case n >= rc.Attempts:
		why = "attempts"
	case a.retryAfter > rc.RetryAfterMax:
		why = "retry_after_too_long"
	case time.Since(g.start)+wait > rc.MaxElapsed:
		why = "max_elapsed"
	case !p.budget.retry(time.Now()):
		why = "budget"
		p.m.budgetRefused.Inc()
	}
	reason := a.cause.reason(a.head.Status)
	if why != "" {
		p.m.noRetry.WithLabelValues(why).Inc()
		p.log.Warn("no retry", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "attempt", n,
			"reason", reason, "why", why, "upstream", up.name)
		return false
	}
	p.m.retries.WithLabelValues(reason).Inc()
	p.log.Info("retry", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "attempt", n, "reason", reason,
		"upstream", up.name, "backoff", wait.String())
	return true
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

// try makes one attempt on up: the call, then what its answer's head says
// to do with the answer.
func (g *gen) try(up *upstream, tmpl *fasthttp.Request, done func(error), more bool) attempt {
	sent := time.Now()
	resp, err := g.call(up, up.prepare(tmpl))
	if err != nil {
		return g.callFailed(err, done)
	}
	head := copyHead(resp)
	g.p.m.attempts.WithLabelValues(statusClass(head.Status)).Inc()
	done(health(head.Status, more))
	a := attempt{head: head}
	if head.Status >= 400 {
		a.cause = upstreamStatus(head.Status)
		a.marked = markedUnknown(resp)
		a.ambiguousStatus = !a.marked && slices.Contains(g.p.cfg.AmbiguousStatus, head.Status)
	}
	switch {
	case head.Status == fasthttp.StatusBadRequest && more && !head.Stream:
		body, err := readBody(resp, g.p.cfg.MaxStreamBytes)
		if code := errorCode(body); err == nil && slices.Contains(g.p.cfg.FallbackOnCodes, code) {
			return attempt{cause: causeUpstreamRefused, head: head, body: body, fallbackCode: code}
		}
		g.settle(resp, head, body, err)
		return attempt{settled: true}
	case a.verdict() == safe || a.marked || a.ambiguousStatus:
		// An answer that may be repeated, or one whose outcome is
		// unknown: the attempts decide, and the last is relayed (giveUp).
		a.retryAfter = retryAfter(resp.Header.Peek("Retry-After"), time.Now())
		a.body, _ = readBody(resp, 64<<10)
		return a
	case head.Stream:
		if c, settled := g.pump(resp, head, sent, g.healer(up, tmpl)); !settled {
			// No valid first event: an error event (the upstream said it
			// failed: safe to repeat), or a body that ended or broke
			// without one (the upstream took the request and may be
			// generating: ambiguous).
			return attempt{cause: c}
		}
		return attempt{settled: true}
	case g.relayRaw:
		a.raw, a.cause = true, causeNone
		return a
	case g.req.Stream && head.Status < 300 && !isJSON(head.ContentType):
		// A stream was asked for, and a 2xx came that is neither one nor
		// a JSON answer (a proxy's HTML page, say): no valid first event.
		// The upstream took the request; what became of it is not known.
		// (A JSON answer, from an upstream that does not stream, is
		// recorded like any other: framing decides.)
		return attempt{cause: causeNotAnEventStream}
	}
	g.record(resp, head)
	return attempt{settled: true}
}

// callFailed is the attempt of a call that brought no answer: it failed
// with err, or the generation was cut short while it waited.
func (g *gen) callFailed(err error, done func(error)) attempt {
	if errors.Is(err, errCancelled) {
		done(nil) // the upstream answered; whether well is not known
		return attempt{cause: g.cutShort()}
	}
	done(err)
	a := attempt{cause: causeUpstreamReset}
	switch {
	case isDial(err):
		a.cause = causeConnectError
	case isStale(err):
		a.cause = causeStaleConnection
	case isTimeout(err):
		a.cause = causeUpstreamTimeout
	}
	g.p.m.attempts.WithLabelValues(a.cause.String()).Inc()
	if cut := g.cutShort(); cut != causeNone {
		// Cut short while it waited (Abort closed its connection): the
		// cut ends the flight, commit_unknown when the request may have
		// gone out.
		if a.unknown() {
			g.mayRun = true
		}
		return attempt{cause: cut}
	}
	return a
}

// health is what an upstream's answer with status tells its circuits: a
// 5xx is a failure, and so is a 429 to a model that has a fallback, so
// that a rate-limited model is skipped while its circuit is open rather
// than tried on every request; any other 4xx, and 429, is an answer, not
// an outage.
func health(status int, more bool) error {
	if status >= 500 || (status == fasthttp.StatusTooManyRequests && more) {
		return errUpstreamStatus
	}
	return nil
}

var errUpstreamStatus = errors.New("upstream answered 5xx")

// giveUp ends the flight after the last attempt a (and the one before it,
// prev) brought no answer worth recording as a result.
func (g *gen) giveUp(attempts int, a, prev attempt) {
	f := g.f
	if a.head.Status == 0 && prev.head.Status != 0 && a.verdict() != ambiguous && !g.mayRun {
		// Relay the upstream's own last answer rather than a connect
		// error; not after a call that may have run (its answer said
		// "not run", a later call's outcome is unknown).
		a = prev
	}
	f.Mark(cache.StateExecutionStarted, attempts, a.head.Status) // the count and the last status; fail records the state
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
	if state == cache.StateFailedTerminal && (status == fasthttp.StatusUnauthorized || status == fasthttp.StatusForbidden) {
		// The credential was refused: nothing was generated, and the key
		// holds no place in the ledger past this answer.
		ended = f.Deny(c.reason(status), body)
	} else {
		ended = f.Fail(state, c.reason(status), body)
	}
	if ended && state == cache.StateCommitUnknown {
		g.p.m.commitUnknowns.Inc()
	}
	g.logEnd()
}

// failState is the state a failed end for c leaves. Before the answer
// started (no head in the flight) it is c's own; after it, an aborted
// answer is no result and leaves failed_retryable (docs/design.md,
// Abort), unless it is the upstream's own error answer. Once an attempt
// may have left the request running upstream (mayRun: an ambiguous one,
// repeated under -retry-ambiguous) it is commit_unknown, whatever came
// after: that attempt's outcome is still unknown.
func (g *gen) failState(c cause) cache.State {
	if g.mayRun {
		return cache.StateCommitUnknown
	}
	if _, started := g.f.Head(); started && c != causeUpstreamRefused && c != causeUpstreamFailed {
		return cache.StateFailedRetryable
	}
	return causes[c].state
}

// logEnd logs the flight's end: its state line.
func (g *gen) logEnd() {
	f := g.f
	if f.Gen == 0 {
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
		g.p.m.cacheSkipped.WithLabelValues("no_key").Inc()
		return
	}
	g.p.m.cacheSkipped.WithLabelValues(c.String()).Inc()
	g.p.log.Info("answer not stored", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "generation", f.Gen, "reason", c.String())
}

// skipped counts a completed answer that is not stored.
func (g *gen) skipped(stored bool) {
	switch {
	case g.f.Gen == 0:
		g.p.m.cacheSkipped.WithLabelValues("no_key").Inc()
	case !stored:
		g.p.m.cacheSkipped.WithLabelValues("store_refused").Inc()
		if f := g.f; f.Unstored() {
			state, reason, _ := f.Outcome()
			// The answer came whole and went to its clients; the store
			// refused its commit, so a repeat of the key will not find it.
			g.p.log.Warn("whole answer not stored: its commit was refused", "key", f.Scope.Key, "tenant", f.Scope.Tenant,
				"generation", f.Gen, "state", state, "reason", reason, "events", f.Events())
		}
	}
}

// statusClass is the outcome label of an upstream answer.
func statusClass(status int) string {
	switch {
	case status == fasthttp.StatusTooManyRequests:
		return "status_429"
	case status >= 500:
		return "status_5xx"
	case status >= 400:
		return "status_4xx"
	}
	return "ok"
}
