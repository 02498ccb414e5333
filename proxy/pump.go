package proxy

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/ssegate/ssegate/sse"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// boundDuration cuts the generation once it has streamed for
// -max-stream-duration; the returned func stops the bound.
func (g *gen) boundDuration() (stop func() bool) {
	return time.AfterFunc(g.p.cfg.MaxStreamDuration, func() { g.cancel(causeMaxStreamDuration) }).Stop
}

// pump relays the upstream's events: it reads each one, records it into
// the flight (Append), and the origin is delivered what was recorded
// before each read of the upstream's socket (read); followers are woken
// by the flight. A preamble, the events before the first that carries
// model output (sse.Detector.Content), is held (preamble) until that
// event, -preamble-hold or -max-event-bytes; the head goes to the flight
// with the held events. Until then nothing has reached a client, and a
// failure, an error the upstream sent among them included, returns an
// unsettled attempt so the caller may retry or fall back. After it, the
// flight ends here (settled): committed after a clean end, failed
// otherwise. What follows the terminal event is drained, within bounds,
// so the connection can be reused.
//
// A stream that h can heal (heal.go) and whose connection breaks after
// the first event goes on with the upstream's resume of it.
//
// done tells the circuits what the attempt came to: an answer once the
// preamble is released, or the status an error in it stands for.
//
// It is a loop over bodies (the answer's, then each heal's) and their
// events: step takes one event, bodyEnd one body's end, and end the
// answer's.
func (g *gen) pump(resp *fasthttp.Response, head cache.Head, sent time.Time, h *healer, more bool, done func(error)) attempt {
	defer g.boundDuration()()
	pu := g.newPumping(head, sent, h, more, done)
	defer pu.pre.report(nil)
	for resp != nil {
		pu.read(resp)
		for pu.sc.Next() && pu.step(pu.sc.Event()) {
		}
		resp = pu.bodyEnd()
	}
	return pu.end()
}

// pumping is what one pump has read of an answer. It is the generation's
// goroutine's alone.
type pumping struct {
	g    *gen
	j    judge         // what the events mean (the kind's)
	det  *sse.Detector // j, when it is a model's: for what only a model's stream has (responseCreated, heal)
	head cache.Head
	h    *healer
	more bool // another model may follow
	pre  preamble
	// One scanner reads every body, in place: an event's strings point
	// into its buffer until the next event is read, so what outlives that
	// is copied (the journal, the preamble, heldFailure and
	// responseCreated do).
	sc   *sse.Scanner
	resp *fasthttp.Response // the body being read: the answer's, then each heal's
	conn *upstream.Conn     // the connection resp is read from

	begun  bool // the head went to the flight
	pushed bool // the origin was written since the first event journaled here
	// concluded: the terminal event came and the flight ended with it.
	// Events after it are no part of the answer: what follows is only
	// read (at most maxDrain bytes of it, drained) so that the connection
	// can be reused.
	concluded bool
	drained   int
	// failing: a Responses stream's error event came, and the
	// response.failed the API sends after it is awaited, within the drain
	// bounds: an upstream that sends no more ends the stream with its error.
	failing   bool
	failedA   *attempt // the held failure, while its response.failed is awaited
	readErr   error
	appendErr error
	// over: the attempt came to result, and nothing more is read.
	over   bool
	result attempt
}

// newPumping starts a pump of an answer with head h, sent at sent. A kind
// that holds no preamble has its head in the flight at once, so that the
// clients see the answer start before its first event.
func (g *gen) newPumping(head cache.Head, sent time.Time, h *healer, more bool, done func(error)) *pumping {
	j := g.kind.judge(g.req)
	det, _ := j.(*sse.Detector)
	pu := &pumping{g: g, j: j, det: det, head: head, h: h, more: more, sc: sse.NewScanner(nil, g.p.cfg.MaxEventBytes)}
	pu.pre = preamble{g: g, det: j, head: head, sent: sent, more: more, done: done}
	if !g.kind.model {
		pu.appendErr = pu.pre.release()
		pu.begun = pu.appendErr == nil
	}
	return pu
}

// read starts reading the body of resp. Until bodyEnd, each read of its
// connection's socket first writes the origin what the flight journaled
// since the last (origin.push), on the generation's goroutine, inside
// the body's Read: the events of one upstream read go out in one write,
// before the generation may wait for the upstream, and a client that
// cannot take them is handed to a goroutine of its own, so the
// generation never waits for it.
func (pu *pumping) read(resp *fasthttp.Response) {
	pu.resp, pu.conn = resp, upstream.ConnOf(resp)
	if pu.conn != nil {
		pu.conn.SetBeforeRead(pu.g.o.push)
	}
	pu.sc.Reset(bodyOf(resp))
}

