package proxy

import (
	"bytes"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/valyala/fasthttp"
)

// origin is the client whose request started a generation. Its
// connection is taken over before the upstream answers; the generation
// itself then writes it, before each read of the upstream's socket, with
// what the flight journaled since, in writes that never wait. A client
// that falls behind is handed to a goroutine of its own, which writes it
// as a joiner's (a follower: writeFollower); an answer that is not a
// stream is written whole (answerRest). The generation never waits for its client.
type origin struct {
	// Set by newGen, never written again.
	p *Proxy
	g *gen
	f *cache.Flight
	// Set by the request's handler (relay) before the generation starts,
	// never written again: runs when the client goes away.
	onGone func()

	// mu protects the fields below, and the use of c until the mode is
	// final. It is taken by the take-over (attach), the generation (push,
	// answerRaw) and the heartbeat timer (beat).
	mu   sync.Mutex
	mode originMode // moved as originMode says
	// The origin's place in f, taken by newGen before the generation
	// starts (cache.Flight.SubscribeOrigin); never written again.
	sub *cache.Sub
	// Made by newGen for a request that is not a stream's, of a kind
	// whose answers are not all relayed raw, never written again: closed
	// by answerRaw, so that its handler, waiting for the answer
	// (answerInHandler), learns of one relayed raw.
	known chan struct{}
	// Written by the request's handler (relayInHandler), before the
	// take-over: the rest of a raw answer whose read it began.
	rawRest io.Reader
	// Written by the request's handler (serveOrigin), before the take-over.
	method, path string // of the request, for the log of a refusal
	// Written once, by the take-over (attach).
	c *clientConn
	// Written once, by the generation (answerRaw), before it pushes: the
	// upstream's own answer to relay.
	raw *fasthttp.Response
	// Written by whichever goroutine writes the client in mode direct
	// (startLocked, flushLocked, beat): the take-over, the generation or the
	// heartbeat timer.
	measure bool        // the first event's added delay is still to be observed
	idle    bool        // nothing was written since the last heartbeat tick
	hb      *time.Timer // the heartbeat, made by startLocked
}

// originMode is where the origin's answer is. Every move is made under
// origin.mu, by the goroutine named:
//
//	from      to        on                                        by
//	waiting   attached  the connection is taken over              the take-over
//	waiting   other     the answer to a request that is not a     the request's handler
//	                    stream's is whole and small: it goes out
//	                    as the server's own (answerInHandler)
//	attached  direct    the flight has the head of a stream       the take-over or the generation
//	attached  follower  the same, on a connection without         the take-over or the generation
//	                    writes that never wait
//	attached  other     the flight ended without a stream, or     the take-over or the generation
//	                    the upstream's answer is relayed raw
//	direct    follower  a write is not taken whole                the take-over, the generation or the timer
//	direct    over      the end is written, or a write failed     the take-over, the generation or the timer
//
// The move out of attached is decided from one look at the flight
// (Flight.HeadEnded), so a flight that sets its head and ends meanwhile
// never reads as one that ended without a stream. Going direct writes the
// head and the first events at once, which may move on to follower or
// over in the same hold of the lock.
//
// Follower, other and over are final: push and beat do nothing in them,
// and nothing in origin is written again. c then belongs to the goroutine
// the answer went to: the hand-off writer, which got copies of what it
// needs (handOff), or the one that runs answerRest, run or started by the
// goroutine that made the mode other once it let go of the lock.
type originMode uint8

const (
	originWaiting  originMode = iota // the connection is not taken over yet
	originAttached                   // taken over; the answer is not known to be a stream yet
	originDirect                     // a stream, written by the generation
	originFollower                   // a stream, handed to a goroutine of its own
	originOther                      // not a stream: answered by answerRest
	originOver                       // the answer is over
)

var originModes = [...]string{
	originWaiting:  "waiting",
	originAttached: "attached",
	originDirect:   "direct",
	originFollower: "follower",
	originOther:    "other",
	originOver:     "over",
}

