package proxy

import (
	"errors"
	"net"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

var pingComment = sse.AppendComment(nil, "ping")

// deliver writes c what sub has not had yet: the journal's spans at hand,
// a batch per write, the head alone when there are none, and once the
// flight ended, the frame that ends its stream (endFrame). With a
// rewrite (only with wait), the client is given its own copy of them
// instead (rewrite). With wait,
// each write waits within -slow-client-timeout (a follower's goroutine,
// whose caller writes the end of the body); without, none waits (the
// origin's, written by the generation: the end of the body goes with the
// last), and one the connection does not take whole stops it with
// errBehind, the rest left in c.vec. It returns once caught up, at the
// flight's end, or at a failed write.
func deliver(c *clientConn, sub *cache.Sub, f *cache.Flight, wait bool, rw *rewriter) (d delivery) {
	for {
		// On the stack, so that nothing keeps the spans once written.
		var at [maxParts][]byte
		spans, ended := sub.ReadSpans(at[:0])
		d.ended = ended
		if rw != nil {
			spans = rw.rewrite(spans, ended, f)
		} else if ended {
			// An answer that came whole and was not kept (its commit
			// refused) ends as it came: the client has it.
			state, reason, _ := f.Outcome()
			if end := endFrame(state, reason); end != nil && !f.Unstored() {
				spans = append(spans, end)
			}
		}
		if ended {
			if wait && len(spans) == 0 {
				return d
			}
		} else if len(spans) == 0 && len(c.buf) == 0 {
			return d // caught up
		}
		if wait {
			d.err = c.send(false, spans...)
		} else if done, err := c.offer(ended, spans...); err != nil {
			d.err = err
		} else if !done {
			d.err = errBehind
		}
		if d.err != nil {
			return d
		}
		d.wrote = true
		d.events = d.events || len(spans) > 0
		if ended || len(spans) == 0 { // the end, or the head alone so that the client sees the answer start
			return d
		}
	}
}

// delivery is what deliver wrote.
type delivery struct {
	ended  bool  // the flight ended: what ends its stream was in the last write
	wrote  bool  // a write went out whole
	events bool  // journal spans went out
	err    error // the write that failed: errBehind, or the client is gone
}

// A rewrite makes one client's own copy of a journal: its events as that
// client is given them (a tool call's caller: each message under its own
// JSON-RPC id, progress token and session), and the end of its stream.
type rewrite interface {
	events(dst, wire []byte) []byte
	end(dst []byte, state cache.State, reason string) []byte
}

// rewriter applies a rewrite to what a follower delivers, into a buffer
// of its own that the follower's goroutine reuses once a write is done.
type rewriter struct {
	rw  rewrite
	buf []byte
}

// rewrite is spans, the journal's and then its end once ended, as the
// rewrite gives them; none when the rewrite left every event out.
func (r *rewriter) rewrite(spans [][]byte, ended bool, f *cache.Flight) [][]byte {
	r.buf = r.buf[:0]
	for _, s := range spans {
		r.buf = r.rw.events(r.buf, s)
	}
	if ended {
		state, reason, _ := f.Outcome()
		r.buf = r.rw.end(r.buf, state, reason)
	}
	if len(r.buf) == 0 {
		return spans[:0]
	}
	return append(spans[:0], r.buf)
}

// errBehind stops a delivery whose write that never waits the connection
// did not take whole: the client is behind.
var errBehind = errors.New("the client is behind")

// writeFollower writes a flight's events to its follower c as they come,
// with a heartbeat while idle, and ends the stream as the flight ends:
// after the last event when it was committed, with a stream_aborted error
// event when it was not, or as rw says when the client is given its own
// copy (nil: the journal's). It returns false when the client went away.
// With measure set, the delay between journaling the first event and
// writing it here is observed.
func (p *Proxy) writeFollower(c *clientConn, sub *cache.Sub, f *cache.Flight, measure bool, rw rewrite) bool {
	var r *rewriter
	if rw != nil {
		r = &rewriter{rw: rw}
	}
	return p.follow(c, sub, func() (end, ok bool) {
		d := deliver(c, sub, f, true, r)
		if measure && d.events {
			measure = false
			p.hooks.firstFlushed(f)
		}
		return d.ended || d.err != nil, d.err == nil
	})
}

// follow calls step each time sub may have something new, until it
// says the answer's end (or a failed write: ok false), and writes c a
// heartbeat comment while idle. It reports false when the client went
// away.
func (p *Proxy) follow(c *clientConn, sub *cache.Sub, step func() (end, ok bool)) bool {
	defer sub.Close()
	hb := time.NewTimer(p.cfg.Heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-sub.C():
		case <-hb.C:
			if c.write(pingComment) != nil {
				return false
			}
			hb.Reset(p.cfg.Heartbeat)
			continue
		}
		if end, ok := step(); end {
			return ok
		}
		hb.Reset(p.cfg.Heartbeat)
	}
}

