package proxy

import (
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/valyala/fasthttp"
)

// clientConn is the writing end of one streamed answer: the client's own
// connection, taken over from fasthttp and written with HTTP/1.1 chunked
// framing, one write per batch of events. Taking the connection over,
// rather than fasthttp's body stream writer, saves a goroutine, a pipe and
// a copy per event.
//
// A clientConn is written either by a goroutine of its own (write: a write
// the connection does not accept within SlowClientTimeout fails, so a
// stalled client is dropped, never waited on), or, for the client whose
// request started a generation, by the generation itself (offer: a write
// that never waits; see origin).
type clientConn struct {
	p         *Proxy
	conn      net.Conn        // the connection itself, not fasthttp's wrapper
	rc        syscall.RawConn // for writes that never wait; nil when conn has none
	pre       []byte          // what the client sent after its request, read at take-over
	keepAlive bool            // serve the connection's next request after a complete answer
	// identity: the body is not chunked but ends where the connection
	// closes: for an HTTP/1.0 client, and for a body the upstream sent
	// that way (relayed as it came, so that a cut stays a cut).
	identity bool
	// resumeURL, for a keyed stream, goes into a head the client writes
	// itself (answerHead).
	resumeURL string
	span      *reqSpan // the request's span, ended with the answer; nil when tracing is off
	// replayed: the answer is another request's generation, and a head
	// the client writes itself says so (Idempotent-Replayed).
	replayed bool
	// head: the request is a HEAD, whose answer has no body.
	head bool
	// bodiless: the answer has no body, whatever is written as one: the
	// answer to a HEAD, or a 1xx, 204 or 304 (noBody). Only its head
	// goes out, and nothing after it, so that the connection's next
	// answer is the next thing the client reads.
	bodiless bool

	buf      []byte               // the answer head until it is written, then chunk headers
	arr      [2 + maxParts][]byte // backing of vec
	vec      net.Buffers          // the frames to write; after an offer, what it left unwritten
	pieceArr [2 + maxParts][]byte // backing of piece
	piece    net.Buffers          // the next at most writePiece bytes of vec, for flush
	stalled  bool                 // the last write timed out
	set      time.Time            // the write deadline last set

	// The non-blocking write's arguments and results, kept here so that
	// its callback (wfn, made once) allocates nothing per write.
	wfn  func(fd uintptr) bool
	wn   int
	werr error

	// For a connection another server took first: over is closed by
	// finish when the answer is over; next is then the connection to
	// serve the client's next request on, or nil.
	over chan struct{}
	next *keptConn
}

// frame puts parts as one chunk (with the answer head before the first)
// into c.vec; last adds the end of the body.
func (c *clientConn) frame(last bool, parts ...[]byte) {
	c.vec = c.arr[:0]
	if c.bodiless {
		if len(c.buf) > 0 {
			c.vec = append(c.vec, c.buf) // the head, alone
		}
		return
	}
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	switch {
	case c.identity:
		if len(c.buf) > 0 {
			c.vec = append(c.vec, c.buf) // the head
		}
		for _, p := range parts {
			if len(p) > 0 {
				c.vec = append(c.vec, p)
			}
		}
		c.p.hooks.wrote(n)
	case n > 0:
		c.buf = appendChunkHeader(c.buf, n)
		tail := crlf
		if last {
			tail = crlfEnd
		}
		c.vec = append(append(append(c.vec, c.buf), parts...), tail)
		c.p.hooks.wrote(n)
	case last:
		c.buf = append(c.buf, lastChunk...)
		c.vec = append(c.vec, c.buf)
	case len(c.buf) > 0:
		c.vec = append(c.vec, c.buf) // the head alone
	}
}

var (
	crlf      = []byte("\r\n")
	crlfEnd   = []byte("\r\n0\r\n\r\n")
	lastChunk = []byte("0\r\n\r\n")
)

// write sends p as one chunk, after whatever an earlier offer left
// unwritten, waiting at most SlowClientTimeout for the connection to take
// each writePiece bytes of it.
func (c *clientConn) write(p []byte) error { return c.send(false, p) }

// end writes the end of the body: the answer is complete.
func (c *clientConn) end() error { return c.send(true) }