func (m originMode) String() string {
	if int(m) < len(originModes) {
		return originModes[m]
	}
	return "originMode(" + strconv.Itoa(int(m)) + ")"
}

// serveOrigin answers the request that started g. A stream's takes its
// connection over now, before the upstream answers. One that is not a
// stream's waits for its answer on the request's own goroutine, which
// then answers as the server's own answer when it is whole and small
// (answerInHandler): no take-over, and the connection's next request is
// read on the same goroutine; otherwise it is taken over then. Its place
// in the flight was taken before the generation started (newGen):
// nothing can refuse it.
func (p *Proxy) serveOrigin(ctx *fasthttp.RequestCtx, g *gen) {
	o := g.o
	o.mu.Lock()
	o.method, o.path = string(ctx.Method()), string(ctx.Path())
	o.mu.Unlock()
	if o.known != nil && o.answerInHandler(ctx) {
		return
	}
	p.takeOver(ctx, false, o.attach)
}

// answerInHandler waits until the answer to a request that is not a
// stream's is known: the flight's head, its end, or the upstream's answer
// relayed raw (answerRaw). It answers on ctx, and reports true, when the
// answer is the flight's end with a body of at most writePiece bytes, or
// a raw answer whose head says a length of at most that (relayInHandler).
// It reports false, having answered nothing, for a stream (the upstream
// may answer one to such a request), a raw answer without a length or to
// a HEAD, and a larger answer: the take-over writes those, as it does a
// stream's. A kind whose every answer is relayed raw (kind.raw: MCP's)
// never waits here (newGen makes no known for it): its answer may be a
// stream, and it watches its client once taken over.
//
// The write has one deadline, -slow-client-timeout ahead, as the
// take-over's has for each writePiece bytes; and a client that goes away
// meanwhile is noticed at the write, as it is there.
func (o *origin) answerInHandler(ctx *fasthttp.RequestCtx) bool {
	// From now until the server is done with the connection, this answer
	// is one a shutdown waits for: written here, or taken over (whose
	// count begins before the take-over ends this one).
	o.p.handing(ctx)
	f := o.f
	head := f.HeadReady()
	for {
		select {
		case <-head:
		case <-f.Done():
		case <-o.known:
		}
		o.mu.Lock()
		h, hasHead, ended := f.HeadEnded()
		switch resp := o.raw; {
		case resp != nil:
			if ctx.IsHead() || noBody(resp.StatusCode()) ||
				resp.Header.ContentLength() < 0 || resp.Header.ContentLength() > writePiece {
				o.mu.Unlock()
				return false
			}
			o.mu.Unlock()
			return o.relayInHandler(ctx, resp)
		case hasHead && h.Stream:
			o.mu.Unlock()
			return false
		case ended:
			e := flightEnded(f)
			if len(e.body) > writePiece {
				o.mu.Unlock()
				return false
			}
			o.mode = originOther
			refused := fillEnded(&ctx.Response, e, nil, false, resumeURL(ctx), true) // a copy: the flight's place is given back
			o.sub.Close()
			o.mu.Unlock()
			o.p.answered(ctx)
			if refused != nil {
				o.p.logRefused(refused, o.method, o.path)
			}
			return true
		}
		o.mu.Unlock()
		if hasHead {
			head = nil // a whole answer's head: its end comes next
		}
	}
}

// relayInHandler answers ctx with resp, the upstream's answer relayed
// raw, read whole first (its head said a length of at most writePiece
// bytes), and ends the generation. A body cut short of that length is
// left to the take-over, which relays what came and then ends the
// connection where it was cut (rawRest); it reports false then.
func (o *origin) relayInHandler(ctx *fasthttp.RequestCtx, resp *fasthttp.Response) bool {
	body, err := readUpTo(bodyOf(resp), resp.Header.ContentLength(), writePiece)
	o.mu.Lock()
	if err != nil {
		o.rawRest = io.MultiReader(bytes.NewReader(body), errReader{err})
		o.mu.Unlock()
		return false
	}
	o.mode = originOther
	o.sub.Close()
	o.mu.Unlock()
	setHead(&ctx.Response.Header, copyHead(resp), false)
	ctx.Response.SetBodyRaw(body) // read into a buffer of its own
	o.p.hooks.wrote(len(body))
	o.p.answered(ctx)
	resp.CloseBodyStream() //nolint:errcheck // read to its end
	fasthttp.ReleaseResponse(resp)
	o.g.finish()
	return true
}