// awaits reports whether a client of flight f waits (await) rather than
// being answered at once: the answer's head is still to come, whether
// the request asked to stream or not, or the answer is known not to be a
// stream and its whole body is awaited. A head may take -head-timeout, a
// whole answer the whole -attempt-timeout: no client waits that long
// without its place counted, nor after it hung up.
func (p *Proxy) awaits(f *cache.Flight) bool {
	h, hasHead, ended := f.HeadEnded()
	if hasHead || ended {
		return hasHead && !h.Stream
	}
	return true
}

// await answers a client that joined flight f and waits for its head or
// its whole answer. It counts among the flight's followers
// (-max-followers) from its start, and waits on a connection taken over
// from fasthttp, not on one of its workers; a client that closes its
// connection while it waits is noticed at once (watchDeparture) and
// leaves, giving back its place. An answer that turns out to be a stream
// is followed as serveFlight's.
func (p *Proxy) await(ctx *fasthttp.RequestCtx, f *cache.Flight, after uint64, replayed bool) {
	sub, ok := p.subscribe(ctx, f, after)
	if !ok {
		return
	}
	method, path := string(ctx.Method()), string(ctx.Path())
	p.waitFlight(ctx, f, sub, replayed, func(c *clientConn, h cache.Head) {
		if _, _, ended := f.HeadEnded(); ended {
			h = endedHead(f, h) // it can say how it ended, as serveFlight's
		}
		c.answerHead(h)
		done := p.writeFollower(c, sub, f, !replayed, nil)
		if done && replayed {
			if st, _, _ := f.Outcome(); st == cache.StateCommitted {
				p.hooks.saved(f.Usage())
			}
		}
		c.finish(done && c.end() == nil, nil)
	}, func(c *clientConn) {
		e := flightEnded(f)
		if replayed && e.state == cache.StateCommitted {
			p.hooks.saved(f.Usage())
		}
		if refused := p.answerEnded(c, e, nil); refused != nil {
			p.logRefused(refused, method, path)
		}
	})
}

// finalAnswer is the whole answer of a flight that ended, or of a stored
// result, that a client is given at once: the head, when one came, the
// state and reason of the end, and the body (the result, or the
// upstream's error answer relayed), nil when there is none.
type finalAnswer struct {
	head     cache.Head
	hasHead  bool
	state    cache.State
	reason   string
	body     []byte
	unstored bool // it came whole and the store refused it (Flight.Unstored)
}

// flightEnded is the whole answer of the ended flight f.
func flightEnded(f *cache.Flight) finalAnswer {
	h, ok := f.Head()
	state, reason, body := f.Outcome()
	return finalAnswer{head: h, hasHead: ok, state: state, reason: reason, body: body, unstored: f.Unstored()}
}

// resultEnded is the whole answer of the stored result r, whose body is
// body.
func resultEnded(r *cache.Result, body []byte) finalAnswer {
	return finalAnswer{head: r.Head, hasHead: true, state: cache.StateCommitted, body: body}
}

// answerEnded writes e to c whole, as every client that is not given a
// stream is answered, and finishes c: the head and the body as they
// came, marked with the outcome (outcomeHead) and, once committed, the
// key's resume URL; the failure's answer when e has nothing to relay. A
// tool call's caller tc is given its own copy (toolCaller.head,
// toolCaller.message), and the outcome-unknown answer of its protocol.
// It returns the failure's answer it wrote, if it did, for the caller to
// log (logRefused).
func (p *Proxy) answerEnded(c *clientConn, e finalAnswer, tc *toolCaller) (refused *apiError) {
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	refused = fillEnded(resp, e, tc, c.replayed, c.resumeURL, false)
	c.finish(c.answerWhole(resp) == nil, nil)
	return refused
}

