package proxy

import (
	"errors"
	"time"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/ssegate/ssegate/sse"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// runTool is the goroutine of a keyed tool call: it sends the call to the
// MCP server and records its answer into the flight, whatever becomes of
// the callers. It is tried again only where the server certainly did not
// receive it (a connect error, a pooled connection found closed before
// writing, 429 or 503); once it may have run, no answer but the server's
// response to it ends the flight otherwise than commit_unknown.
func (g *gen) runTool(tmpl *fasthttp.Request, id []byte) {
	defer func() {
		fasthttp.ReleaseRequest(tmpl)
		g.finish()
	}()
	p := g.p
	p.budget.Request(g.start)
	jitter := upstream.NewFullJitter(p.cfg.Retry.BaseBackoff, p.cfg.Retry.MaxBackoff)
	next := 0 // the upstream to try first: the one after one that failed
	for n := 1; ; n++ {
		if c := g.cutShort(); c != causeNone {
			g.toolEnd(n-1, g.toolState(cache.StateFailedRetryable), c, 0, nil)
			return
		}
		up, idx, done, ok := upstream.Pick(p.ups, next, "")
		if !ok {
			g.toolEnd(n-1, cache.StateFailedRetryable, causeUpstreamUnavailable, 0, nil)
			return
		}
		g.mark(cache.StateExecutionStarted, n, 0)
		resp, err := g.call(up, up.Prepare(tmpl))
		if err != nil {
			// Cut short once the head came (errCancelled), the server had
			// the call, whatever its head said by the LLM rules
			// (saidNotRun): a tool call is sent again only on 429 or 503.
			cancelled := errors.Is(err, errCancelled)
			a := g.callFailed(err, done)
			if cancelled || a.unknown() {
				g.mayRun = true
			}
			next = idx + 1
			unsent := a.cause == causeConnectError || a.cause == causeStaleConnection
			if unsent && n < p.cfg.Retry.Attempts && g.toolRetry(n, a.cause.String(), jitter.Next()) {
				continue
			}
			g.toolEnd(n, g.toolState(cache.StateFailedRetryable), a.cause, 0, nil)
			return
		}
		head := copyHead(resp)
		st := head.Status
		done(health(st, false))
		p.m.attempts.WithLabelValues(statusClass(st)).Inc()
		sc, unknown := upstreamStatus(st), markedUnknown(resp)
		switch {
		case (st == fasthttp.StatusTooManyRequests || st == fasthttp.StatusServiceUnavailable) && !unknown:
			// The server said it did not take the call.
			body, _ := readBody(resp, 64<<10)
			wait := max(jitter.Next(), min(upstream.RetryAfter(resp.Header.Peek("Retry-After"), time.Now()), p.cfg.Retry.RetryAfterMax))
			g.drop()
			next = idx + 1
			if n < p.cfg.Retry.Attempts && g.toolRetry(n, sc.reason(st), wait) {
				continue
			}
			g.f.SetHead(head)
			g.toolEnd(n, cache.StateFailedRetryable, sc, st, body)
		case st >= 400 && st < 500 && !unknown:
			// Refused (a session the server does not know, a request it
			// cannot read): relayed as it came.
			body, _ := readBody(resp, 64<<10)
			g.f.SetHead(head)
			g.toolEnd(n, cache.StateFailedTerminal, sc, st, body)
		case st < 200 || st >= 300 || unknown:
			// A 5xx, or an answer marked unknown (a chained ssegate's,
			// whatever its status): the server may have run the tool.
			g.mayRun = true
			g.toolEnd(n, cache.StateCommitUnknown, sc, st, nil)
		case head.Stream:
			g.mayRun = true
			g.f.SetHead(head)
			g.toolStream(n, resp, id)
		default:
			g.mayRun = true
			g.toolWhole(n, resp, head, id)
		}
		return
	}
}

// toolRetry waits d before attempt n+1, unless the retry budget is spent
// or the call is cut short meanwhile; it reports whether to go on.
func (g *gen) toolRetry(n int, reason string, d time.Duration) bool {
	p := g.p
	if !p.budget.Retry(time.Now()) {
		return false
	}
	p.m.retries.WithLabelValues(reason).Inc()
	p.log.Info("retry", "key", g.f.Scope.Key, "tenant", g.f.Scope.Tenant, "attempt", n, "reason", reason, "backoff", d.String())
	return g.pause(d)
}

// toolState is the state of a failed end whose own is s: commit_unknown
// once the call may have run.
func (g *gen) toolState(s cache.State) cache.State {
	if g.mayRun {
		return cache.StateCommitUnknown
	}
	return s
}

// toolWhole records a JSON answer: a response with a result commits (an
// isError result too: the tool ran), an error is relayed and not stored,
// and anything else leaves the outcome unknown.
func (g *gen) toolWhole(n int, resp *fasthttp.Response, head cache.Head, id []byte) {
	body, err := readBody(resp, g.p.cfg.MaxStreamBytes)
	g.f.SetHead(head)
	switch {
	case err != nil:
		g.toolEnd(n, cache.StateCommitUnknown, g.readCause(err), 0, nil)
	case !wholeBody(resp, head, body):
		// Ended where the connection closed, and not JSON: it may have
		// been cut anywhere, a result included.
		g.toolEnd(n, cache.StateCommitUnknown, causeUnframedBody, 0, nil)
	case !sameID(gjson.GetBytes(body, "id"), id):
		g.toolEnd(n, cache.StateCommitUnknown, causeNotAnEventStream, 0, nil)
	case gjson.GetBytes(body, "result").Exists():
		g.toolCommitted(n, body)
	case gjson.GetBytes(body, "error").Exists():
		g.toolEnd(n, cache.StateFailedTerminal, causeErrorBody, 0, body)
	default:
		g.toolEnd(n, cache.StateCommitUnknown, causeNotAnEventStream, 0, nil)
	}
}

// toolStream records an SSE answer, each event as it comes, until the
// response to the call: a result commits, an error is relayed and not
// stored; a stream that ends before it leaves the outcome unknown.
func (g *gen) toolStream(n int, resp *fasthttp.Response, id []byte) {
	f := g.f
	defer g.boundDuration()()
	// Read in place, as pump reads: ev is the scanner's until the next
	// event, and Append copies it.
	sc := sse.NewScanner(bodyOf(resp), g.p.cfg.MaxEventBytes)
	for sc.Next() {
		ev := sc.Event()
		if _, err := f.Append(ev.Type, ev.Data); err != nil {
			g.toolEnd(n, cache.StateCommitUnknown, appendFailure(f, err), 0, nil)
			return
		}
		if gjson.Get(ev.Data, "method").Exists() || !sameID(gjson.Get(ev.Data, "id"), id) {
			continue // a notification or a request of the server's
		}
		if gjson.Get(ev.Data, "result").Exists() {
			if c := upstream.ConnOf(resp); c != nil {
				c.DrainBy(time.Now().Add(time.Second)) // the server ends the stream after its response
			}
			g.toolCommitted(n, nil)
			return
		}
		g.toolEnd(n, cache.StateFailedTerminal, causeErrorEvent, 0, nil)
		return
	}
	if err := sc.Err(); err != nil {
		g.toolEnd(n, cache.StateCommitUnknown, g.readCause(err), 0, nil)
		return
	}
	g.toolEnd(n, cache.StateCommitUnknown, causeNoTerminalEvent, 0, nil)
}

// readCause is the cause of a read of the answer that failed with err:
// the cut that interrupted it (a DELETE, a shutdown, -max-stream-duration),
// or the read's own failure.
func (g *gen) readCause(err error) cause {
	if c := g.cutShort(); c != causeNone {
		return c
	}
	return readFailure(err)
}

// sameID reports whether a message's id r is the call's id, as JSON
// values (sameRPCID): a server may write it back in another spelling.
func sameID(r gjson.Result, id []byte) bool {
	return r.Exists() && sameRPCID(r.Raw, string(id))
}

// toolCommitted ends the flight with the call's result, after n calls.
func (g *gen) toolCommitted(n int, body []byte) {
	g.f.Mark(cache.StateExecutionStarted, n, 0)
	g.p.m.toolAttempts.Observe(float64(n))
	g.commit(body)
}

// toolEnd ends the flight without a result after n calls, in state, for
// c (with the server's status and answer body, relayed to the callers,
// when it has one).
func (g *gen) toolEnd(n int, state cache.State, c cause, status int, body []byte) {
	g.f.Mark(cache.StateExecutionStarted, n, status)
	if n > 0 {
		g.p.m.toolAttempts.Observe(float64(n))
	}
	g.endState = state
	g.fail(c, status, body)
}
