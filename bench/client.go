package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"time"
)

// The load generator's HTTP client: a minimal HTTP/1.1 reader on a raw
// net.Conn, so that the client spends as little of the machine's CPU as it
// can on what it measures. It speaks just enough HTTP/1.1 for the peers in
// this suite (status line, headers, chunked or Content-Length or
// close-delimited bodies, keep-alive) and counts SSE events as the bytes
// arrive, without copying them out.

// clientConn is one client connection, reused while the server keeps it
// alive. It is used by one goroutine at a time.
type clientConn struct {
	addr    string
	nc      net.Conn
	br      *bufio.Reader
	scratch []byte
	p       sseParser
	// leaveAfter, when positive, makes the client leave a stream once it
	// has this many events: roundTrip ends with errLeft and closes the
	// connection, as a client that lost it would (the soak's resumes).
	leaveAfter int
	// firstContent makes roundTrip time the first event that carries
	// generated text (streamResult.ttft), not just the first event.
	firstContent bool
}

// errLeft ends a roundTrip that left its stream after leaveAfter events.
var errLeft = errors.New("left the stream")

// newClientConn returns a connection to addr; it dials on first use.
func newClientConn(addr string) *clientConn {
	return &clientConn{addr: addr, scratch: make([]byte, 4096)}
}

// attach makes nc the connection's network connection.
func (c *clientConn) attach(nc net.Conn) {
	c.close()
	c.nc = nc
	if c.br == nil {
		c.br = bufio.NewReaderSize(nc, 4096)
	} else {
		c.br.Reset(nc)
	}
}

// close closes the network connection, if any.
func (c *clientConn) close() {
	if c.nc != nil {
		_ = c.nc.Close()
		c.nc = nil
	}
}

// streamResult is what one request brought back.
type streamResult struct {
	status   int
	events   int  // SSE events dispatched (comments and pings not counted)
	done     bool // the last event's data was [DONE]
	errEvent bool // an `event: error` or an error object was seen
	replayed bool // Idempotent-Replayed: true
	ttfe     time.Duration
	// ttft is the time to the first event that carries generated text
	// (a chat chunk with a non-empty delta content: the role-only first
	// chunk does not), when the connection's firstContent asked for it.
	ttft time.Duration
	// total is the time from writing the request to the end of the
	// response (or the error).
	total   time.Duration
	bytes   int64 // body bytes after de-chunking
	ids     []string
	errBody string // the start of a non-200 body
	err     error  // transport or protocol error
}

// wholeBody is the expect of a non-streaming request: a whole body with
// no events in it.
const wholeBody = -1

// ok reports whether the stream arrived whole: status 200, the expected
// number of events, [DONE] last, no error event and no transport error.
// With expect wholeBody, whether a non-streaming answer did: status 200, a
// body that is no event stream, and no transport error.
func (r *streamResult) ok(expect int) bool {
	if expect == wholeBody {
		return r.err == nil && r.status == 200 && r.events == 0 && r.bytes > 0
	}
	return r.err == nil && r.status == 200 && !r.errEvent && r.done && (expect <= 0 || r.events == expect)
}

// problem describes why a stream is not ok, for the error samples.
func (r *streamResult) problem(expect int) string {
	switch {
	case r.err != nil:
		return fmt.Sprintf("%v (after %d events)", r.err, r.events)
	case r.status != 200:
		return fmt.Sprintf("status %d: %s", r.status, r.errBody)
	case expect == wholeBody && r.events > 0:
		return fmt.Sprintf("%d events; want a non-streaming body", r.events)
	case expect == wholeBody && r.bytes == 0:
		return "empty body"
	case expect == wholeBody:
		return ""
	case r.errEvent:
		return fmt.Sprintf("error event after %d events", r.events)
	case !r.done:
		return fmt.Sprintf("no [DONE] (%d events)", r.events)
	case expect > 0 && r.events != expect:
		return fmt.Sprintf("%d events; want %d", r.events, expect)
	}
	return ""
}

// errProtocol marks a malformed response.
var errProtocol = errors.New("malformed HTTP response")