// finish ends the attempt with a, once nothing more is to be read.
func (pu *pumping) finish(a attempt) bool {
	pu.over, pu.result = true, pu.g.withUsage(pu.j, a)
	return false
}

// step takes one event of the body: held in the preamble, or recorded
// into the flight, ending it at the terminal event. It reports whether
// to read on: false at an append that failed, past the drain's bound,
// or once the attempt is over.
func (pu *pumping) step(ev sse.Event) bool {
	if pu.concluded {
		pu.drained += len(ev.Type) + len(ev.Data)
		return pu.drained <= maxDrain
	}
	pu.j.Observe(ev)
	if !pu.begun {
		if read, ok := pu.preambleStep(ev); !ok {
			return read
		}
	}
	return pu.record(ev)
}

// preambleStep takes event ev before the head went to the flight: held,
// or the held failure's, or the end of the preamble. ok reports that ev
// is to be recorded now, and otherwise read whether to read on.
func (pu *pumping) preambleStep(ev sse.Event) (read, ok bool) {
	g, j, pre := pu.g, pu.j, &pu.pre
	if pre.released {
		pu.begun = true // at -preamble-hold, in a read (upstream.Conn.HoldBy)
		pu.appendErr = pre.err
		return false, pu.appendErr == nil
	}
	g.p.hooks.sawEvent(g, ev.Data)
	if ev.Type == "response.created" {
		g.responseCreated(ev, pu.det, pu.h, pre)
	}
	if pu.failedA != nil {
		// The Responses response.failed after its error event.
		if pre.keep(ev); j.Terminal() {
			return pu.finish(pre.failed(*pu.failedA)), false
		}
		return true, false
	}
	if streamFailed(j) {
		if a, again := g.heldFailure(ev, pu.head, pu.more); again {
			return pu.holdFailure(ev, a), false
		}
	} else if !j.Content() && !j.Terminal() && pre.hold(ev, pu.conn) {
		return true, false
	}
	pu.conn.HoldBy(time.Time{}, nil)
	if pu.appendErr = pre.release(); pu.appendErr != nil {
		return false, false
	}
	pu.begun = true
	return false, true
}

// holdFailure takes the failure a that ev, among the preamble's events,
// brought, which may be made again or fallen back from: the attempt is
// over with it, or, after a Responses error event, once the
// response.failed after it came (failedA) or the drain's bounds passed.
// It reports whether to read on.
func (pu *pumping) holdFailure(ev sse.Event, a attempt) bool {
	pu.conn.HoldBy(time.Time{}, nil)
	if a.cause != causeUpstreamAborted {
		pu.pre.keep(ev) // an ssegate's stream_aborted is its own, not the provider's
	}
	if a.cause == causeUpstreamAborted || pu.j.Terminal() {
		return pu.finish(pu.pre.failed(a))
	}
	pu.failedA = &a
	pu.conn.DrainBy(time.Now().Add(maxDrainTime))
	return true
}

// record journals ev into the flight, and ends the flight when ev is the
// terminal event. It reports whether to read on.
func (pu *pumping) record(ev sse.Event) bool {
	g, j := pu.g, pu.j
	terminal := j.Terminal()
	// The terminal event is relayed as it came when the stream is clean
	// or ended as the provider stated it (causeRow.relayEnd: its
	// response.failed, or its [DONE] after a choice the request did not
	// ask for). A malformed one is not, nor one that claims a whole
	// answer when the stream is not ([DONE] with a choice unfinished,
	// say): a client that stops reading at it would take a half stream
	// for a whole one. stream_aborted ends the stream instead.
	relay := true
	if terminal {
		ok, why := j.Clean(false)
		relay = ok || relayEnd(why)
	}
	if relay {
		g.p.hooks.eventJournaled()
		var err error
		if pu.sc.OneLine() {
			_, err = g.f.AppendLine(ev.Type, ev.Data) // not searched for line breaks
		} else {
			_, err = g.f.Append(ev.Type, ev.Data)
		}
		if err != nil {
			pu.appendErr = err
			return false
		}
		if !pu.pushed {
			// The first event with output goes to the origin now, with
			// the preamble, not after the rest of its read: a whole short
			// stream, its commit included, may lie in that read.
			pu.pushed = true
			g.o.push()
		}
	}
	switch {
	case terminal:
		c, settled := g.conclude(j, pu.head, nil, nil, false)
		pu.result = pumped(c, settled)
		pu.concluded = true
		pu.conn.DrainBy(time.Now().Add(maxDrainTime))
	case !pu.failing && j.ErrSeen() && j.Dialect() == sse.DialectOpenAIResponses:
		pu.failing = true
		pu.conn.DrainBy(time.Now().Add(maxDrainTime))
	}
	return true
}

