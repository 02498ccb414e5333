package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	gosse "github.com/tmaxmax/go-sse"

	"github.com/ssegate/ssegate/sse"
)

// maxEvent bounds the bytes of one event held while it arrives.
const maxEvent = 16 << 20

// resumeBody is a keyed event stream's body: it passes on whole events and
// reconnects when the connection breaks before the stream's end.
type resumeBody struct {
	t    *Transport
	req  *http.Request // the request as sent: URL, headers, context
	key  string
	home *url.URL // where the key's stream is resumed: see streamURL

	mu     sync.Mutex // guards rc and closed: Close may come from another goroutine
	rc     io.ReadCloser
	closed bool

	buf        []byte
	pending    []byte        // the event being received
	scan       int           // how far pending was searched for a line end
	out        []byte        // whole events not yet read
	off        int           // read position in out
	err        error         // what ends the body once out is read
	lastID     string        // the id of the last whole event passed on
	idless     bool          // an event without an id was passed on: no position to resume from
	ended      bool          // a terminal event was passed on
	det        *sse.Detector // tells the terminal event as the proxy does
	parser     eventParser   // reads the events' fields; closed by Close
	reconnects int
	bo         *fullJitter
}

// newResumeBody reads rc, the body of the answer to req; resumeURL is the
// answer's Ssegate-Resume-Url, if any.
func newResumeBody(t *Transport, req *http.Request, key string, rc io.ReadCloser, resumeURL string) *resumeBody {
	return &resumeBody{t: t, req: req, key: key, home: streamURL(req.URL, key, resumeURL), rc: rc, buf: make([]byte, 32<<10), bo: t.backoff(),
		det: sse.NewDetector(sse.Expect{}),
		// A request that resumed itself starts after its own Last-Event-ID.
		lastID: req.Header.Get("Last-Event-ID")}
}

func (b *resumeBody) Read(p []byte) (int, error) {
	for b.off == len(b.out) {
		b.out, b.off = b.out[:0], 0
		if b.err != nil {
			b.parser.close() // nothing more to parse
			return 0, b.err
		}
		b.fill()
	}
	n := copy(p, b.out[b.off:])
	b.off += n
	return n, nil
}

func (b *resumeBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.parser.close()
	return b.rc.Close()
}

func (b *resumeBody) current() (io.ReadCloser, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rc, b.closed
}

// fill reads once from the connection and takes what it can from it.
func (b *resumeBody) fill() {
	rc, closed := b.current()
	if closed {
		b.err = errors.New("client: read on closed body")
		return
	}
	n, err := rc.Read(b.buf)
	if n > 0 {
		b.feed(b.buf[:n])
	}
	if err == nil || b.err != nil {
		return
	}
	switch {
	case b.ended:
		b.err = io.EOF // the stream is whole; what broke after its end does not matter
	case err == io.EOF:
		// A clean end (the chunked body's last chunk, or the connection's
		// end without framing): the server ended the stream here.
		b.out = append(b.out, b.pending...)
		b.pending, b.scan = b.pending[:0], 0
		b.err = io.EOF
	default:
		if _, closed := b.current(); closed || b.req.Context().Err() != nil {
			b.err = err
			return
		}
		b.err = b.reconnect(err)
	}
}

// feed appends p to the event being received and moves every whole event
// (up to its blank line) to out.
func (b *resumeBody) feed(p []byte) {
	b.pending = append(b.pending, p...)
	for b.err == nil {
		i := bytes.IndexByte(b.pending[b.scan:], '\n')
		if i < 0 {
			if len(b.pending) > maxEvent {
				b.err = fmt.Errorf("client: an event over %d bytes", maxEvent)
			}
			return
		}
		start, end := b.scan, b.scan+i
		b.scan = end + 1
		if len(bytes.TrimSuffix(b.pending[start:end], []byte("\r"))) > 0 {
			continue
		}
		b.event(b.pending[:b.scan])
		b.pending = append(b.pending[:0], b.pending[b.scan:]...)
		b.scan = 0
	}
}

