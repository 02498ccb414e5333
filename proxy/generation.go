package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/tidwall/gjson"
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

	mu       sync.Mutex // guards resp, finished and cause
	resp     *fasthttp.Response
	finished bool
	cause    string        // why the generation was cut short, if it was
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
		g.cancel("shutdown")
	default:
	}
	return g
}

// cancel cuts the generation short; the flight then fails with cause.
func (g *gen) cancel(cause string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.finished || g.cause != "" {
		return
	}
	g.cause = cause
	close(g.stop)
	if g.resp != nil {
		interrupt(g.resp)
	}
}

// interrupt makes a read of resp's body, blocked now or to come, fail at
// once, by closing the connection it is read from. It never closes the
// body stream itself: fasthttp's CloseBodyStream waits for a read in
// progress to let go of the stream's lock, and cancel is also called from
// inside that read (the generation writes its client before each read of
// the socket, and a client that went away cancels an unkeyed
// generation), where it would wait for itself forever. The generation
// closes the body stream once its read returned (drop).
func interrupt(resp *fasthttp.Response) {
	if c := connOf(resp); c != nil {
		c.interrupted.Store(true)
		c.Conn.Close() //nolint:errcheck // interrupting a read
	}
	// Every upstream connection is an idleConn (newUpstream's Dial;
	// TestAnswerConn), so there is no other case to interrupt.
}