// bodyEnd ends the reading of one body, its connection no longer writing
// the origin: the attempt is over, or the body broke and a stream that
// can heal goes on with the body it returns, or the answer's end is
// left to end.
func (pu *pumping) bodyEnd() (next *fasthttp.Response) {
	if pu.conn != nil {
		pu.conn.SetBeforeRead(nil)
	}
	pu.conn.HoldBy(time.Time{}, nil)
	if pu.over {
		return nil
	}
	if err := pu.sc.Err(); err != nil && (!pu.failing || !upstream.IsTimeout(err)) {
		pu.readErr = err
	}
	switch {
	case pu.failedA != nil:
		pu.finish(pu.pre.failed(*pu.failedA)) // no response.failed within the drain's bounds
		return nil
	case pu.concluded:
		pu.finish(pu.result)
		return nil
	case !pu.begun && pu.pre.released:
		pu.begun, pu.appendErr = true, pu.pre.err
	case !pu.begun && pu.readErr != nil && pu.h != nil && len(pu.pre.ends) > 0:
		// A break in the preamble: a stream that can heal goes on from
		// it, as from any event it relayed.
		pu.appendErr, pu.begun = pu.pre.release(), true
	}
	if pu.readErr == nil || pu.appendErr != nil || !pu.begun || pu.h == nil {
		return nil
	}
	nr, err := pu.g.heal(pu.h, pu.det, pu.readErr)
	if nr == nil {
		pu.readErr = err
		return nil
	}
	pu.readErr = nil
	return nr
}

// end is what the attempt came to: its result once over, or else the
// answer's end, concluded.
func (pu *pumping) end() attempt {
	if pu.over {
		return pu.result
	}
	if !pu.begun && pu.readErr == nil && pu.appendErr == nil && len(pu.pre.ends) > 0 {
		// The body ended with the preamble held: it goes out with the end.
		pu.appendErr = pu.pre.release()
	}
	// The body ended with its framing intact: its last chunk, or all of
	// its Content-Length (fasthttp fails a read short of either with
	// io.ErrUnexpectedEOF); a body that ends where the connection closed
	// (-2) has no framing to vouch for its end.
	intact := pu.readErr == nil && pu.resp.Header.ContentLength() != -2
	c, settled := pu.g.conclude(pu.j, pu.head, pu.readErr, pu.appendErr, intact)
	return pu.g.withUsage(pu.j, pumped(c, settled))
}

// withUsage is a with what det saw of the upstream's usage, told to the
// call's span too.
func (g *gen) withUsage(det judge, a attempt) attempt {
	if in, out, ok := det.Usage(); ok {
		a.usage, a.used = cache.Usage{Input: in, Output: out}, true
		g.p.hooks.usage(g, in, out)
	}
	return a
}

// pumped is the attempt of a stream pump ended for c, settled or not.
func pumped(c cause, settled bool) attempt {
	if settled {
		return attempt{settled: true}
	}
	return attempt{cause: c}
}

// streamFailed reports whether the stream det follows failed: an error event or
// member, or a Responses response.failed.
func streamFailed(det judge) bool {
	_, why := det.Clean(false)
	return why == sse.ReasonErrorEvent || why == sse.ReasonResponseFailed
}

// preamble holds the events of a stream that carry no model output yet,
// copied, so that an error after them is still a failed attempt that no
// client saw.
type preamble struct {
	g        *gen
	det      judge
	head     cache.Head
	sent     time.Time
	buf      []byte
	ends     []int // per event, where its type and its data end in buf
	n        int   // bytes held
	since    time.Time
	released bool
	failure  bool  // released to relay the upstream's failure: no first token
	err      error // the release's, when the bound released it in a read
	onHold   func()
	more     bool        // another model may follow
	done     func(error) // the circuits' report, made once (report)
	// alias is the attempt's Responses id, aliasBase its first sequence
	// number (responseCreated): the key's alias once the attempt is the
	// answer (release), never for an attempt that failed and was made
	// again or fell back, whose id would name another attempt's answer.
	alias     string
	aliasBase int64
}