// event takes one whole event, its blank line included. Its fields are
// read by go-sse's parser, as sse.Read reads the upstream's, but here the id
// is kept: it is the position a reconnection resumes from.
func (b *resumeBody) event(ev []byte) {
	e, dispatched, err := b.parser.parse(ev)
	if err != nil {
		b.err = fmt.Errorf("client: reading an event: %w", err)
		return
	}
	if e.Type == "error" && gjson.Get(e.Data, "error.type").String() == "stream_aborted" {
		b.err = &AbortedError{Code: gjson.Get(e.Data, "error.code").String(), Message: gjson.Get(e.Data, "error.message").String()}
		return
	}
	b.out = append(b.out, ev...)
	if !dispatched {
		return // comments only, such as ": ping"
	}
	if e.LastEventID != "" {
		b.lastID = e.LastEventID
	} else {
		b.idless = true
	}
	if e.Type != "" || e.Data != "" { // as sse.Read, which skips id-only blocks
		b.det.Observe(sse.Event{Type: e.Type, Data: e.Data})
		b.ended = b.det.Terminal()
	}
}

// eventParser reads the whole events of a body, one at a time, with one
// go-sse reader for them all (a reader each cost 7 allocations and 5 KiB
// an event). After each event it gives the reader a marker block, which
// go-sse always dispatches and which clears its last id: the reader never
// waits for bytes that are not there, and each event's id is its own.
//
// Close may come from another goroutine than Read's, and the coroutine's
// next and stop must not run at once: mu keeps them apart. parse never
// waits for the connection, so Close waits for one event's parse at most.
type eventParser struct {
	mu      sync.Mutex // guards all below
	parts   [2][]byte  // what the reader is given: the event, then markerBytes
	next    func() (gosse.Event, error, bool)
	stop    func()
	stopped bool
}

// marker ends each event given to the reader: an empty id, then an event
// type no stream uses.
const (
	marker     = "id\nevent:\x00marker\n\n"
	markerType = "\x00marker"
)

var markerBytes = []byte(marker)

// errNoEvent is what the reader would read past an event and its marker,
// which it never does.
var errNoEvent = errors.New("client: read past the event")

func (p *eventParser) Read(b []byte) (int, error) {
	for i := range p.parts {
		if len(p.parts[i]) > 0 {
			n := copy(b, p.parts[i])
			p.parts[i] = p.parts[i][n:]
			return n, nil
		}
	}
	return 0, errNoEvent
}

// parse returns the last event go-sse dispatches in ev, a whole event, and
// whether there was one (none for comments only).
func (p *eventParser) parse(ev []byte) (e gosse.Event, dispatched bool, err error) {
	p.mu.Lock() // Close may run on another goroutine: the start too is under it
	defer p.mu.Unlock()
	if p.next == nil && !p.stopped {
		p.next, p.stop = iter.Pull2(gosse.Read(p, &gosse.ReadConfig{MaxEventSize: maxEvent + 4<<10}))
	}
	p.parts = [2][]byte{ev, markerBytes}
	for p.next != nil {
		r, err, ok := p.next()
		switch {
		case !ok:
			return e, false, errNoEvent
		case err != nil:
			return e, false, err
		case r.Type == markerType:
			return e, dispatched, nil
		}
		e, dispatched = r, true
	}
	return e, false, errNoEvent
}

// close ends the reader's coroutine; parse fails after it.
func (p *eventParser) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop != nil {
		p.stop()
	}
	p.next, p.stop, p.stopped = nil, nil, true
}

