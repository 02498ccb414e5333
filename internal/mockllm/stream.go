package mockllm

import (
	"bufio"
	"net"
	"strconv"
	"time"
)

// stream is one answer on its way out: the dialect that renders it and the
// request's overrides. It holds nothing of the fasthttp.RequestCtx, so it can
// run after the handler has returned.
type stream struct {
	d         dialect
	from      int // the first event to send: 0, or past a resume's starting_after
	delay     time.Duration
	fault     fault
	closing   <-chan struct{} // closed by Server.Close
	hangLimit time.Duration
	timer     *time.Timer // reused between events when delay > 0
}

// send writes the stream's events to w, one flush per event, stopping
// before the terminal event when a fault fires after N events, and adds the
// in-stream error for error-after. chunked frames each event as an HTTP/1.1
// chunk, for a hijacked connection. send reports false when the stream was
// cut short: the client went away (a write or flush failed) or the Server
// is closing.
func (st *stream) send(w *bufio.Writer, chunked bool) bool {
	n := st.d.events()
	if st.fault.afterEvents() {
		n = min(st.fault.n, n-1)
	}
	buf := make([]byte, 0, 512)
	for i := st.from; i < n; i++ {
		if !st.wait() {
			return false
		}
		buf = st.d.appendEvent(buf[:0], i)
		if writeEvent(w, chunked, buf) != nil {
			return false
		}
	}
	if st.fault.kind == faultError {
		if !st.wait() {
			return false
		}
		buf = st.d.appendError(buf[:0], n)
		if writeEvent(w, chunked, buf) != nil {
			return false
		}
	}
	return true
}

// wait pauses for the delay before an event, with one timer reused for the
// whole stream. It reports false when the Server is closing.
func (st *stream) wait() bool {
	if st.delay <= 0 {
		select {
		case <-st.closing:
			return false
		default:
			return true
		}
	}
	if st.timer == nil {
		st.timer = time.NewTimer(st.delay)
	} else {
		st.timer.Reset(st.delay)
	}
	select {
	case <-st.timer.C:
		return true
	case <-st.closing:
		st.timer.Stop()
		return false
	}
}

// writeEvent writes one event and flushes it, so that each event leaves as
// soon as it is made, as a provider's tokens do.
func writeEvent(w *bufio.Writer, chunked bool, ev []byte) error {
	if chunked {
		var hdr [20]byte
		h := strconv.AppendInt(hdr[:0], int64(len(ev)), 16)
		h = append(h, '\r', '\n')
		_, _ = w.Write(h)
	}
	_, _ = w.Write(ev)
	if chunked {
		_, _ = w.WriteString("\r\n")
	}
	return w.Flush() // bufio keeps the first write error; Flush reports it
}

// rawStreamHead is the response head of a stream written on a hijacked
// connection. The connection is not reused after a fault.
const rawStreamHead = "HTTP/1.1 200 OK\r\n" +
	"Server: mockllm\r\n" +
	"Content-Type: text/event-stream\r\n" +
	"Cache-Control: no-cache\r\n" +
	"Transfer-Encoding: chunked\r\n" +
	"Connection: close\r\n\r\n"

// raw serves a stream whose fault needs the connection itself: hang,
// hang-after and reset-after. fasthttp closes c when raw returns.
func (st *stream) raw(c net.Conn) {
	if st.fault.kind == faultHang {
		st.stall(c)
		return
	}
	w := bufio.NewWriter(c)
	_, _ = w.WriteString(rawStreamHead)
	if w.Flush() != nil || !st.send(w, true) {
		return
	}
	switch st.fault.kind {
	case faultReset:
		reset(c)
	case faultHangAfter:
		st.stall(c)
		// End the body cleanly, without the terminal event, if the client
		// is still there.
		_, _ = w.WriteString("0\r\n\r\n")
		_ = w.Flush()
	}
}

// reset closes c with SO_LINGER 0, so the kernel sends RST instead of FIN
// and the client sees "connection reset by peer" mid-body rather than a
// clean end. Connections that are not TCP (in-memory listeners) are just
// closed.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// stall sends nothing until the client closes the connection, the Server
// closes, or hangLimit passes. It notices the client leaving by reading the
// connection: the request was read in full already, so the read returns
// only at EOF (or if the client sends more, which is discarded).
func (st *stream) stall(c net.Conn) {
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		var b [512]byte
		for {
			if _, err := c.Read(b[:]); err != nil {
				return
			}
		}
	}()
	t := time.NewTimer(st.hangLimit)
	defer t.Stop()
	select {
	case <-gone:
		return
	case <-t.C:
	case <-st.closing:
	}
	// Unblock the reader; a connection without deadlines is closed instead.
	if c.SetReadDeadline(time.Unix(1, 0)) != nil {
		_ = c.Close()
	}
	<-gone
	_ = c.SetReadDeadline(time.Time{})
}