// errReader is a reader that fails with its error.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// answered readies the answer set on ctx for the server to write: the
// write is bounded by -slow-client-timeout, and during a drain the
// connection closes after it (Handler said so, but a failure's answer
// starts afresh: fillError).
func (p *Proxy) answered(ctx *fasthttp.RequestCtx) {
	if p.draining.Load() {
		ctx.SetConnectionClose()
	}
	ctx.SetWriteDeadline(time.Now().Add(p.cfg.SlowClientTimeout)) //nolint:errcheck // a connection that fails it is gone, and the write says so
}

// attach is the take-over's callback: the origin's answer starts on c as
// far as the flight is known.
func (o *origin) attach(c *clientConn) {
	o.mu.Lock()
	o.c, o.mode = c, originAttached
	rest := o.advanceLocked()
	waiting := !rest && o.mode == originAttached
	o.mu.Unlock()
	if rest {
		o.answerRest()
		return
	}
	if waiting && o.f.Gen != 0 && o.p.storeEnds {
		// The generation pushes once it has a head or an end, but a store
		// can end the flight while the generation still awaits the head
		// (Redis unreachable for a lease fences it): its client is
		// answered then, with the outcome-unknown answer, not when the
		// upstream answers or -head-timeout passes. The wait ends with the
		// head, so nothing lives on through the stream. A flight without
		// a key has no store to end it, and may never get a head (an
		// answer relayed raw), nor has one of the in-memory store, which
		// ends none itself: nothing waits for them.
		o.p.work.run(func() {
			<-o.f.HeadReady()
			o.push()
		})
	}
}

// advanceLocked, once the connection is taken over and until the answer
// is known, starts a streamed answer as soon as the flight has its head,
// and reports true, having made the answer originOther, when the answer
// is known not to be a stream and can be written whole (answerRest).
// Nothing waits for the answer: the take-over calls it once, and the
// generation again whenever it pushes.
func (o *origin) advanceLocked() bool {
	h, hasHead, ended := o.f.HeadEnded()
	if o.raw == nil {
		if hasHead && h.Stream {
			if ended {
				h = endedHead(o.f, h)
			}
			o.startLocked(h)
			return false
		}
		if !ended {
			return false
		}
	}
	o.mode = originOther
	o.sub.Close()
	return true
}

// startLocked starts writing a streamed answer with the head h.
func (o *origin) startLocked(h cache.Head) {
	o.c.answerHead(h)
	o.measure = true
	if o.c.rc == nil {
		o.handOff(false)
		return
	}
	o.mode = originDirect
	o.flushLocked() // the head and the first events, before the timer's cost
	if o.mode == originDirect {
		o.hb = time.AfterFunc(o.p.cfg.Heartbeat, o.beat)
	}
}

// answerRest writes an answer that is not a stream (an error, a
// non-streaming answer, or what the upstream answered to a request
// without a key that was not an event stream), once advanceLocked found
// it known.
func (o *origin) answerRest() {
	p, g, f, c := o.p, o.g, o.f, o.c
	if resp := o.raw; resp != nil {
		// A body that ends where the upstream closed the connection is
		// relayed the same way: re-framed, a cut in it would pass for
		// its end. Framed ones are re-framed, and a cut in them ends the
		// client's answer without its last chunk (copyBody).
		// An answer without a body (to a HEAD, a 204, a 304) is its head
		// alone, however a body would have been framed; a HEAD's says the
		// upstream's length.
		if !c.head && !noBody(resp.StatusCode()) {
			c.identity = c.identity || resp.Header.ContentLength() == -2 // (an HTTP/1.0 client's is already)
		}
		c.answerHeadSized(copyHead(resp), resp.Header.ContentLength())
		var stop func() bool
		if g.kind.raw {
			stop = cancelOnDeparture(c, resp)
		}
		body, size := bodyOf(resp), resp.Header.ContentLength()
		if o.rawRest != nil {
			body, size = o.rawRest, -1 // what relayInHandler read, and how its read ended
		}
		ok := copyBody(c, body, size)
		if stop != nil {
			ok = !stop() && ok
		}
		resp.CloseBodyStream() //nolint:errcheck // done with the body
		fasthttp.ReleaseResponse(resp)
		g.finish()
		c.finish(ok, nil)
		return
	}
	e := flightEnded(f)
	e.body = bytes.Clone(e.body) // the flight's, which its origin gave back (advanceLocked)
	if refused := p.answerEnded(c, e, nil); refused != nil {
		p.logRefused(refused, o.method, o.path)
	}
}