// send is write for parts as one chunk; last adds the end of the body.
func (c *clientConn) send(last bool, parts ...[]byte) error {
	if err := c.flush(); err != nil {
		return err
	}
	c.frame(last, parts...)
	return c.flush()
}

// writePiece bounds what one blocking write to a client may carry. Each
// piece has a deadline of its own, SlowClientTimeout ahead: a client is
// slow when it takes no piece for that long, never because an answer is
// big and the client reads it steadily at less than size/SlowClientTimeout.
const writePiece = 64 << 10

// flush writes c.vec, in pieces of at most writePiece bytes, waiting at
// most SlowClientTimeout for each.
func (c *clientConn) flush() error {
	if len(c.vec) == 0 {
		return nil // c.buf may hold the head, for the first chunk
	}
	slow := c.p.cfg.SlowClientTimeout
	for len(c.vec) > 0 {
		// As for reads (upstream.Conn): move the deadline only when it is stale.
		if d := time.Now().Add(slow); d.Sub(c.set) > slow/16 {
			if err := c.conn.SetWriteDeadline(d); err != nil {
				c.reset()
				return err
			}
			c.set = d
		}
		var err error
		if c.nextPiece() {
			_, err = c.vec.WriteTo(c.conn) // all of it fits one piece
		} else {
			var n int64
			n, err = c.piece.WriteTo(c.conn)
			consume(&c.vec, int(n))
		}
		if err != nil {
			c.reset()
			var ne net.Error
			c.stalled = errors.As(err, &ne) && ne.Timeout()
			return err
		}
	}
	c.reset()
	return nil
}

// nextPiece puts the first writePiece bytes of c.vec into c.piece, or
// reports that c.vec holds no more than that.
func (c *clientConn) nextPiece() (all bool) {
	n := 0
	for _, b := range c.vec {
		n += len(b)
	}
	if n <= writePiece {
		return true
	}
	c.piece, n = c.pieceArr[:0], 0
	for _, b := range c.vec {
		if len(b) > writePiece-n {
			b = b[:writePiece-n]
		}
		c.piece = append(c.piece, b)
		if n += len(b); n == writePiece {
			break
		}
	}
	return false
}

// offer writes p as one chunk (last: and the end of the body) as far as
// the connection takes it without waiting. done reports that all of it
// was written; otherwise the rest stays in c.vec for write or end to send
// first. An error means the client is gone.
func (c *clientConn) offer(last bool, parts ...[]byte) (done bool, err error) {
	if len(c.vec) > 0 {
		return false, nil
	}
	c.frame(last, parts...)
	if len(c.vec) == 0 {
		return true, nil
	}
	c.wn, c.werr = 0, nil
	if err := c.rc.Write(c.wfn); err != nil {
		return false, err
	}
	if c.werr != nil {
		return false, c.werr
	}
	consume(&c.vec, c.wn)
	if len(c.vec) > 0 {
		return false, nil
	}
	c.reset()
	return true, nil
}

// reset empties c.vec once written, forgetting the slices it held: they
// lie in journal blocks that would otherwise stay reachable after the
// journal dropped them.
func (c *clientConn) reset() {
	c.arr, c.pieceArr = [len(c.arr)][]byte{}, [len(c.pieceArr)][]byte{}
	c.buf, c.vec, c.piece = c.buf[:0], c.arr[:0], c.pieceArr[:0]
}

// consume drops the first n bytes of v.
func consume(v *net.Buffers, n int) {
	for len(*v) > 0 && n >= len((*v)[0]) {
		n -= len((*v)[0])
		*v = (*v)[1:]
	}
	if len(*v) > 0 {
		(*v)[0] = (*v)[0][n:]
	}
}

func appendChunkHeader(dst []byte, n int) []byte {
	dst = strconv.AppendInt(dst, int64(n), 16)
	return append(dst, "\r\n"...)
}

