package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/valyala/fasthttp"
)

// origin is the client whose request started a generation. Its
// connection is taken over as soon as the upstream call starts, so that
// the generation's own goroutine can write the answer's head with the
// first event, and the events it journaled whenever it is about to read
// the upstream's socket again: no other goroutine wakes between the
// upstream's event and the client's, and the events of one upstream read
// go out in one write. These writes never wait. When the connection does not take a
// write whole (the client is behind), a goroutine of its own takes over
// with what was left and follows the flight as any joiner does, with the
// slow-client bound: the generation never waits for a client. An answer
// that is not an event stream is written whole (answerRest) by the
// goroutine that took the connection over when it is known by then, or
// else by one the generation starts when it learns it: nothing waits for
// the answer, so the head of a stream wakes no other goroutine.
type origin struct {
	p      *Proxy
	g      *gen
	f      *cache.Flight
	onGone func() // runs when the client goes away (set before the take-over)

	mu           sync.Mutex // guards everything below
	mode         int
	c            *client
	sub          *cache.Sub
	method, path string // of the request, for the log of a refusal
	measure      bool   // the first event's added delay is still to be observed
	idle         bool   // nothing was written since the last heartbeat tick
	hb           *time.Timer
	raw          *fasthttp.Response // the upstream's own answer to relay (answerRaw)
}

// testHookAdvance, set by a test, runs in advanceLocked between its look
// at whether the flight ended and its look at the head.
var testHookAdvance atomic.Pointer[func(*cache.Flight)]

// maxParts bounds the journal spans one write to a client gathers.
const maxParts = 4

const (
	originWaiting  = iota // the connection is not taken over yet
	originAttached        // taken over; the answer is not known to be a stream yet
	originDirect          // a stream, written by the generation
	originFollower        // a stream, handed to a goroutine of its own
	originOther           // not a stream: answered by answerRest
	originOver            // the answer is over
)

// serveOrigin answers the request that started g: its connection is
// taken over now, before the upstream answers.
func (p *Proxy) serveOrigin(ctx *fasthttp.RequestCtx, g *gen) {
	o := g.o
	sub, err := g.f.Subscribe(0)
	if err != nil {
		if o.onGone != nil {
			o.onGone()
		}
		p.writeError(ctx, causeMaxFollowers.err(""))
		return
	}
	o.mu.Lock()
	o.sub, o.method, o.path = sub, string(ctx.Method()), string(ctx.Path())
	o.mu.Unlock()
	p.takeOver(ctx, false, func(c *client) {
		o.mu.Lock()
		o.c, o.mode = c, originAttached
		rest := o.advanceLocked()
		o.mu.Unlock()
		if rest {
			o.answerRest()
		}
	})
}

// advanceLocked, once the connection is taken over and until the answer
// is known, starts a streamed answer as soon as the flight has its head,
// and reports true, having made the answer originOther, when the answer
// is known not to be a stream and can be written whole (answerRest).
// Nothing waits for the answer: the goroutine that took the connection
// over calls it once, and the generation again whenever it pushes.
func (o *origin) advanceLocked() bool {
	ended := false
	select {
	case <-o.f.Done():
		ended = true
	default:
	}
	// Whether the flight ended is taken before its head: a flight that
	// sets its head and ends in between must not pass for one that ended
	// without a stream.
	if hook := testHookAdvance.Load(); hook != nil {
		(*hook)(o.f)
	}
	if o.raw == nil {
		if h, ok := o.f.Head(); ok && h.Stream {
			o.startLocked()
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

// startLocked starts writing a streamed answer once the flight has the
// head of one.
func (o *origin) startLocked() {
	h, ok := o.f.Head()
	if !ok || !h.Stream {
		return
	}
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
		c.identity = c.identity || resp.Header.ContentLength() == -2 // (an HTTP/1.0 client's is already)
		c.answerHead(copyHead(resp))
		ok := copyBody(c, bodyOf(resp)) && c.end() == nil
		resp.CloseBodyStream() //nolint:errcheck // done with the body
		fasthttp.ReleaseResponse(resp)
		g.finish()
		c.finish(ok, nil)
		return
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	var refused *apiError
	state, reason, body := f.Outcome()
	if h, ok := f.Head(); !ok {
		refused = failedAnswer(reason)
	} else if body == nil && state != cache.StateCommitted {
		refused = failedAnswer(reason)
	} else {
		setHead(&resp.Header, h, false)
		resp.SetBody(body)
	}
	if refused != nil {
		fillError(resp, refused)
		p.logRefused(refused, o.method, o.path)
	}
	c.finish(c.answerWhole(resp) == nil, nil)
}

// answerRaw gives the origin the upstream's answer to a request without a
// key that is not an event stream, to relay as it is; the generation has
// handed its end over with it.
func (o *origin) answerRaw(resp *fasthttp.Response) {
	o.mu.Lock()
	o.raw = resp
	o.mu.Unlock()
	o.push()
}

// push writes what the flight journaled since the last push. The
// generation calls it before each read of the upstream's socket
// (idleConn.beforeRead) and after the flight ended.
func (o *origin) push() {
	o.mu.Lock()
	rest := false
	switch o.mode {
	case originAttached:
		rest = o.advanceLocked()
	case originDirect:
		o.flushLocked()
	}
	o.mu.Unlock()
	if rest {
		go o.answerRest()
	}
}

// flushLocked writes the client everything it has not had yet, and the
// end of the answer once the flight ended, as far as the connection takes
// it without waiting: all the journal spans at hand in one write.
func (o *origin) flushLocked() {
	c := o.c
	for {
		// On the stack, so that nothing keeps the spans once written.
		var at [maxParts][]byte
		spans, ended := o.sub.ReadSpans(at[:0])
		if ended {
			if state, reason, _ := o.f.Outcome(); state != cache.StateCommitted {
				spans = append(spans, abortFrame(reason))
			}
			if o.offer(true, spans...) {
				o.over(true)
			}
			return
		}
		if len(spans) == 0 && len(c.buf) == 0 {
			return // caught up
		}
		if !o.offer(false, spans...) || len(spans) == 0 {
			return
		}
	}
}

// offer writes parts without waiting and reports whether all of it went
// out; if not, the client is handed off or gone.
func (o *origin) offer(last bool, parts ...[]byte) bool {
	done, err := o.c.offer(last, parts...)
	switch {
	case err != nil:
		o.over(false)
		return false
	case !done:
		o.handOff(last)
		return false
	}
	o.idle = false
	if o.measure && len(parts) > 0 {
		o.measure = false
		if t := o.f.FirstEventAt(); !t.IsZero() {
			o.p.m.ttfeAdded.Observe(time.Since(t).Seconds())
		}
	}
	return true
}

// handOff gives the client to a goroutine of its own, which first writes
// what the last offer left; ended: that was the end of the answer.
func (o *origin) handOff(ended bool) {
	o.mode = originFollower
	o.stopBeat()
	o.p.m.originHandoffs.Inc()
	c, sub, f, measure, onGone := o.c, o.sub, o.f, o.measure, o.onGone
	go func() {
		ok := c.flush() == nil
		if ok && !ended {
			ok = o.p.follow(c, sub, f, measure) && c.end() == nil
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
	if o.idle && !o.offer(false, pingComment) {
		return
	}
	o.idle = true
	o.hb.Reset(o.p.cfg.Heartbeat)
}
