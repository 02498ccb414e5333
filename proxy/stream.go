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
}

// write sends p and flushes it to the connection.
func (c *client) write(p []byte) error {
	c.stall.Reset(c.slow)
	_, err := c.w.Write(p)
	if err == nil {
		err = c.w.Flush()
	}
	c.stall.Stop()
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
		c := &client{w: w, slow: slow, stall: time.AfterFunc(time.Hour, func() { closeConn(conn) })}
		c.stall.Stop()
		ok := fn(c)
		c.stall.Stop()
		if !ok && onGone != nil {
			onGone()
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
// It returns false when the client went away.
func (p *Proxy) follow(c *client, sub *cache.Sub, f *cache.Flight) bool {
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