// takeOver answers on the client's own connection: run gets the client
// once fasthttp hands the connection over, and must see to it that finish
// is called when the answer is over. With head set, the answer is a
// chunked body after the status and headers set on ctx; otherwise the
// client writes its head itself (answerHead, answerWhole). Everything run
// needs must be copied out of ctx: fasthttp reuses ctx once run returns.
func (p *Proxy) takeOver(ctx *fasthttp.RequestCtx, head bool, run func(*clientConn)) {
	served := ctx.Conn()
	// An HTTP/1.0 client cannot read chunked framing (RFC 9112 §6.1): its
	// answer is close-delimited, and the connection closes at its end.
	identity := !ctx.Request.Header.IsHTTP11()
	keepAlive := served != nil && !ctx.Request.Header.ConnectionClose() && !identity
	// On the proxy's own server a taken-over connection stays open when
	// the hijack handler returns (KeepHijackedConns); another server's
	// may close it then, so the handler waits for the connection's end.
	own := p.serves(served)
	isHead := ctx.IsHead()
	bodiless := head && (isHead || noBody(ctx.Response.StatusCode()))
	var buf []byte
	if bodiless {
		// Nothing follows the head, and the connection is kept: a HEAD's
		// says a GET's would be chunked; a status without a body says
		// nothing of one (fasthttp leaves the field out).
		if isHead && !identity {
			ctx.Response.Header.SetContentLength(-1)
		}
		if !keepAlive {
			ctx.SetConnectionClose()
		}
		buf = ctx.Response.Header.AppendBytes(make([]byte, 0, 512))
	} else if head {
		if identity {
			ctx.Response.Header.SetContentLength(-2) // until the connection closes
		} else {
			ctx.Response.Header.SetContentLength(-1) // chunked
		}
		if !keepAlive {
			ctx.SetConnectionClose()
		}
		buf = ctx.Response.Header.AppendBytes(make([]byte, 0, 512))
	}
	resume := resumeURL(ctx)
	var rs *reqSpan
	if p.tracer != nil {
		if rs = requestSpan(ctx); rs != nil {
			rs.taken, rs.status = true, ctx.Response.StatusCode()
		}
	}
	ctx.HijackSetNoResponse(true)
	p.clients.Add(1)
	ctx.Hijack(func(hijacked net.Conn) {
		c := &clientConn{p: p, conn: hijacked, buf: buf, keepAlive: keepAlive, identity: identity, resumeURL: resume, span: rs,
			head: isHead, bodiless: bodiless}
		if !own {
			c.over = make(chan struct{})
		}
		c.wfn = c.writeFD
		if served != nil {
			// What fasthttp read past this request (a pipelined next one)
			// is kept, so that the connection can be handed back without
			// fasthttp's reader; the connection itself is written directly.
			pre, ok := readAhead(hijacked)
			if ok {
				c.conn, c.pre = unwrap(served), pre
			} else {
				c.keepAlive = false
			}
		}
		if sc, ok := c.conn.(syscall.Conn); ok && nonBlockingWrites {
			if rc, err := sc.SyscallConn(); err == nil {
				c.rc = rc
			}
		}
		run(c)
		if own {
			return // finish hands the connection back to the proxy's server
		}
		// Another server's connection: kept until the answer is over (it
		// may be written by another goroutine, the generation for its
		// origin), then its next requests go to the proxy's own server,
		// and the connection is kept until it ends.
		<-c.over
		if c.next != nil {
			p.srv.ServeConn(c.next) //nolint:errcheck // it closes the connection, unless a stream takes it over
			<-c.next.ended
		}
	})
}

// serves reports whether the proxy's own server serves conn: one it
// accepted (connState), or one the proxy handed back to it.
func (p *Proxy) serves(conn net.Conn) bool {
	if _, ok := conn.(*keptConn); ok {
		return true
	}
	_, ok := p.accepted.Load(conn)
	return ok
}

// connState follows the connections the proxy's server accepts.
func (p *Proxy) connState(conn net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateNew:
		p.accepted.Store(conn, struct{}{})
	case fasthttp.StateHijacked, fasthttp.StateClosed:
		p.accepted.Delete(conn)
	}
	if st != fasthttp.StateNew && st != fasthttp.StateActive {
		// Idle (the answer is written: the server flushes an answer with
		// a write deadline before), closed or taken over: an answer
		// handed to the server is over.
		if _, ok := p.handed.LoadAndDelete(conn); ok {
			p.handedN.Add(-1)
		}
	}
}