func (g *gen) cutShort() string {
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
		if c := connOf(resp); c != nil && c.interrupted.Load() {
			// Closed under a body that may have been read whole: fasthttp
			// would pool it again.
			resp.SetConnectionClose()
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
	cause := g.cause
	g.mu.Unlock()
	if cause != "" {
		g.drop() // cancelled while waiting: nothing of it is read
		return nil, errCancelled
	}
	return resp, nil
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
	verdict    verdict
	reason     string     // snake_case cause, for logs and the flight
	head       cache.Head // set when the upstream answered
	answered   bool       // ambiguous after a 2xx head: an answer, not a stream
	body       []byte     // an error answer's body, to relay if it is the last
	retryAfter time.Duration
}

// run is the generation's goroutine: call the upstream, retrying where
// retry.go says it is safe and only before any event was journaled, then
// record the answer into the flight until it ends.
func (g *gen) run(tmpl *fasthttp.Request) {
	handedOff := false
	defer func() {
		fasthttp.ReleaseRequest(tmpl)
		if !handedOff {
			g.o.push() // the end of the answer, to the client the generation writes
			g.finish()
		}
	}()
	p, f := g.p, g.f
	rc := &p.cfg.Retry
	keyed := f.Gen != 0
	start := g.start
	p.budget.request(start)
	jitter := newFullJitter(rc.BaseBackoff, rc.MaxBackoff)
	model := modelKey(g.req.Model) // whose circuits the calls go through
	next := 0
	var last attempt
	var pinned *upstream // after an ambiguous failure: the one upstream that may see the request again
	for n := 1; ; n++ {
		if cause := g.cutShort(); cause != "" {
			f.Fail(cache.StateFailedRetryable, cause, nil)
			return
		}
		up, idx, done, ok := pick(p.ups, next, model)
		if ok && pinned != nil && up != pinned {
			// The pinned upstream's circuit is open. Another upstream
			// cannot deduplicate against the call that may be running.
			done(errNotCalled)
			ok = false
		}
		if !ok {
			g.end(n-1, attempt{reason: "upstream_unavailable"}, last)
			return
		}
		g.mark(cache.StateExecutionStarted, n, last.head.Status)
		a, started := g.try(up, tmpl, done)
		if started {
			p.m.attemptsPerOK.Observe(float64(n))
			return // the flight has its answer, and ended with it
		}
		if a.verdict == final && a.head.Status != 0 && !a.head.Stream && g.relayRaw {
			handedOff = true
			g.mu.Lock()
			resp := g.resp
			g.resp = nil
			g.mu.Unlock()
			g.o.answerRaw(resp)
			return
		}
		g.drop()
		// An ambiguous failure is repeated only for an upstream known to
		// deduplicate on the key (-retry-ambiguous), so only with one.
		retry := a.verdict == safe || (a.verdict == ambiguous && keyed && up.retryAmbiguous)
		wait := jitter.next()
		why := ""
		switch {
		case !retry:
		case n >= rc.Attempts:
			why = "attempts"
		case a.retryAfter > rc.RetryAfterMax:
			why = "retry_after_too_long"
		case time.Since(start)+max(wait, a.retryAfter) > rc.MaxElapsed:
			why = "max_elapsed"
		case !p.budget.retry(time.Now()):
			why = "budget"
		}
		if !retry || why != "" {
			if why != "" {
				p.m.noRetry.WithLabelValues(why).Inc()
				if why == "budget" {
					p.m.budgetRefused.Inc()
				}
				p.log.Warn("no retry", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "attempt", n,
					"reason", a.reason, "why", why, "upstream", up.name)
			}
			g.end(n, a, last)
			return
		}
		p.m.retries.WithLabelValues(a.reason).Inc()
		p.log.Info("retry", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "attempt", n, "reason", a.reason,
			"upstream", up.name, "backoff", max(wait, a.retryAfter).String())
		last = a
		next = idx + 1 // fail over to the next upstream
		if a.verdict == ambiguous {
			// The upstream may be running the request: only it can tell
			// the repeat apart (-retry-ambiguous), so it gets it.
			next, pinned = idx, up
		}
		t := time.NewTimer(max(wait, a.retryAfter))
		select {
		case <-t.C:
		case <-g.stop:
			t.Stop()
		}
	}
}

// try makes one attempt on up. started reports that the answer went into
// the flight (and the flight ended with it); otherwise a says what came.
func (g *gen) try(up *upstream, tmpl *fasthttp.Request, done func(error)) (a attempt, started bool) {
	sent := time.Now()
	resp, err := g.call(up, up.prepare(tmpl))
	m := g.p.m
	if errors.Is(err, errCancelled) {
		done(nil) // the upstream answered; whether well is not known
		return attempt{verdict: final, reason: g.cutShort()}, false
	}
	if err != nil {
		done(err)
		a := attempt{verdict: ambiguous, reason: "upstream_reset"}
		switch {
		case isDial(err):
			a = attempt{verdict: safe, reason: "connect_error"}
		case isStale(err):
			a = attempt{verdict: safe, reason: "stale_connection"}
		case isTimeout(err):
			a.reason = "upstream_timeout"
		}
		m.attempts.WithLabelValues(a.reason).Inc()
		return a, false
	}
	head := copyHead(resp)
	m.attempts.WithLabelValues(statusClass(head.Status)).Inc()
	a = attempt{verdict: statusVerdict(head.Status), head: head, reason: fmt.Sprintf("upstream_status_%d", head.Status)}
	if head.Status >= 500 {
		done(errUpstreamStatus)
	} else {
		done(nil) // alive: 4xx and 429 are answers, not outages
	}
	if a.verdict == safe {
		a.retryAfter = retryAfter(resp.Header.Peek("Retry-After"), time.Now())
		a.body, _ = readBody(resp, 64<<10)
		return a, false
	}
	if !head.Stream {
		if g.relayRaw {
			return a, false
		}
		if g.req.Stream && head.Status < 300 && !isJSON(head.ContentType) {
			// A stream was asked for, and a 2xx came that is neither one
			// nor a JSON answer (a proxy's HTML page, say): no valid first
			// event. The upstream took the request; what became of it is
			// not known. (A JSON answer, from an upstream that does not
			// stream, is recorded like any other: framing decides.)
			return attempt{verdict: ambiguous, answered: true, reason: "not_an_event_stream"}, false
		}
		g.record(resp, head)
		return a, true
	}
	reason, started := g.pump(resp, head, sent)
	if started {
		return a, true
	}
	a.reason = reason
	if reason == "error_event" {
		a.verdict = safe // the upstream said it failed, before any event
	} else {
		// A head and no valid first event: the upstream took the request
		// and may be generating. A body that ended without one is an
		// answer, if not a stream; a reset or a silence is none.
		a.verdict = ambiguous
		a.answered = reason != "upstream_read_error" && reason != "upstream_idle_timeout"
	}
	a.head = cache.Head{}
	return a, false
}

var errUpstreamStatus = errors.New("upstream answered 5xx")

// record ends the flight with a non-streaming answer: committed when 2xx,
// relayed to joiners and not stored otherwise.
func (g *gen) record(resp *fasthttp.Response, head cache.Head) {
	f := g.f
	body, err := readBody(resp, g.p.cfg.MaxStreamBytes)
	f.SetHead(head)
	switch {
	case err != nil:
		// A chunked body without its last chunk, or one shorter than its
		// Content-Length, fails here (io.ErrUnexpectedEOF).
		f.Fail(cache.StateFailedRetryable, readFailure(err), nil)
	case head.Status >= 200 && head.Status < 300 && !wholeBody(resp, head, body):
		f.Fail(cache.StateFailedRetryable, "unframed_body", nil)
	case head.Status >= 200 && head.Status < 300:
		f.SetUsage(bodyUsage(body))
		g.skipped(f.Commit(body))
	case head.Status >= 400 && head.Status < 500 && head.Status != fasthttp.StatusTooManyRequests:
		f.Fail(cache.StateFailedTerminal, fmt.Sprintf("upstream_status_%d", head.Status), body)
	default:
		f.Fail(cache.StateFailedRetryable, fmt.Sprintf("upstream_status_%d", head.Status), body)
	}
	g.logEnd(head.Status)
}

// wholeBody reports whether a 2xx body read without error is known to be
// whole. A chunked body or one with a Content-Length is, since its
// framing was checked as it was read. A body that ends where the
// connection closes could have been cut anywhere: it counts as whole only
// when it parses as the JSON its Content-Type says it is.
func wholeBody(resp *fasthttp.Response, head cache.Head, body []byte) bool {
	if head.Status == fasthttp.StatusNoContent || head.Status == fasthttp.StatusNotModified {
		return len(body) == 0 // an answer that has no body
	}
	if resp.Header.ContentLength() != -2 { // -2: until the connection closes
		return true
	}
	return isJSON(head.ContentType) && json.Valid(body)
}

// isJSON reports whether a content type is JSON (application/json, or a
// +json type).
func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(ct)), ";")
	mt = strings.TrimSpace(mt)
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// end ends the flight after the last attempt a (and the one before it,
// prev) brought no answer worth recording as a result.
func (g *gen) end(attempts int, a, prev attempt) {
	f := g.f
	if a.head.Status == 0 && prev.head.Status != 0 && a.verdict != ambiguous {
		a = prev // relay the upstream's own last answer rather than a connect error
	}
	state := cache.StateFailedRetryable
	switch {
	case a.verdict == ambiguous && a.answered:
		// An answer that was not a stream: a failure, known as such.
	case a.verdict == ambiguous:
		state = cache.StateCommitUnknown
		g.p.m.commitUnknowns.Inc()
	case a.head.Status >= 400 && a.head.Status < 500 && a.head.Status != fasthttp.StatusTooManyRequests:
		state = cache.StateFailedTerminal
	}
	f.Mark(cache.StateExecutionStarted, attempts, a.head.Status) // the count; Fail records the state
	if f.Gen != 0 {
		g.p.log.Info("state", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "generation", f.Gen,
			"attempt", attempts, "state", state, "upstream_status", a.head.Status, "reason", a.reason)
	}
	if a.head.Status != 0 {
		f.SetHead(a.head)
		f.Fail(state, a.reason, a.body)
	} else {
		f.Fail(state, a.reason, nil)
	}
	g.logEnd(a.head.Status)
}

