package proxy

import (
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// client is the writing end of one streamed answer: the client's own
// connection, taken over from fasthttp, written with HTTP/1.1 chunked
// framing, one write per batch of events. A write that the connection does
// not accept within SlowClientTimeout fails: a stalled client is dropped,
// never waited on. Taking the connection over, rather than fasthttp's body
// stream writer, saves a goroutine, a pipe and a copy per event.
type client struct {
	conn    net.Conn
	slow    time.Duration
	m       *metrics
	buf     []byte // the answer head until it is written, then chunk frames
	vec     net.Buffers
	stalled bool
	set     time.Time // the write deadline last set
}

// smallChunk is the size up to which a chunk is copied into one buffer
// for one write; larger ones are written from where they are.
const smallChunk = 16 << 10

// write sends p as one chunk (with the answer head before the first).
func (c *client) write(p []byte) error {
	var err error
	if len(p) > 0 {
		c.buf = appendChunkHeader(c.buf, len(p))
	}
	// As for reads (idleConn): move the deadline only when it is stale.
	if d := time.Now().Add(c.slow); d.Sub(c.set) > c.slow/16 {
		if err = c.conn.SetWriteDeadline(d); err != nil {
			return err
		}
		c.set = d
	}
	switch {
	case len(p) == 0:
		_, err = c.conn.Write(c.buf)
	case len(p) <= smallChunk:
		c.buf = append(c.buf, p...)
		c.buf = append(c.buf, "\r\n"...)
		_, err = c.conn.Write(c.buf)
	default:
		c.vec = append(c.vec[:0], c.buf, p, crlf)
		_, err = c.vec.WriteTo(c.conn)
	}
	c.buf = c.buf[:0]
	if err != nil {
		var ne net.Error
		c.stalled = errors.As(err, &ne) && ne.Timeout()
		return err
	}
	c.m.clientBytes.Add(float64(len(p)))
	return nil
}

var crlf = []byte("\r\n")

// end writes the last chunk: the answer is complete.
func (c *client) end() {
	c.buf = append(c.buf, "0\r\n\r\n"...)
	if c.conn.SetWriteDeadline(time.Now().Add(c.slow)) == nil {
		c.conn.Write(c.buf) //nolint:errcheck // the connection closes next
	}
}

func appendChunkHeader(dst []byte, n int) []byte {
	dst = strconv.AppendInt(dst, int64(n), 16)
	return append(dst, "\r\n"...)
}

// stream answers with a chunked body written by fn on the client's own
// connection. fn reports whether the client is still there; onGone runs
// when not. After a complete answer the connection goes back to the
// server for the client's next request (keep-alive); otherwise it closes.
// The status and headers must be set on ctx before, and everything fn
// needs copied out of ctx.
func (p *Proxy) stream(ctx *fasthttp.RequestCtx, fn func(*client) bool, onGone func()) {
	ctx.Response.Header.SetContentLength(-1) // chunked
	raw := unwrap(ctx.Conn())
	keepAlive := p.srv != nil && raw != nil && !ctx.Request.Header.ConnectionClose() && ctx.Request.Header.IsHTTP11()
	if !keepAlive {
		ctx.SetConnectionClose()
	}
	head := ctx.Response.Header.AppendBytes(make([]byte, 0, 1024))
	ctx.HijackSetNoResponse(true)
	slow, m, srv := p.cfg.SlowClientTimeout, p.m, p.srv
	p.clients.Add(1)
	ctx.Hijack(func(conn net.Conn) {
		c := &client{conn: conn, slow: slow, m: m, buf: head}
		ok := fn(c)
		if ok {
			c.end()
		} else {
			if c.stalled {
				m.slowDropped.Inc()
			}
			m.clientsGone.Inc()
			if onGone != nil {
				onGone()
			}
		}
		p.clients.Done()
		if ok && keepAlive && !p.draining.Load() {
			if next := handBack(conn, raw); next != nil {
				srv.ServeConn(next) //nolint:errcheck // it closes next when done
				return
			}
		}
		conn.Close() //nolint:errcheck // the server keeps hijacked connections open
	})
}

// handBack prepares a taken-over connection to be served again. The
// server must get the raw connection, not fasthttp's wrapper of it (which
// would nest one more wrapper per stream), plus whatever the wrapper had
// already read past the answered request. nil: the connection is done.
func handBack(hijacked, raw net.Conn) net.Conn {
	if hijacked.SetReadDeadline(time.Now()) != nil {
		return nil
	}
	var pre []byte
	buf := make([]byte, 4096)
	for {
		n, err := hijacked.Read(buf)
		pre = append(pre, buf[:n]...)
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				return nil // the client closed it
			}
			break
		}
	}
	if raw.SetDeadline(time.Time{}) != nil {
		return nil
	}
	if len(pre) > 0 {
		return &prefixConn{Conn: raw, pre: pre}
	}
	return raw
}

// prefixConn reads pre before the connection itself.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// unwrap returns the connection under a prefixConn whose prefix is read.
func unwrap(c net.Conn) net.Conn {
	for {
		pc, ok := c.(*prefixConn)
		if !ok || len(pc.pre) > 0 {
			return c
		}
		c = pc.Conn
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
		for {
			data, ended := sub.Read()
			if len(data) == 0 && len(c.buf) > 0 && !ended {
				if c.write(nil) != nil { // the head, so the client sees the answer start
					return false
				}
			}
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
			if len(data) == 0 {
				break // caught up: wait for the next signal
			}
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