// report tells the circuits, once, what the attempt came to.
func (p *preamble) report(err error) {
	if p.done != nil {
		p.done(err)
		p.done = nil
	}
}

// hold keeps ev and reports true, unless holding is off, -preamble-hold
// passed since the first held event, ev would take the held bytes past
// -max-event-bytes, or the store's live bounds have no room for it. The
// first held event has conn call release at the bound, should the
// upstream be silent until then.
func (p *preamble) hold(ev sse.Event, conn *upstream.Conn) bool {
	cfg := &p.g.p.cfg
	if cfg.PreambleHold <= 0 || p.n+len(ev.Type)+len(ev.Data) > cfg.MaxEventBytes {
		return false
	}
	first := p.n == 0 && len(p.ends) == 0
	if !first && time.Since(p.since) >= cfg.PreambleHold {
		return false
	}
	// Held bytes count against -max-live-bytes as journaled ones do.
	if p.g.f.Hold(len(ev.Type)+len(ev.Data)) != nil {
		return false // no room: relayed now, and its Append says why
	}
	if first {
		p.since = time.Now()
		p.onHold = func() { p.err = p.release() }
		conn.HoldBy(p.since.Add(cfg.PreambleHold), p.onHold)
	}
	p.keep(ev)
	return true
}

// keep adds ev to the held events.
func (p *preamble) keep(ev sse.Event) {
	p.buf = append(p.buf, ev.Type...)
	p.ends = append(p.ends, len(p.buf))
	p.buf = append(p.buf, ev.Data...)
	p.ends = append(p.ends, len(p.buf))
	p.n += len(ev.Type) + len(ev.Data)
}

// failed is attempt a, which failed among the held events, with them:
// should it be the last, they are relayed as the provider sent them
// (relayFailure).
func (p *preamble) failed(a attempt) attempt {
	if a.cause != causeUpstreamAborted {
		a.held = p
	}
	p.report(health(a.head.Status, p.more))
	return a
}

// relayFailure ends the flight with the held events, the upstream's
// error among them, as the provider sent them: its own failure, relayed
// and not stored (causeRow.relayEnd).
func (p *preamble) relayFailure() {
	p.failure = true // no first token: the upstream's failure is relayed
	err := p.release()
	p.g.conclude(p.det, p.head, nil, err, true)
}

// release sets the flight's head and appends the held events to it, in
// order: clients see the preamble from here on.
func (p *preamble) release() error {
	if p.released {
		return p.err
	}
	p.released = true
	p.report(nil)
	g := p.g
	if p.alias != "" && !p.failure {
		// Before the events: a client that reads the id can resume by it.
		if as, ok := g.p.store.(aliasStore); ok {
			as.SetAlias(g.f.Scope, g.f.Gen, p.alias, p.aliasBase)
		}
	}
	g.f.SetHead(p.head)
	if !p.failure && g.kind.model {
		g.p.hooks.firstOutput(g, p.sent)
	}
	start := 0
	for i := 0; i < len(p.ends); i += 2 {
		t, d := p.buf[start:p.ends[i]], p.buf[p.ends[i]:p.ends[i+1]]
		start = p.ends[i+1]
		g.p.hooks.eventJournaled()
		if _, err := g.f.Append(string(t), string(d)); err != nil {
			return err
		}
	}
	p.buf, p.ends = nil, nil
	return nil
}