// pump reads the upstream's events into the flight. The head goes to the
// flight with the first event: until then nothing has reached a client,
// and a failure returns started=false so the caller may retry. After it,
// the flight ends here: committed after a clean end, failed otherwise.
// The body is read to its end, even past the terminal event, so the
// connection can be reused.
func (g *gen) pump(resp *fasthttp.Response, head cache.Head, sent time.Time) (reason string, started bool) {
	f := g.f
	m := g.p.m
	deadline := time.AfterFunc(g.p.cfg.MaxStreamDuration, func() { g.cancel("max_stream_duration") })
	defer deadline.Stop()
	det := sse.NewDetector(g.req.Expect())
	var readErr, appendErr error
	// The client the generation writes gets what was journaled whenever
	// the generation is about to read the upstream's socket: the events of
	// one read go out together, and before it may wait. Every upstream
	// connection is an idleConn (newUpstream's Dial; TestAnswerConn).
	if c := connOf(resp); c != nil {
		c.beforeRead = g.o.push
		defer func() { c.beforeRead = nil }()
	}
	// Events after the terminal one are no part of the answer: the flight
	// ends with the terminal event, and what follows is only read (at
	// most maxDrain bytes of it) so that the connection can be reused.
	concluded := false
	drained := 0
	conn := connOf(resp)
	for ev, err := range sse.Read(bodyOf(resp), g.p.cfg.MaxEventBytes) {
		if err != nil {
			readErr = err
			break
		}
		if concluded {
			if drained += len(ev.Type) + len(ev.Data); drained > maxDrain {
				break
			}
			continue
		}
		det.Observe(ev)
		if !started {
			if ok, why := det.Clean(false); !ok && why == "error_event" {
				return why, false // an upstream error before any event: a failed call
			}
			f.SetHead(head)
			started = true
			m.ttfeUpstream.Observe(time.Since(sent).Seconds())
		}
		terminal := det.Terminal()
		// A terminal event that says "whole" when the stream is not
		// ([DONE] with a choice unfinished, say) is not relayed: a client
		// that stops reading at it would take a half stream for a whole
		// one. stream_aborted ends the stream instead.
		relay := true
		if terminal {
			ok, why := det.Clean(false)
			relay = ok || !falseEnd(why)
		}
		if relay {
			m.events.Inc()
			if _, err := f.Append(ev.Type, ev.Data); err != nil {
				appendErr = err
				break
			}
		}
		if terminal {
			reason, started = g.conclude(det, head, nil, nil, false)
			concluded = true
			conn.drainBy(time.Now().Add(maxDrainTime))
		}
	}
	if concluded {
		return reason, started
	}
	// The body ended with its framing intact: its last chunk, or all of
	// its Content-Length (fasthttp fails a read short of either with
	// io.ErrUnexpectedEOF); a body that ends where the connection closed
	// (-2) has no framing to vouch for its end.
	intact := readErr == nil && resp.Header.ContentLength() != -2
	return g.conclude(det, head, readErr, appendErr, intact)
}

