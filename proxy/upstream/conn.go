package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// connSet is a set of open upstream connections.
type connSet struct {
	mu sync.Mutex // guards m
	m  map[*Conn]struct{}
}

func (s *connSet) add(c *Conn) {
	s.mu.Lock()
	s.m[c] = struct{}{}
	s.mu.Unlock()
}

func (s *connSet) remove(c *Conn) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

// closeAll closes every open connection: a call waiting for its head, or
// reading its answer, fails at once. Used when the proxy aborts.
func (s *connSet) closeAll() {
	s.mu.Lock()
	cs := make([]*Conn, 0, len(s.m))
	for c := range s.m {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.interrupted.Store(true)
		c.Conn.Close() //nolint:errcheck // interrupting a call
	}
}

// TimeBudget names the time bound that cut an upstream connection.
type TimeBudget int

// String is the budget's metric label.
func (b TimeBudget) String() string {
	switch b {
	case BudgetHead:
		return "head"
	case BudgetAttempt:
		return "attempt"
	}
	return "idle"
}

// Flag names the setting of the budget, for logs.
func (b TimeBudget) Flag() string {
	switch b {
	case BudgetHead:
		return "-head-timeout"
	case BudgetAttempt:
		return "-attempt-timeout"
	}
	return "-upstream-idle-timeout"
}

// OnTimeout is told of every upstream connection a budget cut: which
// upstream, which budget, and the bound it held.
type OnTimeout func(upstream string, b TimeBudget, bound time.Duration)

// dial connects to addr within connect, TLS handshake included when
// tlsCfg is set. It does the handshake itself, under the connection's
// budgets rather than over them, so that Conn sees the HTTP exchange
// alone: a TLS record that is not the answer (a session ticket sent after
// the client's Finished, a key update) neither passes for the answer's
// first byte nor writes a request. A failed handshake, like a refused
// connection, sent nothing of a request.
func dial(addr string, connect time.Duration, tlsCfg *tls.Config) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), connect)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, &dialError{err}
	}
	if tlsCfg == nil {
		return c, nil
	}
	tc := tls.Client(c, tlsCfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, &dialError{fmt.Errorf("tls: %w", err)}
	}
	return tc, nil
}