// heldFailure is the attempt of a stream whose upstream failed, in ev,
// before any output, and whether it may be made again or fallen back
// from: the error stands for the status the upstream would have answered
// (insufficient_quota or a rate limit as 429, overloaded_error as 503,
// server_error and api_error as 500, a -fallback-on-code code as that
// 400, a numeric code as itself); one that names none is an error_event,
// as before any event. One that may not is relayed as it came.
func (g *gen) heldFailure(ev sse.Event, head cache.Head, more bool) (attempt, bool) {
	e := gjson.Get(ev.Data, "error")
	if !e.IsObject() {
		e = gjson.Get(ev.Data, "response.error")
	}
	typ, code := e.Get("type").Str, e.Get("code")
	code.Str = strings.Clone(code.Str) // kept in the attempt; ev.Data is the scanner's
	if ev.Type == "error" && typ == "stream_aborted" {
		// An ssegate behind cut its stream: not the provider saying it
		// did not run the request.
		return attempt{cause: causeUpstreamAborted}, true
	}
	status := 0
	if code.Type == gjson.Number && code.Int() >= 400 && code.Int() <= 599 {
		status = int(code.Int())
	}
	for _, k := range [2]string{code.Str, typ} {
		switch k {
		case "insufficient_quota", "rate_limit_exceeded", "rate_limit_error":
			status = fasthttp.StatusTooManyRequests
		case "overloaded_error":
			status = fasthttp.StatusServiceUnavailable
		case "server_error", "api_error":
			status = fasthttp.StatusInternalServerError
		}
		if k != "" && slices.Contains(g.p.cfg.FallbackOnCodes, k) {
			if !more {
				return attempt{}, false
			}
			status = fasthttp.StatusBadRequest
			code.Str = k
		}
	}
	if status == 0 {
		return attempt{cause: causeErrorEvent}, true
	}
	// Should it be the last attempt, the client gets the error as the
	// answer of that status.
	h := cache.Head{Status: status, ContentType: "application/json", Header: head.Header}
	a := attempt{cause: upstreamStatus(status), head: h, body: []byte(`{"error":` + e.Raw + `}`)}
	if slices.Contains(g.p.cfg.AmbiguousStatus, status) {
		// A gateway's timeout inside the stream (-ambiguous-status): the
		// request may be running behind it, as for that status's answer.
		a.ambiguousStatus = true
		return a, true
	}
	if status == fasthttp.StatusBadRequest && code.Str != "" && slices.Contains(g.p.cfg.FallbackOnCodes, code.Str) {
		a.fallbackCode = code.Str
		return a, true
	}
	if code.Str == "insufficient_quota" || typ == "insufficient_quota" {
		// A quota does not come back within a retry's wait: the model is
		// not asked again, and its fallback is.
		a.exhausted = true
		return a, true
	}
	return a, a.verdict() == upstream.Safe
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
// det finds it clean, failed otherwise, and reports it settled. Before any
// event was journaled (no head in the flight yet), a failure that is not
// the generation's own cut is returned unsettled, so that the caller may
// decide on a retry.
func (g *gen) conclude(det judge, head cache.Head, readErr, appendErr error, intact bool) (c cause, settled bool) {
	f := g.f
	_, begun := f.Head()
	cut := g.cutShort()
	switch {
	case cut != causeNone:
		c = cut
	case appendErr != nil:
		c = appendFailure(f, appendErr)
	case readErr != nil:
		c = readFailure(readErr)
	default:
		ok, why := det.Clean(intact)
		if ok {
			if !begun {
				f.SetHead(head)
			}
			if in, out, ok := det.Usage(); ok {
				f.SetUsage(cache.Usage{Input: in, Output: out})
			}
			g.commit(nil)
			return causeNone, true
		}
		c = causeOf(why)
	}
	if !begun && cut == causeNone {
		return c, false
	}
	if !begun {
		// Cut short (a shutdown, -max-stream-duration) after the
		// upstream answered with a stream's head and before any event
		// reached a client: the upstream took the request and may be
		// generating it. As for a cut while the head was awaited (call),
		// the head is not the clients': they get the outcome-unknown
		// answer, and the key is left commit_unknown (failState).
		g.mayRun = true
		g.fail(c, 0, nil)
		return c, true
	}
	if causes[c].relayEnd {
		// The provider ended the stream itself, and what it sent was
		// relayed as it came: no abort, but nothing to store either.
		g.notStored(c)
	} else {
		g.p.hooks.aborted(c)
	}
	if in, out, ok := det.Usage(); ok && !g.heldFailed {
		g.p.hooks.tokensLost(lossAborted, cache.Usage{Input: in, Output: out})
	}
	g.fail(c, 0, nil)
	return c, true
}

// appendFailure is the cause of f's Append that failed with err.
func appendFailure(f *cache.Flight, err error) cause {
	switch {
	case errors.Is(err, cache.ErrStreamTooLarge):
		return causeMaxStreamBytes
	case errors.Is(err, cache.ErrEnded):
		_, reason, _ := f.Outcome() // the store ended it (e.g. fenced by another replica)
		return causeOf(reason)
	default:
		return causeStoreFull
	}
}