// answerRaw gives the origin the upstream's answer to a request without a
// key that is not an event stream, to relay as it is; the generation has
// handed its end over with it.
func (o *origin) answerRaw(resp *fasthttp.Response) {
	o.mu.Lock()
	o.raw = resp
	o.mu.Unlock()
	if o.known != nil {
		close(o.known)
	}
	o.push()
}

// push writes what the flight journaled since the last push. The
// generation calls it before each read of the upstream's socket
// (pumping.read); an answer that is not a stream, once known, is written
// on a goroutine of its own.
func (o *origin) push() {
	if o.advance() {
		go o.answerRest()
	}
}

// advance is push, except that an answer known not to be a stream is
// left to the caller, to write with answerRest, and reported; but the
// upstream's answer relayed raw, which the generation handed over with
// its end (answerRaw), is relayed here.
func (o *origin) advance() (rest bool) {
	o.mu.Lock()
	switch o.mode {
	case originAttached:
		rest = o.advanceLocked()
	case originDirect:
		o.flushLocked()
	}
	raw := o.raw != nil
	o.mu.Unlock()
	if rest && raw {
		o.answerRest()
		return false
	}
	return rest
}

// flushLocked writes the client everything it has not had yet, and the
// end of the answer once the flight ended, as far as the connection takes
// it without waiting (deliver).
func (o *origin) flushLocked() {
	d := deliver(o.c, o.sub, o.f, false, nil)
	if d.wrote {
		o.idle = false
	}
	if o.measure && d.events {
		o.measure = false
		o.p.hooks.firstFlushed(o.f)
	}
	switch {
	case d.err == errBehind:
		o.handOff(d.ended)
	case d.err != nil:
		o.over(false)
	case d.ended:
		o.over(true)
	}
}

// handOff gives the client to a goroutine of its own, which first writes
// what the last write left and then makes it a follower (writeFollower);
// ended: that was the end of the answer.
func (o *origin) handOff(ended bool) {
	o.mode = originFollower
	o.stopBeat()
	o.p.hooks.clientBehind()
	c, sub, f, measure, onGone := o.c, o.sub, o.f, o.measure, o.onGone
	go func() {
		ok := c.flush() == nil
		if ok && !ended {
			ok = o.p.writeFollower(c, sub, f, measure, nil) && c.end() == nil
		} else {
			sub.Close()
		}
		c.finish(ok, onGone)
	}()
}

// over ends the answer the generation was writing.
func (o *origin) over(ok bool) {
	o.mode = originOver
	o.stopBeat()
	o.sub.Close()
	o.c.finish(ok, o.onGone)
}

func (o *origin) stopBeat() {
	if o.hb != nil {
		o.hb.Stop()
	}
}

// beat writes a heartbeat comment when nothing else was written for one
// heartbeat interval, so that idle connections stay open.
func (o *origin) beat() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.mode != originDirect {
		return
	}
	if o.idle {
		switch done, err := o.c.offer(false, pingComment); {
		case err != nil:
			o.over(false)
			return
		case !done:
			o.handOff(false)
			return
		}
	}
	o.idle = true
	o.hb.Reset(o.p.cfg.Heartbeat)
}