// handing counts the answer the handler waits for, to give the server to
// write on ctx's connection, among the answers a shutdown waits for
// (Wait), until connState sees the server done with the connection
// (idle, closed or taken over: a take-over counts in clients before);
// only on the proxy's own server, whose connections' states it hears.
// An answer is counted once however often its handler says so (a
// generation run on it says so before it runs: runsInHandler); no state
// of the connection can be heard meanwhile, its handler running.
func (p *Proxy) handing(ctx *fasthttp.RequestCtx) {
	if conn := ctx.Conn(); conn != nil && p.serves(conn) {
		if _, had := p.handed.LoadOrStore(conn, struct{}{}); !had {
			p.handedN.Add(1)
		}
	}
}

// noBody reports whether an answer with status has no body (RFC 9110
// §6.4.1): a 1xx, 204 or 304.
func noBody(status int) bool {
	return status >= 100 && status < 200 || status == fasthttp.StatusNoContent || status == fasthttp.StatusNotModified
}

// answerHead puts the head of a chunked answer h into c.buf, to go out
// with the first chunk (or alone, for an answer without a body).
func (c *clientConn) answerHead(h cache.Head) { c.answerHeadSized(h, -1) }

// answerHeadSized is answerHead; for the answer to a HEAD, size, when not
// negative, is the Content-Length a GET's answer would have (the
// upstream's own answer to the HEAD said so).
func (c *clientConn) answerHeadSized(h cache.Head, size int) {
	rh := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(rh)
	if c.span != nil {
		c.span.status = h.Status
	}
	setHead(&rh.Header, h, c.replayed)
	if c.resumeURL != "" {
		rh.Header.Set(resumeURLHeader, c.resumeURL)
	}
	c.bodiless = c.head || noBody(h.Status)
	switch {
	case c.bodiless:
		// Nothing follows the head, and the connection is kept, whatever
		// framing a body would have had. A HEAD's answer says what a
		// GET's would be (the upstream's length, or chunked); a status
		// without a body says nothing of one (fasthttp leaves it out).
		// An HTTP/1.0 client's HEAD of a body of unknown length gets
		// neither: no Content-Length: 0 that would misstate the GET's.
		switch {
		case c.head && size >= 0:
			rh.Header.SetContentLength(size)
		case c.head && !c.identity:
			rh.Header.SetContentLength(-1)
		case c.head:
			rh.Header.SetContentLength(-2)
		}
	case c.identity:
		c.keepAlive = false
		rh.Header.SetContentLength(-2) // until the connection closes
	default:
		rh.Header.SetContentLength(-1)
	}
	if !c.keepAlive {
		rh.Header.SetConnectionClose()
	}
	c.buf = rh.Header.AppendBytes(c.buf[:0])
}

// answerWhole writes resp, a whole answer with its body, waiting at most
// SlowClientTimeout for each writePiece bytes of it.
func (c *clientConn) answerWhole(resp *fasthttp.Response) error {
	if !c.keepAlive {
		resp.SetConnectionClose()
	}
	resp.Header.SetContentLength(len(resp.Body())) // a HEAD's: the GET's length; none for a status without a body
	if c.span != nil {
		c.span.status = resp.StatusCode()
	}
	c.vec = append(c.arr[:0], resp.Header.AppendBytes(c.buf[:0]))
	c.bodiless = c.head || noBody(resp.StatusCode())
	if !c.bodiless {
		c.vec = append(c.vec, resp.Body())
	}
	return c.flush()
}

// stream answers with a chunked body written by fn, on the goroutine
// fasthttp hands the connection to. fn reports whether the client is
// still there; onGone runs when not.
func (p *Proxy) stream(ctx *fasthttp.RequestCtx, fn func(*clientConn) bool, onGone func()) {
	p.takeOver(ctx, true, func(c *clientConn) {
		ok := fn(c) && c.end() == nil
		c.finish(ok, onGone)
	})
}