// roundTrip writes req (a whole HTTP/1.1 request) and reads the response,
// counting its events. collectIDs keeps every event id. onFirst, when set,
// runs once when the first event arrives; onEvents gets the count of events
// of every read, for live progress counters. The whole exchange must end by
// deadline.
func (c *clientConn) roundTrip(req []byte, deadline time.Time, collectIDs bool, onFirst func(), events *atomic.Int64) (res streamResult) {
	if c.nc == nil {
		nc, err := net.DialTimeout("tcp", c.addr, 10*time.Second)
		if err != nil {
			res.err = fmt.Errorf("dial: %w", err)
			return res
		}
		c.attach(nc)
	}
	_ = c.nc.SetDeadline(deadline)
	c.p.reset(collectIDs, c.firstContent)
	t0 := time.Now()
	if _, err := c.nc.Write(req); err != nil {
		c.close()
		res.err = fmt.Errorf("write: %w", err)
		return res
	}
	keep, err := c.readResponse(&res, t0, onFirst, events)
	res.total = time.Since(t0)
	res.events = c.p.events
	res.done = c.p.lastDone
	res.errEvent = c.p.errEvent
	res.ids = c.p.ids
	if err != nil {
		res.err = err
	}
	if err != nil || !keep {
		c.close()
	}
	return res
}

// readResponse reads the head and the body of one response. It reports
// whether the connection may carry another request.
func (c *clientConn) readResponse(res *streamResult, t0 time.Time, onFirst func(), events *atomic.Int64) (keep bool, err error) {
	line, err := c.readLine()
	if err != nil {
		return false, fmt.Errorf("read status: %w", err)
	}
	// HTTP/1.1 200 OK
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return false, fmt.Errorf("%w: status line %q", errProtocol, line)
	}
	res.status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return false, fmt.Errorf("%w: status line %q", errProtocol, line)
	}
	keep = line[7] == '1'
	chunked, length := false, int64(-1)
	for {
		line, err = c.readLine()
		if err != nil {
			return false, fmt.Errorf("read headers: %w", err)
		}
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return false, fmt.Errorf("%w: header %q", errProtocol, line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Content-Length")):
			length, err = strconv.ParseInt(string(value), 10, 64)
			if err != nil || length < 0 {
				return false, fmt.Errorf("%w: Content-Length %q", errProtocol, value)
			}
		case bytes.EqualFold(name, []byte("Connection")):
			if bytes.EqualFold(value, []byte("close")) {
				keep = false
			}
		case bytes.EqualFold(name, []byte("Idempotent-Replayed")):
			res.replayed = bytes.EqualFold(value, []byte("true"))
		}
	}
	if res.status == 204 || res.status == 304 || (res.status >= 100 && res.status < 200) {
		return keep, nil
	}
	body := func(p []byte) {
		res.bytes += int64(len(p))
		before := c.p.events
		c.p.feed(p)
		if n := c.p.events - before; n > 0 {
			if before == 0 {
				res.ttfe = time.Since(t0)
				if onFirst != nil {
					onFirst()
				}
			}
			if res.ttft == 0 && c.p.contentEvents > 0 {
				res.ttft = time.Since(t0)
			}
			if events != nil {
				events.Add(int64(n))
			}
		}
		if res.status != 200 && len(res.errBody) < 200 {
			res.errBody += string(p[:min(len(p), 200-len(res.errBody))])
		}
	}
	switch {
	case chunked:
		return keep, c.readChunked(body)
	case length >= 0:
		return keep, c.readN(length, body)
	default:
		// Close-delimited: the body ends at EOF, and the connection with it.
		for {
			n, err := c.br.Read(c.scratch)
			if n > 0 {
				body(c.scratch[:n])
				if c.left() {
					return false, errLeft
				}
			}
			if err == io.EOF {
				return false, nil
			}
			if err != nil {
				return false, fmt.Errorf("read body: %w", err)
			}
		}
	}
}

// readChunked decodes a chunked body, handing its data to body.
func (c *clientConn) readChunked(body func([]byte)) error {
	for {
		line, err := c.readLine()
		if err != nil {
			return fmt.Errorf("read chunk size: %w", unexpected(err))
		}
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i] // chunk extensions
		}
		size, err := strconv.ParseInt(string(bytes.TrimSpace(line)), 16, 64)
		if err != nil || size < 0 {
			return fmt.Errorf("%w: chunk size %q", errProtocol, line)
		}
		if size == 0 {
			// Trailers, then the blank line that ends the body.
			for {
				line, err = c.readLine()
				if err != nil {
					return fmt.Errorf("read trailer: %w", unexpected(err))
				}
				if len(line) == 0 {
					return nil
				}
			}
		}
		if err := c.readN(size, body); err != nil {
			return err
		}
		line, err = c.readLine()
		if err != nil {
			return fmt.Errorf("read chunk end: %w", unexpected(err))
		}
		if len(line) != 0 {
			return fmt.Errorf("%w: chunk not followed by CRLF", errProtocol)
		}
	}
}

