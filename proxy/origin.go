package proxy

import (
	"sync"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
)

// origin is the client whose request started a generation. While it keeps
// up, the generation's own goroutine writes it, right after journaling
// and before it waits for the upstream again, with writes that never
// wait: per event, one goroutine wakes instead of two, and the events of
// one upstream read go out in one write. When the connection does not
// take a write whole (the client is behind), a goroutine of its own takes
// over with what was left, and follows the flight as any joiner does,
// with the slow-client bound; the generation never waits for a client.
type origin struct {
	p      *Proxy
	f      *cache.Flight
	onGone func() // runs when the client goes away (set before the take-over)

	mu      sync.Mutex // guards everything below
	mode    int
	c       *client
	sub     *cache.Sub
	measure bool // the first event's added delay is still to be observed
	idle    bool // nothing was written since the last heartbeat tick
	hb      *time.Timer
}

const (
	originWaiting  = iota // the connection is not taken over yet
	originDirect          // written by the generation
	originFollower        // handed to a goroutine of its own
	originOver            // the answer is over
)

// attach starts writing c, which follows sub, from the generation.
func (o *origin) attach(c *client, sub *cache.Sub) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.c, o.sub, o.measure = c, sub, true
	if c.rc == nil {
		o.handOff(false)
		return
	}
	o.mode = originDirect
	o.hb = time.AfterFunc(o.p.cfg.Heartbeat, o.beat)
	o.flushLocked()
}

// push writes what the flight journaled since the last push. The
// generation calls it before each read of the upstream and after the
// flight ended.
func (o *origin) push() {
	o.mu.Lock()
	if o.mode == originDirect {
		o.flushLocked()
	}
	o.mu.Unlock()
}

// flushLocked writes the client everything it has not had yet, and the
// end of the answer once the flight ended, as far as the connection takes
// it without waiting.
func (o *origin) flushLocked() {
	c := o.c
	for {
		data, ended := o.sub.Read()
		if ended {
			if state, reason, _ := o.f.Outcome(); state != cache.StateCommitted {
				ev := sse.AppendEvent(nil, sse.ID{}, "error", abortEvent(reason, abortMessage(reason)))
				data = append(append(make([]byte, 0, len(data)+len(ev)), data...), ev...)
			}
			if o.offer(data, true) {
				o.over(true)
			}
			return
		}
		if len(data) == 0 && len(c.buf) == 0 {
			return // caught up
		}
		if !o.offer(data, false) || len(data) == 0 {
			return
		}
	}
}

// offer writes p without waiting and reports whether all of it went out;
// if not, the client is handed off or gone.
func (o *origin) offer(p []byte, last bool) bool {
	done, err := o.c.offer(p, last)
	switch {
	case err != nil:
		o.over(false)
		return false
	case !done:
		o.handOff(last)
		return false
	}
	o.idle = false
	if o.measure && len(p) > 0 {
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
	if o.idle && !o.offer(pingComment, false) {
		return
	}
	o.idle = true
	o.hb.Reset(o.p.cfg.Heartbeat)
}