// falseEnd reports whether a stream the detector found unclean for reason
// ended with an event that claims a whole answer ([DONE], message_stop,
// response.completed) or is itself broken: such an event is not relayed.
// The provider's own failure events (an error, response.failed,
// response.incomplete) are relayed before the stream_aborted end: they
// say what went wrong.
func falseEnd(reason string) bool {
	switch reason {
	case "error_event", "response_failed", "response_incomplete":
		return false
	}
	return true
}

// maxDrain and maxDrainTime bound what is read of an upstream body after
// its terminal event, for the connection's reuse; past either the
// connection is closed. A provider ends its body right after its terminal
// event, so the bounds only stop one that does not.
const (
	maxDrain     = 64 << 10
	maxDrainTime = 100 * time.Millisecond
)

// conclude ends the flight once the stream's end is known: committed when
// det finds it clean, failed otherwise. Before any event was journaled
// (started false on entry, known from the flight), a failure that is not
// the generation's own cut is returned with started false, so that the
// caller may decide on a retry.
func (g *gen) conclude(det *sse.Detector, head cache.Head, readErr, appendErr error, intact bool) (reason string, started bool) {
	f, m := g.f, g.p.m
	_, started = f.Head()
	cause := g.cutShort()
	switch {
	case cause != "":
		reason = cause
	case errors.Is(appendErr, cache.ErrStreamTooLarge):
		reason = "max_stream_bytes"
	case errors.Is(appendErr, cache.ErrEnded):
		_, reason, _ = f.Outcome() // the store ended it (e.g. fenced by another replica)
	case appendErr != nil:
		reason = "store_full"
	case readErr != nil:
		reason = readFailure(readErr)
	default:
		var ok bool
		if ok, reason = det.Clean(intact); ok {
			if !started {
				f.SetHead(head)
			}
			if in, out, ok := det.Usage(); ok {
				f.SetUsage(cache.Usage{Input: in, Output: out})
			}
			g.skipped(f.Commit(nil))
			g.logEnd(head.Status)
			return "", true
		}
	}
	if !started && cause == "" {
		return reason, false
	}
	if !started {
		f.SetHead(head)
	}
	m.aborted.WithLabelValues(reason).Inc()
	f.Fail(cache.StateFailedRetryable, reason, nil)
	g.logEnd(head.Status)
	return reason, true
}