// left reports whether the client has had the events it wanted of this
// stream (leaveAfter).
func (c *clientConn) left() bool { return c.leaveAfter > 0 && c.p.events >= c.leaveAfter }

// readN hands the next n body bytes to body, in pieces.
func (c *clientConn) readN(n int64, body func([]byte)) error {
	for n > 0 {
		k := int(min(n, int64(len(c.scratch))))
		got, err := io.ReadFull(c.br, c.scratch[:k])
		if got > 0 {
			body(c.scratch[:got])
			n -= int64(got)
			if c.left() {
				return errLeft
			}
		}
		if err != nil {
			return fmt.Errorf("read body: %w", unexpected(err))
		}
	}
	return nil
}

// readLine returns the next line without its CRLF. The slice is valid until
// the next read.
func (c *clientConn) readLine() ([]byte, error) {
	line, err := c.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		return nil, fmt.Errorf("%w: line over %d bytes", errProtocol, c.br.Size())
	}
	if err != nil {
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// unexpected turns an EOF in the middle of a body into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// sseParser counts the events of an SSE body fed in arbitrary pieces. It
// dispatches an event at a blank line that ends a block with at least one
// field; comment-only blocks (": ping") are not events. It keeps only what
// the benchmark checks: whether the last event was data: [DONE], whether an
// error event came, (when asked) the event ids, and (when asked) how many
// events carried generated text.
type sseParser struct {
	carry      []byte // an incomplete line from the previous piece
	inEvent    bool   // the current block has a field
	curDone    bool   // the current block's data is [DONE]
	curErr     bool   // the current block is an error event
	curContent bool   // the current block's data carries generated text
	curID      []byte // the current block's id
	hasID      bool
	collectIDs bool
	content    bool // look for generated text (contentEvents)

	events        int
	contentEvents int // events whose data carries generated text
	lastDone      bool
	errEvent      bool
	ids           []string
}

// reset readies the parser for a new body; content makes it count the
// events that carry generated text.
func (p *sseParser) reset(collectIDs, content bool) {
	*p = sseParser{carry: p.carry[:0], curID: p.curID[:0], collectIDs: collectIDs, content: content}
}

// contentField is how a chat chunk's delta begins its text.
var contentField = []byte(`"content":"`)

// hasContent reports whether data, a chat chunk, carries generated text: a
// "content" string that is not empty. The first chunk of an OpenAI chat
// stream names the role with "content":"", and carries none.
func hasContent(data []byte) bool {
	for {
		i := bytes.Index(data, contentField)
		if i < 0 {
			return false
		}
		data = data[i+len(contentField):]
		if len(data) > 0 && data[0] != '"' {
			return true
		}
	}
}

// feed parses the next piece of the body.
func (p *sseParser) feed(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.carry = append(p.carry, b...)
			return
		}
		line := b[:i]
		if len(p.carry) > 0 {
			p.carry = append(p.carry, line...)
			line = p.carry
		}
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
		p.line(line)
		p.carry = p.carry[:0]
		b = b[i+1:]
	}
}

// line handles one line of the body.
func (p *sseParser) line(line []byte) {
	if len(line) == 0 {
		if p.inEvent {
			p.events++
			p.lastDone = p.curDone
			if p.curErr {
				p.errEvent = true
			}
			if p.curContent {
				p.contentEvents++
			}
			if p.collectIDs && p.hasID {
				p.ids = append(p.ids, string(p.curID))
			}
		}
		p.inEvent, p.curDone, p.curErr, p.curContent, p.hasID = false, false, false, false, false
		p.curID = p.curID[:0]
		return
	}
	if line[0] == ':' {
		return // a comment
	}
	name, value, _ := bytes.Cut(line, []byte(":"))
	if len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	p.inEvent = true
	switch string(name) {
	case "data":
		p.curDone = string(value) == "[DONE]"
		if bytes.HasPrefix(value, []byte(`{"error"`)) {
			p.curErr = true
		}
		if p.content && !p.curContent && hasContent(value) {
			p.curContent = true
		}
	case "event":
		if string(value) == "error" {
			p.curErr = true
		}
	case "id":
		p.curID = append(p.curID[:0], value...)
		p.hasID = true
	}
}