// finish ends the client's answer: after a complete one the connection
// goes back to the server for the client's next request (keep-alive);
// otherwise it closes, and onGone runs.
func (c *clientConn) finish(ok bool, onGone func()) {
	if c.over != nil {
		defer close(c.over)
	}
	p := c.p
	if c.span != nil {
		c.span.end(c.span.status, ok)
	}
	if !ok {
		p.hooks.clientGone(c.stalled)
		if onGone != nil {
			onGone()
		}
	}
	p.clients.Done()
	if !ok && c.identity {
		// A body that ends where the connection closes: a plain close
		// would pass a cut for its end, a reset does not.
		if tc, isTCP := c.conn.(interface{ SetLinger(int) error }); isTCP {
			tc.SetLinger(0) //nolint:errcheck // best effort: the client may be gone
		}
	}
	if ok && c.keepAlive && !p.draining.Load() {
		// The answer's write deadline must not cut what fasthttp writes
		// on the connection next.
		if c.conn.SetWriteDeadline(time.Time{}) != nil {
			c.conn.Close() //nolint:errcheck // unusable
			return
		}
		next := &keptConn{Conn: c.conn, pre: c.pre}
		if next.idleWait(p.idleTimeout()) != nil {
			c.conn.Close() //nolint:errcheck // unusable
			return
		}
		if c.over == nil {
			p.work.run(func() { _ = p.srv.ServeConn(next) }) // it closes next when done
			return
		}
		next.ended = make(chan struct{})
		c.next = next
		return
	}
	c.conn.Close() //nolint:errcheck // the server keeps hijacked connections open
}

// readAhead returns what a taken-over connection's reader holds past the
// answered request, without waiting for more. ok is false when the
// connection cannot be read that way (the client closed it).
func readAhead(hijacked net.Conn) (pre []byte, ok bool) {
	if hijacked.SetReadDeadline(time.Now()) != nil {
		return nil, false
	}
	var buf [512]byte
	for {
		n, err := hijacked.Read(buf[:])
		pre = append(pre, buf[:n]...)
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				return nil, false
			}
			break
		}
	}
	return pre, hijacked.SetReadDeadline(time.Time{}) == nil
}

// keptConn is a connection the proxy serves again after a streamed
// answer took it over: what the client sent past that answer's request
// (pre) is read first. ended, for a connection another server accepted,
// is closed when the connection closes: that server's hijack handler
// waits for it (takeOver).
//
// fasthttp's ServeConn waits for a connection's first request as for a
// new connection's, under ReadTimeout; this one is a keep-alive
// connection between two requests, so until its next request's first
// byte, keptConn holds the read deadline to the server's idle timeout
// (idleWait), and from that byte gives the request ReadTimeout, as
// fasthttp does on a connection it kept itself; a connection that ends
// while waiting reads as io.EOF, so that fasthttp closes it without an
// answer, as its own.
type keptConn struct {
	net.Conn
	pre   []byte
	ended chan struct{}
	once  sync.Once

	waiting bool          // no byte of the next request yet: the idle deadline stands
	read    time.Duration // the server's ReadTimeout, from the first byte
}

// idleWait bounds the wait for c's next request by idle, from now; read
// then bounds the request. A connection whose next request has begun
// (pre) is not waited on. It is called before c is handed to ServeConn's
// goroutine (run's hand-over, or close(over), orders the two).
func (c *keptConn) idleWait(idle, read time.Duration) error {
	if len(c.pre) > 0 || idle <= 0 {
		return nil
	}
	c.waiting, c.read = true, read
	return c.Conn.SetReadDeadline(time.Now().Add(idle))
}

func (c *keptConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	n, err := c.Conn.Read(p)
	if c.waiting && n == 0 && err != nil {
		// The idle timeout, or the client closed: a keep-alive connection
		// that ends between requests, closed without an answer, as
		// fasthttp closes its own (an error would get a 408).
		return 0, io.EOF
	}
	if c.waiting && n > 0 {
		c.waiting = false
		var d time.Time
		if c.read > 0 {
			d = time.Now().Add(c.read)
		}
		if err2 := c.Conn.SetReadDeadline(d); err == nil {
			err = err2
		}
	}
	return n, err
}