// localFailure reports a failure of this process, not of the upstream:
// its own connection pool or file descriptors ran out.
func localFailure(err error) bool {
	return errors.Is(err, fasthttp.ErrNoFreeConns) || IsStale(err) || errors.Is(err, ErrNotCalled) || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// errStale is what a request's first write on a pooled connection
// returns, without writing, when the upstream closed that connection
// while it was idle: nothing of the request reached the upstream, so it
// may be sent again on another. It is the only failure on a reused
// connection that proves the request unread; any other (a reset, a close
// after the request was written) may have come after the upstream read
// it, and is ambiguous.
var errStale = errors.New("the upstream closed the pooled connection while it was idle")

// IsStale reports whether err is errStale: the upstream closed a pooled
// connection while it was idle, and the request was not sent.
func IsStale(err error) bool { return errors.Is(err, errStale) }

// dialError marks a failure to connect: nothing reached the upstream.
type dialError struct{ err error }

func (e *dialError) Error() string { return "connect: " + e.err.Error() }

// ConnectFailed is err, the failure to connect to the upstream of a call
// made outside its client (a WebSocket's dial), as its circuits and
// IsDial take the client's own: nothing reached the upstream.
func ConnectFailed(err error) error { return &dialError{err: err} }

func (e *dialError) Unwrap() error { return e.err }

// Conn holds an upstream connection to the proxy's time budgets,
// which fasthttp's own timeouts cannot express: they are absolute
// deadlines, set once before the head and kept over the whole body. It
// sits above TLS (dial), so what it writes is requests and what it reads
// is answers.
//
// From the first byte of each request written, one deadline, head later,
// bounds writing the request and waiting for the answer's first byte: a
// streaming answer's head (BudgetHead), or for a non-streaming request
// the whole answer (whole, BudgetAttempt). Once the answer began, every
// Read may wait at most idle besides, so a long healthy stream lives
// while one that went silent is cut.
type Conn struct {
	net.Conn
	idle, head  time.Duration
	headBudget  TimeBudget // what head bounds: BudgetHead, or BudgetAttempt when whole
	whole       bool       // the deadline bounds the whole answer, not only its first byte
	streamed    bool       // whole, yet this answer is an event stream (AsStream): its silence is bounded, not its length
	deadline    time.Time
	sending     bool       // a request is being written: set by Write, cleared by Read
	awaiting    bool       // no byte of the answer yet: set by Write, cleared by the first
	set         time.Time  // the read deadline last set
	bound       TimeBudget // the budget of the read deadline last set
	cut         bool       // a budget cut the connection; it is reported once
	timedOut    func(b TimeBudget, bound time.Duration)
	laddr       *connAddr
	owner       *connSet    // the upstream's open connections, which this one leaves on Close
	interrupted atomic.Bool // closed by interrupt: never to be pooled again
	reused      bool        // a request was written before: the next one's first write checks peerClosed
	peek        *peeker     // made at the first such check
	drainUntil  time.Time   // set by DrainBy: what is left of the answer must come by then
	// holdUntil and onHold, set by HoldBy: a read still waiting at
	// holdUntil calls onHold, once, and goes on waiting.
	holdUntil time.Time
	onHold    func()
	// beforeRead, while a generation relays an answer from the connection
	// (SetBeforeRead), runs before each read from the connection (for an
	// https upstream, from its TLS session).
	beforeRead func()
}

// connAddr is an Conn's local address. fasthttp gives it to the
// answer read from the connection (Response.LocalAddr), which is how a
// generation finds the connection its answer comes from: fasthttp has no
// other way from a Response to its connection, short of replacing
// HostClient's whole round trip (its Transport).
type connAddr struct {
	net.Addr
	c *Conn
}

// LocalAddr is the connection's local address, which leads back to it
// (ConnOf).
func (c *Conn) LocalAddr() net.Addr { return c.laddr }

// Close closes the connection and takes it out of its upstream's set.
func (c *Conn) Close() error {
	if c.owner != nil {
		c.owner.remove(c)
	}
	return c.Conn.Close()
}

// Handshake tells fasthttp that the connection needs no TLS of its own
// (it wraps only connections without this method): dial did the
// handshake for an https upstream, and an http one needs none.
func (c *Conn) Handshake() error { return nil }

// ConnOf returns the connection an answer is read from, if it is one of
// the upstream client's own.
func ConnOf(resp *fasthttp.Response) *Conn {
	if a, ok := resp.LocalAddr().(*connAddr); ok {
		return a.c
	}
	return nil
}

// Write writes a request, or part of one, under the head budget.
func (c *Conn) Write(p []byte) (int, error) {
	if !c.sending {
		// The first write of a request. On a connection that served one
		// before, the upstream may have closed it while it sat in the
		// pool; fasthttp would write the request into it and read a
		// reset or an EOF, which cannot be told from an upstream that
		// read the request and then failed. Looked at now, before a byte
		// is written, the close proves the request unread.
		if c.reused {
			if c.peek == nil {
				c.peek = newPeeker(c.Conn)
			}
			closed := c.peek.peerClosed()
			c.set = time.Time{} // peerClosed cleared it: the next Read sets it
			if closed {
				return 0, errStale
			}
		}
		c.reused = true
		c.streamed = false
		c.drainUntil = time.Time{}
		c.HoldBy(time.Time{}, nil)
		// An upstream that stops taking the request is as silent as one
		// that does not answer, so the same deadline bounds both.
		c.sending, c.awaiting = true, true
		c.deadline = time.Now().Add(c.head)
		if err := c.Conn.SetWriteDeadline(c.deadline); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Write(p)
	if err != nil {
		c.report(err, c.headBudget)
	}
	return n, err
}

// SetReadDeadline and SetDeadline are fasthttp's own calls; the next Read
// sets the proxy's deadline again, and the next request's first Write its
// write deadline.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.set = time.Time{}
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline: see SetReadDeadline.
func (c *Conn) SetDeadline(t time.Time) error {
	c.set = time.Time{}
	return c.Conn.SetDeadline(t)
}

// Read reads the answer under the budget that holds for it, and calls the
// hold (HoldBy) when its time comes.
func (c *Conn) Read(p []byte) (int, error) {
	for {
		n, err := c.read(p)
		// Only the hold's own deadline releases: another bound that fired
		// (and was reported) ends the read.
		if n > 0 || c.onHold == nil || !IsTimeout(err) || !c.set.Equal(c.holdUntil) || time.Now().Before(c.holdUntil) {
			return n, err
		}
		// The hold's bound passed in silence: no budget's cut, and the
		// connection goes on (a read deadline leaves it usable).
		fn := c.onHold
		c.HoldBy(time.Time{}, nil)
		fn()
	}
}

func (c *Conn) read(p []byte) (int, error) {
	if c.beforeRead != nil {
		c.beforeRead()
	}
	c.sending = false
	want, b, exact := time.Now().Add(c.idle), BudgetIdle, false
	if c.awaiting || (c.whole && !c.streamed && c.deadline.Before(want)) {
		want, b, exact = c.deadline, c.headBudget, true
	}
	if !c.drainUntil.IsZero() && c.drainUntil.Before(want) {
		want, exact = c.drainUntil, true
	}
	hold := c.onHold != nil && c.holdUntil.Before(want)
	if hold {
		want, exact = c.holdUntil, true
	}
	// Moving the deadline costs a timer update per read. The idle bound
	// is moved only once it is a sixteenth of idle stale, which keeps it
	// within 7%; the others are exact.
	move := !want.Equal(c.set)
	if !exact && c.bound == b && !c.set.IsZero() && c.set.Before(want) {
		move = want.Sub(c.set) > c.idle/16
	}
	if move {
		if err := c.Conn.SetReadDeadline(want); err != nil {
			return 0, err
		}
		c.set, c.bound = want, b
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.awaiting = false
	}
	if err != nil && c.drainUntil.IsZero() && !(hold && IsTimeout(err)) { // a drain's or a hold's end is no budget's
		c.report(err, c.bound)
	}
	return n, err
}

// DrainBy bounds the reading of what is left of the current answer, once
// it is known to be no part of the answer (after the terminal event): an
// upstream that keeps the body open, or trickles comments, holds the
// generation that long at most, and the connection is then closed rather
// than reused.
func (c *Conn) DrainBy(t time.Time) {
	if c != nil {
		c.drainUntil = t
	}
}

// AsStream has the answer being read, on a connection whose deadline
// bounds whole answers, bounded as a stream's body is: each read by the
// upstream's silence (-upstream-idle-timeout), until the next request.
func (c *Conn) AsStream() {
	if c != nil {
		c.streamed = true
	}
}

// HoldBy has a read that still waits at t call fn (on the reading
// goroutine) and go on waiting; a zero t with a nil fn unsets it. It costs
// a deadline's move only when set or reached, not one per event.
func (c *Conn) HoldBy(t time.Time, fn func()) {
	if c != nil {
		c.holdUntil, c.onHold = t, fn
	}
}

// SetBeforeRead has fn run before each read from the connection, on the
// reading goroutine, until it is set again (nil unsets it): a generation
// relaying the answer sets it, and unsets it once the answer is done,
// before the connection may serve another.
func (c *Conn) SetBeforeRead(fn func()) { c.beforeRead = fn }

// Interrupted reports whether Interrupt or CloseAll closed the connection:
// it must not be pooled again.
func (c *Conn) Interrupted() bool { return c.interrupted.Load() }

// report tells timedOut, once, that budget b cut the connection.
func (c *Conn) report(err error, b TimeBudget) {
	if c.cut || c.timedOut == nil || !IsTimeout(err) {
		return
	}
	c.cut = true
	bound := c.head
	if b == BudgetIdle {
		bound = c.idle
	}
	c.timedOut(b, bound)
}

// IsTimeout reports whether err is a timeout (the upstream went silent).
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, fasthttp.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout())
}

// IsDial reports whether err happened before anything was sent.
func IsDial(err error) bool {
	var de *dialError
	return errors.As(err, &de) || errors.Is(err, fasthttp.ErrNoFreeConns) // nothing was sent
}

// Interrupt makes a read of resp's body, blocked now or to come, fail at
// once, by closing the connection it is read from. It never closes the
// body stream itself: fasthttp's CloseBodyStream waits for a read in
// progress to let go of the stream's lock, and cancel is also called from
// inside that read (the generation writes its client before each read of
// the socket, and a client that went away cancels an unkeyed
// generation), where it would wait for itself forever. The generation
// closes the body stream once its read returned (drop).
func Interrupt(resp *fasthttp.Response) {
	if c := ConnOf(resp); c != nil {
		c.interrupted.Store(true)
		c.Conn.Close() //nolint:errcheck // interrupting a read
	}
	// Every upstream connection is a Conn (New's Dial;
	// TestAnswerConn), so there is no other case to interrupt.
}
