package proxy

import (
	"errors"
	"slices"
	"time"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/valyala/fasthttp"
)

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
	jitter := upstream.NewFullJitter(p.cfg.Retry.BaseBackoff, p.cfg.Retry.MaxBackoff)
	rt := route{model: upstream.ModelKey(model)}
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
		a := g.try(up, tmpl, done, more, t.calls)
		if a.unknown() {
			g.mayRun = true
		}
		switch {
		case a.settled:
			p.hooks.answered(g, t.calls)
			t.end = settled
			return t
		case a.raw:
			p.hooks.passedRaw(g, a.head.Status) // run then hands the answer to the origin (passRaw)
			t.end = passedRaw
			return t
		}
		g.drop()
		if more && rt.pinned == nil && a.verdict() == upstream.Safe && !rt.admits(p.ups) {
			// The failure opened the model's circuits, or was their
			// failed probe: the next model answers now, rather than a
			// retry that would wait to find them shut (or probe again
			// after a Retry-After) and spend the retry budget on it.
			t.last, t.end = a, failedAll
			return t
		}
		wait := max(jitter.Next(), a.retryAfter)
		if !g.retry(n, a, up, wait) {
			t.last, t.end = a, rt.failedEnd()
			return t
		}
		p.hooks.retry(g, a)
		t.prev = a
		rt.failed(a, up, idx)
		g.pause(wait) // a cut is seen at the loop's top
	}
}

// route is the failover of one generation's attempts over the upstreams,
// through the circuits of its model.
type route struct {
	model  string
	next   int                // the upstream to try first
	pinned *upstream.Upstream // after an ambiguous failure: the one upstream that may see the request again
}

// pick returns the upstream of the next attempt; ok is false when every
// one has its circuit open, or the pinned one has.
func (rt *route) pick(ups []*upstream.Upstream) (up *upstream.Upstream, idx int, done func(error), ok bool) {
	up, idx, done, ok = upstream.Pick(ups, rt.next, rt.model)
	if ok && rt.pinned != nil && up != rt.pinned {
		// The pinned upstream's circuit is open. Another upstream cannot
		// deduplicate against the call that may be running.
		done(upstream.ErrNotCalled)
		return nil, 0, nil, false
	}
	return up, idx, done, ok
}

// admits reports whether some upstream's circuits would let a call for
// the route's model through now.
func (rt *route) admits(ups []*upstream.Upstream) bool {
	return slices.ContainsFunc(ups, func(up *upstream.Upstream) bool { return up.Breaker().Admits(rt.model) })
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
func (rt *route) failed(a attempt, up *upstream.Upstream, idx int) {
	if a.verdict() == upstream.Ambiguous {
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
// so only with one, and only for a kind that may be repeated so), within
// -retry-attempts, Retry-After's bound, -retry-max-elapsed and the retry
// budget, for every kind of call alike. It counts and logs the decision.
func (g *gen) retry(n int, a attempt, up *upstream.Upstream, wait time.Duration) bool {
	p, f, rc := g.p, g.f, &g.p.cfg.Retry
	v := a.verdict()
	if g.kind.once {
		return false
	}
	if v != upstream.Safe && !(v == upstream.Ambiguous && f.Gen != 0 && up.RetryAmbiguous() && g.kind.repeatsAmbiguous) {
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
	case !p.budget.Retry(time.Now()):
		why = "budget"
	}
	reason := a.cause.reason(a.head.Status)
	if why != "" {
		p.hooks.retryRefused(why)
		p.log.Warn("no retry", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "attempt", n,
			"reason", reason, "why", why, "upstream", up.Name())
		return false
	}
	p.log.Info("retry", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "attempt", n, "reason", reason,
		"upstream", up.Name(), "backoff", wait.String())
	return true
}

// try makes one attempt on up: the call, then what its answer's head says
// to do with the answer.
func (g *gen) try(up *upstream.Upstream, tmpl *fasthttp.Request, done func(error), more bool, n int) attempt {
	req := up.Prepare(tmpl)
	g.p.hooks.attemptStarted(g, up, req, n)
	sent := time.Now()
	if g.firstSent.IsZero() {
		g.firstSent = sent
	}
	g.lastSent = sent
	resp, err := g.call(up, req)
	if err != nil {
		return g.callFailed(err, done)
	}
	head := copyHead(resp)
	if tmpl.Header.IsHead() {
		// The answer to a HEAD has no body, whatever its Content-Type
		// says: fasthttp read none, and it is relayed as it came.
		head.Stream = false
	}
	g.p.hooks.attemptEnded(g, statusClass(head.Status))
	if !head.Stream {
		done(health(head.Status, more))
	}
	k := g.kind
	a := attempt{head: head}
	ok := head.Status >= 200 && head.Status < 300
	if head.Status >= 400 || (k.ranOnAnswer && (!ok || markedUnknown(resp))) {
		// A tool call's answer marked unknown (a chained ssegate's) is
		// its error answer whatever its status.
		a.cause = upstreamStatus(head.Status)
		a.marked = markedUnknown(resp)
		a.ambiguousStatus = !a.marked && k.ambiguous(&g.p.cfg, head.Status)
	}
	if ok && k.ranOnAnswer {
		g.mayRun = true // the call ran: an end without its answer is commit_unknown
	}
	switch {
	case k.raw:
		a.raw, a.cause = true, causeNone
		return a
	case head.Status == fasthttp.StatusBadRequest && more && !head.Stream:
		body, err := readBody(resp, g.p.cfg.MaxStreamBytes)
		if code := errorCode(body); err == nil && slices.Contains(g.p.cfg.FallbackOnCodes, code) {
			return attempt{cause: causeUpstreamRefused, head: head, body: body, fallbackCode: code}
		}
		g.settle(resp, head, body, err)
		return attempt{settled: true}
	case a.verdict() == upstream.Safe || a.marked || a.ambiguousStatus:
		// An answer that may be repeated, or one whose outcome is
		// unknown: the attempts decide, and the last is relayed (giveUp).
		a.retryAfter = upstream.RetryAfter(resp.Header.Peek("Retry-After"), time.Now())
		a.body, _ = readBody(resp, 64<<10)
		return a
	case head.Stream:
		// Unsettled, nothing reached a client: an error among the
		// preamble's events (the upstream said it failed, classified as
		// the status it stands for), or a body that ended or broke
		// without a first event (the upstream took the request and may
		// be generating: ambiguous).
		// The circuits hear of it once the preamble is over (pump).
		return g.pump(resp, head, sent, g.healer(up, tmpl), more, done)
	case k.model && g.f.Gen == 0:
		// A request without a key: its answer that is not an event
		// stream goes to the client as it is.
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
	a := attempt{cause: causeUpstreamReset}
	switch {
	case upstream.IsDial(err), upstream.IsInterrupted(err):
		a.cause = causeConnectError
	case upstream.IsStale(err):
		a.cause = causeStaleConnection
	case upstream.IsTimeout(err):
		a.cause = causeUpstreamTimeout
	}
	g.p.hooks.attemptEnded(g, a.cause.String())
	if cut := g.cutShort(); cut != causeNone {
		// Cut short while it waited (a stop, Abort or the generation's
		// own bound closed its connection, or kept its request from
		// being written): the cut ends the flight, commit_unknown when
		// the request may have gone out. The circuits do not hear of
		// it: the proxy, not the upstream, ended the call.
		done(upstream.ErrNotCalled)
		if a.unknown() {
			g.mayRun = true
		}
		return attempt{cause: cut}
	}
	done(err)
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
