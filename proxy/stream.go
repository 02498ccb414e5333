package proxy

import (
	"bufio"
	"net"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// client is the writing end of one streamed answer. A write that the
// client's connection does not accept within SlowClientTimeout closes the
// connection: a stalled client is dropped, never waited on.
type client struct {
	w     *bufio.Writer
	stall *time.Timer
	slow  time.Duration
	m     *metrics
}

// write sends p and flushes it to the connection.
func (c *client) write(p []byte) error {
	c.stall.Reset(c.slow)
	_, err := c.w.Write(p)
	if err == nil {
		err = c.w.Flush()
	}
	c.stall.Stop()
	if err == nil {
		c.m.clientBytes.Add(float64(len(p)))
	}
	return err
}

// stream answers with a body written by fn from fasthttp's stream writer.
// fn reports whether the client is still there; onGone runs when not.
// Everything fn needs must be copied out of ctx before this call.
func (p *Proxy) stream(ctx *fasthttp.RequestCtx, fn func(*client) bool, onGone func()) {
	ctx.Response.ImmediateHeaderFlush = true
	conn := ctx.Conn()
	slow := p.cfg.SlowClientTimeout
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		m := p.m
		c := &client{w: w, slow: slow, m: m, stall: time.AfterFunc(time.Hour, func() {
			m.slowDropped.Inc()
			closeConn(conn)
		})}
		c.stall.Stop()
		ok := fn(c)
		c.stall.Stop()
		if !ok {
			m.clientsGone.Inc()
			if onGone != nil {
				onGone()
			}
		}
	})
}

func closeConn(c net.Conn) {
	if c != nil {
		c.Close() //nolint:errcheck // dropping a stalled client
	}
}

var pingComment = sse.AppendComment(nil, "ping")

// follow writes a flight's events to c as they come, with a heartbeat
// while idle, and ends the stream as the flight ends: after the last event
// when it was committed, with a stream_aborted error event when it was not.
// It returns false when the client went away. With measure set, the delay
// between journaling the first event and flushing it here is observed.
func (p *Proxy) follow(c *client, sub *cache.Sub, f *cache.Flight, measure bool) bool {
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
		data, ended := sub.Read()
		if len(data) > 0 {
			if c.write(data) != nil {
				return false
			}
			if measure {
				measure = false
				if t := f.FirstEventAt(); !t.IsZero() {
					p.m.ttfeAdded.Observe(time.Since(t).Seconds())
				}
			}
		}
		if ended {
			state, reason, _ := f.Outcome()
			if state != cache.StateCommitted {
				ev := sse.AppendEvent(nil, sse.ID{}, "error", abortEvent(reason, abortMessage(reason)))
				return c.write(ev) == nil
			}
			return true
		}
		hb.Reset(p.cfg.Heartbeat)
	}
}

// saved counts the tokens of an answer served without a new generation.
func (p *Proxy) saved(u cache.Usage) {
	if u.Input > 0 {
		p.m.tokensSaved.WithLabelValues("input").Add(float64(u.Input))
	}
	if u.Output > 0 {
		p.m.tokensSaved.WithLabelValues("output").Add(float64(u.Output))
	}
}
