package upstream

import (
	"bytes"
	"errors"
	"sync"

	"github.com/valyala/fasthttp"
)

// A Call is the handle of one generation's upstream calls, by which
// another goroutine interrupts the call in progress (Interrupt), also
// while it still awaits its answer's head: fasthttp's Do takes no
// context, and the connection a call goes out on is known to the caller
// only once Do returned, with the head. Interrupt, before that, would
// have to wait for the head (within -head-timeout).
//
// fasthttp has no hook between taking a connection and writing the
// request to it, but it reads a request's body stream while it writes
// the request, on the calling goroutine, after the connection's
// addresses were given to the response (Response.ParseNetConn): so a call
// with a Call sends its body as a stream (callBody) whose first read
// finds the connection through the response (ConnOf) and hands it to the
// Call. Interrupt closes that connection, which ends the wait for the
// head at once; an Interrupt that comes before fails the body's read, so
// the request is never written whole.
//
// A Call is for one generation: once interrupted, every call made with
// it fails. Its methods may be called from any goroutine.
type Call struct {
	mu          sync.Mutex // guards conn and interrupted
	conn        *Conn      // the connection of the call in progress, once its body is being written
	interrupted bool
	body        callBody
}

// errInterrupted fails the write of a call interrupted before its
// connection was known.
var errInterrupted = errors.New("the call was interrupted")

// IsInterrupted reports whether err ended a call interrupted before it
// was written whole.
func IsInterrupted(err error) bool { return errors.Is(err, errInterrupted) }

// Interrupt ends the call in progress, and fails every later one: the
// connection it went out on is closed under its read (a wait for the
// head included), or, when the call has no connection yet, its request
// is not written.
func (c *Call) Interrupt() {
	c.mu.Lock()
	c.interrupted = true
	conn := c.conn
	c.mu.Unlock()
	if conn != nil {
		conn.interrupted.Store(true)
		conn.Conn.Close() //nolint:errcheck // interrupting a read
	}
}

// bind records conn as the connection of the call in progress; it reports
// false when the call was interrupted.
func (c *Call) bind(conn *Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.interrupted {
		return false
	}
	c.conn = conn
	return true
}

// unbind forgets the connection of a call that returned: from then on
// the caller interrupts it through its response (Interrupt).
func (c *Call) unbind() {
	c.mu.Lock()
	c.conn = nil
	c.mu.Unlock()
}

// callBody is a request body sent as a stream, so that its first read,
// on the goroutine writing the request, binds the call to its
// connection.
type callBody struct {
	call  *Call
	resp  *fasthttp.Response
	data  []byte
	r     bytes.Reader
	bound bool
}

// Read binds the call on its first read, then reads the body.
func (b *callBody) Read(p []byte) (int, error) {
	if !b.bound {
		b.bound = true
		if !b.call.bind(ConnOf(b.resp)) {
			return 0, errInterrupted
		}
	}
	return b.r.Read(p)
}

// set makes the body of req stream data, read from its start.
func (b *callBody) set(req *fasthttp.Request, data []byte) {
	b.data = data
	b.r.Reset(data)
	b.bound = false
	req.SetBodyStream(b, len(data))
}

// callTransport is fasthttp's transport, but a request whose body is a
// callBody, which fasthttp does not send again itself (it cannot read a
// body stream twice), is sent again here on a pooled connection found
// closed before a byte was written (errStale), as fasthttp does any other
// (HostClient.RetryIfErr): the body is read again from its start.
type callTransport struct{}

func (callTransport) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (bool, error) {
	b, ok := req.BodyStream().(*callBody)
	for n := 1; ; n++ {
		retry, err := fasthttp.DefaultTransport.RoundTrip(hc, req, resp)
		if !ok || err == nil || !IsStale(err) || n >= fasthttp.DefaultMaxIdemponentCallAttempts {
			return retry, err
		}
		b.set(req, b.data)
	}
}
