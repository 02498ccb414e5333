package proxy

import (
	"errors"
	"io"
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
// before each read of the upstream's socket (relayBody); followers are
// woken by the flight. A preamble, the events before the first that
// carries model output (sse.Detector.Content), is held (preamble) until
// that event, -preamble-hold or -max-event-bytes; the head goes to the
// flight with the held events. Until then nothing has reached a client,
// and a failure, an error the upstream sent among them included, returns
// an unsettled attempt so the caller may retry or fall back. After it,
// the flight ends here (settled): committed after a clean end, failed
// otherwise. What follows the terminal event is drained, within bounds,
// so the connection can be reused.
//
// A stream that h can heal (heal.go) and whose connection breaks after
// the first event goes on with the upstream's resume of it.
//
// done tells the circuits what the attempt came to: an answer once the
// preamble is released, or the status an error in it stands for.
func (g *gen) pump(resp *fasthttp.Response, head cache.Head, sent time.Time, h *healer, more bool, done func(error)) attempt {
	f := g.f
	defer g.boundDuration()()
	det := sse.NewDetector(g.req.Expect())
	var readErr, appendErr error
	// Events after the terminal one are no part of the answer: the flight
	// ends with the terminal event, and what follows is only read (at
	// most maxDrain bytes of it) so that the connection can be reused.
	begun := false  // the head went to the flight
	pushed := false // the origin was written since the first event journaled here
	concluded := false
	drained := 0
	// failing: a Responses stream's error event came, and the
	// response.failed the API sends after it is awaited, within the drain
	// bounds: an upstream that sends no more ends the stream with its error.
	failing := false
	pre := preamble{g: g, det: det, head: head, sent: sent, more: more, done: done}
	defer pre.report(nil)
	var failedA *attempt // the held failure, while its response.failed is awaited
	var c cause
	var settled bool
	// One scanner reads every body, in place: an event's strings point
	// into its buffer until the next event is read, so what outlives that
	// is copied (the journal, the preamble, heldFailure and
	// responseCreated do).
	sc := sse.NewScanner(nil, g.p.cfg.MaxEventBytes)
	for { // one pass per body: the answer's, then each heal's
		body, conn := g.relayBody(resp)
		sc.Reset(body)
		for sc.Next() {
			ev := sc.Event()
			if concluded {
				if drained += len(ev.Type) + len(ev.Data); drained > maxDrain {
					break
				}
				continue
			}
			det.Observe(ev)
			if !begun && pre.released {
				begun = true // at -preamble-hold, in a read (upstream.Conn.HoldBy)
				if appendErr = pre.err; appendErr != nil {
					break
				}
			}
			if !begun {
				g.p.hooks.sawEvent(g, ev.Data)
				if ev.Type == "response.created" {
					g.responseCreated(ev, det, h, &pre)
				}
				if failedA != nil {
					// The Responses response.failed after its error event.
					if pre.keep(ev); det.Terminal() {
						return g.withUsage(det, pre.failed(*failedA))
					}
					continue
				}
				if streamFailed(det) {
					if a, again := g.heldFailure(ev, head, more); again {
						conn.HoldBy(time.Time{}, nil)
						if a.cause == causeUpstreamAborted || det.Terminal() {
							if a.cause != causeUpstreamAborted {
								pre.keep(ev)
							}
							return g.withUsage(det, pre.failed(a))
						}
						pre.keep(ev)
						failedA = &a
						conn.DrainBy(time.Now().Add(maxDrainTime))
						continue
					}
				} else if !det.Content() && !det.Terminal() && pre.hold(ev, conn) {
					continue
				}
				conn.HoldBy(time.Time{}, nil)
				if appendErr = pre.release(); appendErr != nil {
					break
				}
				begun = true
			}
			terminal := det.Terminal()
			// The terminal event is relayed as it came when the stream is
			// clean or ended as the provider stated it (causeRow.relayEnd:
			// its response.failed, or its [DONE] after a choice the request
			// did not ask for). A malformed one is not, nor one that claims
			// a whole answer when the stream is not ([DONE] with a choice
			// unfinished, say): a client that stops reading at it would take
			// a half stream for a whole one. stream_aborted ends the stream
			// instead.
			relay := true
			if terminal {
				ok, why := det.Clean(false)
				relay = ok || relayEnd(why)
			}
			if relay {
				g.p.hooks.eventJournaled()
				var err error
				if sc.OneLine() {
					_, err = f.AppendLine(ev.Type, ev.Data) // not searched for line breaks
				} else {
					_, err = f.Append(ev.Type, ev.Data)
				}
				if err != nil {
					appendErr = err
					break
				}
				if !pushed {
					// The first event with output goes to the origin now,
					// with the preamble, not after the rest of its read:
					// a whole short stream, its commit included, may lie
					// in that read.
					pushed = true
					g.o.push()
				}
			}
			if terminal {
				c, settled = g.conclude(det, head, nil, nil, false)
				concluded = true
				conn.DrainBy(time.Now().Add(maxDrainTime))
			} else if !failing && det.ErrSeen() && det.Dialect() == sse.DialectOpenAIResponses {
				failing = true
				conn.DrainBy(time.Now().Add(maxDrainTime))
			}
		}
		if err := sc.Err(); err != nil && (!failing || !upstream.IsTimeout(err)) {
			readErr = err
		}
		conn.HoldBy(time.Time{}, nil)
		if failedA != nil {
			return g.withUsage(det, pre.failed(*failedA)) // no response.failed within the drain's bounds
		}
		if concluded {
			return g.withUsage(det, pumped(c, settled))
		}
		if !begun && pre.released {
			begun, appendErr = true, pre.err
		} else if !begun && readErr != nil && h != nil && len(pre.ends) > 0 {
			// A break in the preamble: a stream that can heal goes on
			// from it, as from any event it relayed.
			appendErr, begun = pre.release(), true
		}
		if readErr == nil || appendErr != nil || !begun || h == nil {
			break
		}
		nr, err := g.heal(h, det, readErr)
		if nr == nil {
			readErr = err
			break
		}
		resp, readErr = nr, nil
	}
	if !begun && readErr == nil && appendErr == nil && len(pre.ends) > 0 {
		// The body ended with the preamble held: it goes out with the end.
		appendErr = pre.release()
	}
	// The body ended with its framing intact: its last chunk, or all of
	// its Content-Length (fasthttp fails a read short of either with
	// io.ErrUnexpectedEOF); a body that ends where the connection closed
	// (-2) has no framing to vouch for its end.
	intact := readErr == nil && resp.Header.ContentLength() != -2
	c, settled = g.conclude(det, head, readErr, appendErr, intact)
	return g.withUsage(det, pumped(c, settled))
}

// withUsage is a with what det saw of the upstream's usage, told to the
// call's span too.
func (g *gen) withUsage(det *sse.Detector, a attempt) attempt {
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
func streamFailed(det *sse.Detector) bool {
	_, why := det.Clean(false)
	return why == sse.ReasonErrorEvent || why == sse.ReasonResponseFailed
}

// preamble holds the events of a stream that carry no model output yet,
// copied, so that an error after them is still a failed attempt that no
// client saw.
type preamble struct {
	g        *gen
	det      *sse.Detector
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
	if !p.failure {
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

// relayBody returns resp's body for pump to read, and the connection it
// comes from. Before each read of that connection's socket the origin is
// written what the flight journaled since the last (origin.push): the
// events of one read go out in one write, before the generation may wait
// for the upstream. It is set once per body; drop unsets it.
func (g *gen) relayBody(resp *fasthttp.Response) (io.Reader, *upstream.Conn) {
	conn := upstream.ConnOf(resp)
	if conn != nil {
		conn.SetBeforeRead(g.o.push)
	}
	return bodyOf(resp), conn
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
func (g *gen) conclude(det *sse.Detector, head cache.Head, readErr, appendErr error, intact bool) (c cause, settled bool) {
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

// readFailure is the cause of a failed read of an upstream body.
func readFailure(err error) cause {
	switch {
	case errors.Is(err, sse.ErrEventTooLarge):
		return causeMaxEventBytes
	case errors.Is(err, errBodyTooLarge):
		return causeMaxStreamBytes
	case errors.As(err, new(*healRefused)):
		return causeHealRefused
	case upstream.IsTimeout(err):
		return causeUpstreamIdleTimeout
	default:
		return causeUpstreamReadError
	}
}