// SetReadDeadline leaves the idle deadline in place while c waits for
// its next request: the deadline ServeConn sets then is for a new
// connection's first request.
func (c *keptConn) SetReadDeadline(t time.Time) error {
	if c.waiting {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *keptConn) Close() error {
	err := c.Conn.Close()
	if c.ended != nil {
		c.once.Do(func() { close(c.ended) })
	}
	return err
}

// SyscallConn and SetLinger reach the socket under the wrapper, for the
// client's writes that never wait and for a reset.
func (c *keptConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

func (c *keptConn) SetLinger(sec int) error {
	if l, ok := c.Conn.(interface{ SetLinger(int) error }); ok {
		return l.SetLinger(sec)
	}
	return errors.ErrUnsupported
}

// unwrap returns the connection under the keptConns whose prefix is read
// and which nobody waits on, so that wrappers do not pile up over a
// connection's many answers.
func unwrap(c net.Conn) net.Conn {
	for {
		kc, ok := c.(*keptConn)
		if !ok || len(kc.pre) > 0 || kc.ended != nil {
			return c
		}
		c = kc.Conn
	}
}

// copyBody relays a body that is not an event stream, flushing whatever
// arrives so a slow upstream's bytes are not held back, and ends the
// answer. It reports false when the client went away or the body was cut
// short (a reset, a timeout): then the client's answer ends without its
// last chunk, so that it is not taken for a whole one. A body of known
// size (n ≥ 0) has its last bytes go out with the end of the answer, in
// one write: a short answer is one write for its head, body and end.
func copyBody(c *clientConn, r io.Reader, n int) bool {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	read := 0
	for {
		k, err := r.Read(buf)
		read += k
		if err == nil && n >= 0 && read >= n && k < len(buf) {
			// All the length said: the stream answers its end without a
			// read of the connection, and must be read to it, or its
			// connection is not pooled again.
			var more int
			more, err = r.Read(buf[k:])
			k += more
		}
		switch {
		case errors.Is(err, io.EOF):
			return c.send(true, buf[:k]) == nil
		case k > 0 && c.write(buf[:k]) != nil:
			return false
		case err != nil:
			return false // what came is written; the end is not
		}
	}
}

// copyBufs holds copyBody's buffers.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// maxParts bounds the journal spans one write to a client gathers.
const maxParts = 4

// writeHead sets the status and headers of an answer, with the signed
// resume URL of a keyed stream (offerResume).
func writeHead(ctx *fasthttp.RequestCtx, h cache.Head, replayed bool) {
	setHead(&ctx.Response.Header, h, replayed)
	if u := resumeURL(ctx); u != "" {
		ctx.Response.Header.Set(resumeURLHeader, u)
	}
}

// outcomeHead marks the head of an answer from a flight that ended in
// state: the outcome-unknown marker when the key is commit_unknown, and
// storedHeader when the answer came whole and the store did not keep it
// (unstored: Flight.Unstored).
func outcomeHead(rh *fasthttp.ResponseHeader, state cache.State, unstored bool) {
	if state == cache.StateCommitUnknown {
		markUnknown(rh)
	}
	if unstored {
		rh.Set(storedHeader, "false")
	}
}

// endedHead is h with the headers outcomeHead sets for the ended flight
// f, for a stream's head written once f had ended. An upstream head never
// carries them (skipResponseHeader), so they are only added; the flight's
// own head is shared, and clipped so that it is never written to.
func endedHead(f *cache.Flight, h cache.Head) cache.Head {
	state, _, _ := f.Outcome()
	if state == cache.StateCommitUnknown {
		h.Header = append(slices.Clip(h.Header), cache.Header{Name: outcomeHeader, Value: "unknown"})
	}
	if f.Unstored() {
		h.Header = append(slices.Clip(h.Header), cache.Header{Name: storedHeader, Value: "false"})
	}
	return h
}

func setHead(rh *fasthttp.ResponseHeader, h cache.Head, replayed bool) {
	rh.SetStatusCode(h.Status)
	rh.SetServer(serverName)
	for _, kv := range h.Header {
		rh.Add(kv.Name, kv.Value)
	}
	if h.ContentType != "" {
		rh.SetContentType(h.ContentType)
	}
	if replayed {
		rh.Set("Idempotent-Replayed", "true")
	}
	if h.Stream {
		rh.Set("Cache-Control", "no-cache")
		rh.Set("X-Accel-Buffering", "no")
	}
}