// fillEnded puts the answer answerEnded writes into resp, and returns the
// failure's answer when it is one. With copied, resp holds a copy of the
// body, not the body itself.
func fillEnded(resp *fasthttp.Response, e finalAnswer, tc *toolCaller, replayed bool, resume string, copied bool) (refused *apiError) {
	switch {
	case tc != nil && e.state == cache.StateCommitUnknown:
		fillUnknown(resp, tc)
	case e.failed():
		refused = failedAnswer(e.state, e.reason)
		fillError(resp, refused)
	default:
		h, body := e.head, e.body
		if tc != nil {
			h = tc.head(h)
			if isJSON(h.ContentType) || e.state == cache.StateCommitted {
				body, _ = tc.message(body)
			}
		}
		setHead(&resp.Header, h, replayed)
		outcomeHead(&resp.Header, e.state, e.unstored)
		if resume != "" && e.state == cache.StateCommitted {
			resp.Header.Set(resumeURLHeader, resume)
		}
		if copied {
			resp.SetBody(body)
		} else {
			resp.SetBodyRaw(body) // the body is not changed, only written
		}
	}
	return refused
}

// failed reports whether e has no answer to relay: no head came, or no
// body with it and no result.
func (e finalAnswer) failed() bool {
	return !e.hasHead || (e.body == nil && e.state != cache.StateCommitted)
}

// waitFlight answers, on its own connection, a client that waits for
// flight f, which sub follows: stream once f's head is a stream's, or
// whole once f ended (answerEnded). Either must finish c.
// The wait counts among the flight's followers, and a client that closes
// its connection meanwhile is noticed at once (watchDeparture) and
// leaves, giving back its place.
func (p *Proxy) waitFlight(ctx *fasthttp.RequestCtx, f *cache.Flight, sub *cache.Sub, replayed bool,
	stream func(c *clientConn, h cache.Head), whole func(c *clientConn)) {
	p.takeOver(ctx, false, func(c *clientConn) {
		c.replayed = replayed
		gone, stop := watchDeparture(c)
		until := func(ch <-chan struct{}) bool {
			select {
			case <-ch:
				return true
			case <-gone:
				sub.Close()
				stop()
				c.finish(false, nil)
				return false
			}
		}
		if !until(f.HeadReady()) {
			return
		}
		h, ok := f.Head()
		if ok && h.Stream {
			stop()
			stream(c, h)
			return
		}
		if !until(f.Done()) {
			return
		}
		sub.Close()
		stop()
		whole(c)
	})
}

// subscribe follows flight f from the event after seq after; when it
// cannot (a position the stream has not reached, -max-followers), it
// answers why and reports false.
func (p *Proxy) subscribe(ctx *fasthttp.RequestCtx, f *cache.Flight, after uint64) (*cache.Sub, bool) {
	sub, err := f.Subscribe(after)
	if err == nil {
		return sub, true
	}
	switch {
	case errors.Is(err, cache.ErrPosition):
		p.writeError(ctx, causeInvalidLastEventID.err("it names an event this stream has not sent"))
	case errors.Is(err, cache.ErrTooManyFollowers):
		p.writeError(ctx, causeMaxFollowers.err(""))
	default:
		p.writeError(ctx, causeStoreUnavailable.err(""))
	}
	return nil, false
}

// maxAhead bounds what watchDeparture keeps of what a client sends while
// it waits (a pipelined next request); past it, it stops watching.
const maxAhead = 64 << 10

// watchDeparture reads c's connection while its client waits for an
// answer, which fasthttp cannot tell of (PITFALLS.md, fasthttp server):
// gone is closed when the client closes the connection (or it fails).
// What the client sends meanwhile (its next request) is kept for the
// connection's next request (c.pre). stop ends the watch before the
// answer is written, and reports whether the client went.
func watchDeparture(c *clientConn) (gone <-chan struct{}, stop func() bool) {
	g := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		var buf [512]byte
		for len(c.pre) < maxAhead {
			n, err := c.conn.Read(buf[:])
			c.pre = append(c.pre, buf[:n]...)
			if err != nil {
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					close(g)
				}
				return
			}
		}
	}()
	return g, func() bool {
		c.conn.SetReadDeadline(time.Now()) //nolint:errcheck // a connection that fails it is gone, and the write says so
		<-ended
		c.conn.SetReadDeadline(time.Time{}) //nolint:errcheck // as above
		select {
		case <-g:
			return true
		default:
			return false
		}
	}
}

// cancelOnDeparture closes the upstream connection of resp, whose body
// is being relayed to c, as soon as c's client closes its connection, so
// that the server sees the call cancelled at once rather than at a write
// that fails (an MCP server's stream may be silent for long). stop ends
// the watch and reports whether the client went.
func cancelOnDeparture(c *clientConn, resp *fasthttp.Response) (stop func() bool) {
	gone, stopWatch := watchDeparture(c)
	over := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		select {
		case <-gone:
			upstream.Interrupt(resp)
		case <-over:
		}
	}()
	return func() bool {
		close(over)
		<-ended
		return stopWatch()
	}
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