// reconnect replaces the broken connection with GET /streams/{key} from the
// last whole event on; it returns nil when the body can go on, or what ends
// it.
func (b *resumeBody) reconnect(cause error) error {
	if b.idless {
		return fmt.Errorf("client: stream cut, and its events carry no ids to resume from: %w", cause)
	}
	b.pending, b.scan = b.pending[:0], 0
	if rc, _ := b.current(); rc != nil {
		rc.Close()
	}
	ctx := b.req.Context()
	limit := orDefault(b.t.MaxReconnects, DefaultMaxReconnects)
	maxAfter := orDefault(b.t.MaxRetryAfter, DefaultMaxRetryAfter)
	last := cause
	var after time.Duration // a Retry-After the last answer asked for
	for b.reconnects < limit {
		b.reconnects++
		wait := b.bo.NextBackOff()
		if after > 0 {
			wait = after
		}
		tm := time.NewTimer(wait)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return context.Cause(ctx)
		}
		after = 0
		resp, err := b.t.base().RoundTrip(b.resumeRequest())
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			last = err
			continue
		}
		switch {
		case resp.StatusCode/100 == 2 && resp.StatusCode != http.StatusNoContent && isEventStream(resp.Header):
			b.mu.Lock()
			closed := b.closed
			if !closed {
				b.rc = resp.Body
			}
			b.mu.Unlock()
			if closed {
				resp.Body.Close()
				return errors.New("client: body closed")
			}
			return nil
		case resp.StatusCode == http.StatusNoContent:
			resp.Body.Close()
			return io.EOF // the last event passed on was the stream's last
		case resp.StatusCode == http.StatusGone:
			drain(resp.Body)
			return ErrStreamGone
		case retryable(resp.StatusCode):
			last = answerError(resp)
			if d, ok := retryAfter(resp.Header); ok {
				after = min(d, maxAfter)
			}
			continue
		default:
			return answerError(resp)
		}
	}
	return fmt.Errorf("%w (%d): %w", ErrReconnectLimit, b.reconnects, last)
}

func answerError(resp *http.Response) error {
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	drain(resp.Body)
	return &ResumeError{StatusCode: resp.StatusCode, Body: strings.TrimSpace(string(msg))}
}

// credentialParam is the query parameter that carries a credential
// (Gemini's ?key=); ssegate scopes keys by it as by the credential headers.
const credentialParam = "key"

// resumeHeader is the header in which ssegate names a keyed answer's
// resume URL.
const resumeHeader = "Ssegate-Resume-Url"

// streamURL is the URL of key's stream for a request to reqURL: the path of
// the answer's resume URL, resolved against reqURL (it is relative to it,
// so that it goes through whatever path prefix a gateway in front of
// ssegate adds), or else {scheme://host}/streams/{key}. A resume URL that
// would lead to another scheme or host is not followed: the reconnection
// carries the request's credentials.
func streamURL(reqURL *url.URL, key, resumeURL string) *url.URL {
	root := &url.URL{Scheme: reqURL.Scheme, User: reqURL.User, Host: reqURL.Host,
		Path: "/streams/" + key, RawPath: "/streams/" + url.PathEscape(key)}
	if resumeURL == "" {
		return root
	}
	ref, err := url.Parse(resumeURL)
	if err != nil {
		return root
	}
	u := reqURL.ResolveReference(ref)
	if u.Scheme != reqURL.Scheme || u.Host != reqURL.Host {
		return root
	}
	// The token is left out: it opens one generation until its expiry,
	// while the request's own credential opens the key for as long as it
	// is held.
	u.User, u.RawQuery, u.Fragment, u.RawFragment = reqURL.User, "", "", ""
	return u
}

// resumeRequest is GET of the key's stream (streamURL) with the original
// request's headers, content headers and the key header left out, and its
// credential query parameter, so that it reaches the same tenant's stream.
func (b *resumeBody) resumeRequest() *http.Request {
	u := *b.home
	if vs := b.req.URL.Query()[credentialParam]; len(vs) > 0 {
		u.RawQuery = url.Values{credentialParam: vs}.Encode()
	}
	r, _ := http.NewRequestWithContext(b.req.Context(), http.MethodGet, u.String(), nil)
	r.Host = b.req.Host
	for k, vs := range b.req.Header {
		switch http.CanonicalHeaderKey(k) {
		case "Content-Type", "Content-Length", "Content-Encoding", "Transfer-Encoding", "Expect",
			"Idempotency-Key", "Last-Event-Id":
			continue
		}
		r.Header[k] = append([]string(nil), vs...)
	}
	r.Header.Set("Accept", "text/event-stream")
	if b.lastID != "" {
		r.Header.Set("Last-Event-ID", b.lastID)
	}
	return r
}