func readFailure(err error) string {
	switch {
	case errors.Is(err, sse.ErrEventTooLarge):
		return "max_event_bytes"
	case errors.Is(err, errBodyTooLarge):
		return "max_stream_bytes"
	case isTimeout(err):
		return "upstream_idle_timeout"
	default:
		return "upstream_read_error"
	}
}

func (g *gen) logEnd(status int) {
	f := g.f
	if f.Gen == 0 {
		return // unkeyed: nothing was decided
	}
	state, reason, _ := f.Outcome()
	attrs := []any{"key", f.Scope.Key, "tenant", f.Scope.Tenant, "generation", f.Gen,
		"state", state, "reason", reason, "upstream_status", status, "events", f.Events(),
		"duration_ms", time.Since(g.start).Milliseconds()}
	if t := f.FirstEventAt(); !t.IsZero() {
		attrs = append(attrs, "first_event_ms", t.Sub(g.start).Milliseconds())
	}
	g.p.log.Info("generation ended", attrs...)
}

// abortMessages explain each abort cause to the client.
var abortMessages = map[string]string{
	"max_stream_bytes":      "the stream exceeded the proxy's per-stream byte bound",
	"max_event_bytes":       "an upstream event exceeded the proxy's event size bound",
	"max_stream_duration":   "the stream exceeded the proxy's stream duration bound",
	"store_full":            "the proxy's live journals are full",
	"upstream_idle_timeout": "the upstream went silent",
	"upstream_read_error":   "the upstream connection failed mid-stream",
	"shutdown":              "the proxy is shutting down",
	"generation_lost":       "the replica that ran this generation stopped; retry the request",
	"store_unavailable":     "the store holding this generation became unreachable",
	"fenced":                "another replica took this generation over",
}

func abortMessage(reason string) string {
	if m, ok := abortMessages[reason]; ok {
		return m
	}
	return "the upstream stream did not end cleanly (" + reason + ")"
}

// skipped counts a completed answer that is not stored.
func (g *gen) skipped(stored bool) {
	switch {
	case g.f.Gen == 0:
		g.p.m.cacheSkipped.WithLabelValues("no_key").Inc()
	case !stored:
		g.p.m.cacheSkipped.WithLabelValues("store_refused").Inc()
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

// bodyUsage reads the token usage of a non-streaming answer, in the
// OpenAI (prompt/completion, input/output) or Anthropic shape.
func bodyUsage(body []byte) cache.Usage {
	u := gjson.GetBytes(body, "usage")
	if !u.Exists() {
		return cache.Usage{}
	}
	in := u.Get("prompt_tokens").Int() + u.Get("input_tokens").Int()
	out := u.Get("completion_tokens").Int() + u.Get("output_tokens").Int()
	return cache.Usage{Input: in, Output: out}
}
