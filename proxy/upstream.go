package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/valyala/fasthttp"
)

// upstream is one LLM API endpoint, the clients that reach it, and the
// circuit breaker that keeps calls away from it, or from one of its
// models, while they fail (circuit.go).
//
// A streaming request and a non-streaming one may wait very differently
// long for their answer to begin: a stream's head comes within seconds,
// a non-streaming answer only once the whole completion is done. The
// bound lives in the connection (idleConn), fixed when it is dialed, so
// each kind of request has a client, and a pool, of its own. fasthttp
// has no per-request hook between taking a pooled connection and writing
// the request to it; its per-request timeout (Request.SetTimeout) is an
// absolute deadline over the whole streamed body, and it also shortens
// the wait for a pooled connection and turns running out of them into
// ErrTimeout, which would pass a local shortage for a silent upstream.
type upstream struct {
	name    string // the base URL without password or query, for logs and metrics
	base    *url.URL
	prefix  string               // path prefix from the base URL, without a trailing slash
	addr    string               // host:port
	stream  *fasthttp.HostClient // for requests that ask for a stream: the head within HeadTimeout
	whole   *fasthttp.HostClient // for the others: the whole answer within Retry.AttemptTimeout
	breaker *breaker
	// retryAmbiguous: the upstream deduplicates on Idempotency-Key
	// (Config.RetryAmbiguous), so an ambiguous failure may be repeated.
	retryAmbiguous bool
	// conns holds the upstream's open connections, so that an abort can
	// cut the calls that wait for a head (closeAll): fasthttp's Do has no
	// cancellation of its own.
	conns *connSet
}

// connSet is a set of open upstream connections.
type connSet struct {
	mu sync.Mutex // guards m
	m  map[*idleConn]struct{}
}

func (s *connSet) add(c *idleConn) {
	s.mu.Lock()
	s.m[c] = struct{}{}
	s.mu.Unlock()
}

func (s *connSet) remove(c *idleConn) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

// closeAll closes every open connection: a call waiting for its head, or
// reading its answer, fails at once. Used when the proxy aborts.
func (s *connSet) closeAll() {
	s.mu.Lock()
	cs := make([]*idleConn, 0, len(s.m))
	for c := range s.m {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.interrupted.Store(true)
		c.Conn.Close() //nolint:errcheck // interrupting a call
	}
}

// budget names the time bound that cut an upstream connection.
type timeBudget int

const (
	budgetHead    timeBudget = iota // a streaming answer's first byte (HeadTimeout)
	budgetAttempt                   // a non-streaming answer (Retry.AttemptTimeout)
	budgetIdle                      // a silence once the answer began (UpstreamIdleTimeout)
)

// String is the budget's metric label.
func (b timeBudget) String() string {
	switch b {
	case budgetHead:
		return "head"
	case budgetAttempt:
		return "attempt"
	}
	return "idle"
}

// flag names the setting of the budget, for logs.
func (b timeBudget) flag() string {
	switch b {
	case budgetHead:
		return "-head-timeout"
	case budgetAttempt:
		return "-attempt-timeout"
	}
	return "-upstream-idle-timeout"
}

// onTimeout is told of every upstream connection a budget cut: which
// upstream, which budget, and the bound it held.
type onTimeout func(upstream string, b timeBudget, bound time.Duration)

func newUpstream(raw string, cfg *Config, changed func(circuitChange), timedOut onTimeout) (*upstream, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error quotes the whole URL, which may hold a password.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("upstream: %w", err)
	}
	name := URLForLog(u)
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("upstream %q: scheme must be http or https", name)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("upstream %q: no host", name)
	}
	addr := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			addr += ":443"
		} else {
			addr += ":80"
		}
	}
	connect := cfg.UpstreamConnectTimeout
	var tlsCfg *tls.Config // one for both clients, so that they share a session cache if it has one
	if u.Scheme == "https" {
		tlsCfg = &tls.Config{}
		if cfg.UpstreamTLS != nil {
			tlsCfg = cfg.UpstreamTLS.Clone()
		}
		if tlsCfg.ServerName == "" {
			tlsCfg.ServerName = u.Hostname()
		}
	}
	conns := &connSet{m: map[*idleConn]struct{}{}}
	client := func(head time.Duration, b timeBudget) *fasthttp.HostClient {
		return &fasthttp.HostClient{
			Addr:               addr,
			IsTLS:              u.Scheme == "https",
			StreamResponseBody: true,
			MaxConns:           cfg.UpstreamMaxConns,
			// A call waits for a pooled connection rather than failing at once;
			// MaxStreams already bounds how many calls there are.
			MaxConnWaitTimeout:            connect,
			MaxIdleConnDuration:           5 * time.Second,
			ReadBufferSize:                4 << 10, // per upstream connection, so per stream
			NoDefaultUserAgentHeader:      true,
			DisableHeaderNamesNormalizing: true,
			DisablePathNormalizing:        true,
			// Parse errors would quote the upstream's bytes.
			SecureErrorLogMessage: true,
			// The client never retries on its own: whether a retry is safe is
			// the proxy's decision (retry.go).
			// Except where nothing was sent: a pooled connection the
			// upstream closed while idle (errStale) is passed over for
			// another, at once (up to MaxIdemponentCallAttempts, 5).
			RetryIfErr: func(_ *fasthttp.Request, _ int, err error) (resetTimeout, retry bool) { return false, isStale(err) },
			Dial: func(addr string) (net.Conn, error) {
				c, err := dial(addr, connect, tlsCfg)
				if err != nil {
					return nil, err
				}
				ic := &idleConn{Conn: c, idle: cfg.UpstreamIdleTimeout, head: head, whole: b == budgetAttempt, headBudget: b}
				if timedOut != nil {
					ic.timedOut = func(b timeBudget, bound time.Duration) { timedOut(name, b, bound) }
				}
				ic.laddr = &connAddr{Addr: c.LocalAddr(), c: ic}
				ic.owner = conns
				conns.add(ic)
				return ic, nil
			},
		}
	}
	return &upstream{name: name, base: u, prefix: strings.TrimSuffix(u.Path, "/"), addr: addr,
		stream: client(cfg.HeadTimeout, budgetHead), whole: client(cfg.Retry.AttemptTimeout, budgetAttempt),
		breaker: newBreaker(name, &cfg.Retry, changed), conns: conns,
		retryAmbiguous: slices.Contains(cfg.RetryAmbiguous, raw) || slices.Contains(cfg.RetryAmbiguous, "*")}, nil
}

// do sends req on the client for its kind (stream: the request asks for
// a streamed answer) and returns when the answer's head is read, or the
// call failed.
func (u *upstream) do(req *fasthttp.Request, resp *fasthttp.Response, stream bool) error {
	hc := u.whole
	if stream {
		hc = u.stream
	}
	return hc.Do(req, resp)
}

// dial connects to addr within connect, TLS handshake included when
// tlsCfg is set. It does the handshake itself, under the connection's
// budgets rather than over them, so that idleConn sees the HTTP exchange
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

// pick returns the first upstream from index start on (wrapping) whose
// circuits (its host's and model's, a key from modelKey) let a call
// through, with the function that reports the call's health to them.
func pick(ups []*upstream, start int, model string) (up *upstream, idx int, done func(error), ok bool) {
	for i := range ups {
		j := (start + i) % len(ups)
		if d, ok := ups[j].breaker.allow(model); ok {
			return ups[j], j, d, true
		}
	}
	return nil, 0, nil, false
}

// localFailure reports a failure of this process, not of the upstream:
// its own connection pool or file descriptors ran out.
func localFailure(err error) bool {
	return errors.Is(err, fasthttp.ErrNoFreeConns) || isStale(err) || errors.Is(err, errNotCalled) || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// errStale is what a request's first write on a pooled connection
// returns, without writing, when the upstream closed that connection
// while it was idle: nothing of the request reached the upstream, so it
// may be sent again on another. It is the only failure on a reused
// connection that proves the request unread; any other (a reset, a close
// after the request was written) may have come after the upstream read
// it, and is ambiguous.
var errStale = errors.New("the upstream closed the pooled connection while it was idle")

func isStale(err error) bool { return errors.Is(err, errStale) }

// errNotCalled settles a circuit's admission that was not used: the call
// was never made.
var errNotCalled = errors.New("the call was not made")

// dialError marks a failure to connect: nothing reached the upstream.
type dialError struct{ err error }

func (e *dialError) Error() string { return "connect: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// idleConn holds an upstream connection to the proxy's time budgets,
// which fasthttp's own timeouts cannot express: they are absolute
// deadlines, set once before the head and kept over the whole body. It
// sits above TLS (dial), so what it writes is requests and what it reads
// is answers.
//
// From the first byte of each request written, one deadline, head later,
// bounds writing the request and waiting for the answer's first byte: a
// streaming answer's head (budgetHead), or for a non-streaming request
// the whole answer (whole, budgetAttempt). Once the answer began, every
// Read may wait at most idle besides, so a long healthy stream lives
// while one that went silent is cut.
type idleConn struct {
	net.Conn
	idle, head  time.Duration
	headBudget  timeBudget // what head bounds: budgetHead, or budgetAttempt when whole
	whole       bool       // the deadline bounds the whole answer, not only its first byte
	deadline    time.Time
	sending     bool       // a request is being written: set by Write, cleared by Read
	awaiting    bool       // no byte of the answer yet: set by Write, cleared by the first
	set         time.Time  // the read deadline last set
	bound       timeBudget // the budget of the read deadline last set
	cut         bool       // a budget cut the connection; it is reported once
	timedOut    func(b timeBudget, bound time.Duration)
	laddr       *connAddr
	owner       *connSet    // the upstream's open connections, which this one leaves on Close
	interrupted atomic.Bool // closed by interrupt: never to be pooled again
	reused      bool        // a request was written before: the next one's first write checks peerClosed
	drainUntil  time.Time   // set by drainBy: what is left of the answer must come by then
	// beforeRead, while a generation relays an answer from the connection
	// (set by gen.relayBody, unset by gen.drop), runs before each read from
	// the connection (for an https upstream, from its TLS session).
	beforeRead func()
}

// connAddr is an idleConn's local address. fasthttp gives it to the
// answer read from the connection (Response.LocalAddr), which is how a
// generation finds the connection its answer comes from.
type connAddr struct {
	net.Addr
	c *idleConn
}

func (c *idleConn) LocalAddr() net.Addr { return c.laddr }

// Close closes the connection and takes it out of its upstream's set.
func (c *idleConn) Close() error {
	if c.owner != nil {
		c.owner.remove(c)
	}
	return c.Conn.Close()
}

// Handshake tells fasthttp that the connection needs no TLS of its own
// (it wraps only connections without this method): dial did the
// handshake for an https upstream, and an http one needs none.
func (c *idleConn) Handshake() error { return nil }

// connOf returns the connection an answer is read from, if it is one of
// the upstream client's own.
func connOf(resp *fasthttp.Response) *idleConn {
	if a, ok := resp.LocalAddr().(*connAddr); ok {
		return a.c
	}
	return nil
}

func (c *idleConn) Write(p []byte) (int, error) {
	if !c.sending {
		// The first write of a request. On a connection that served one
		// before, the upstream may have closed it while it sat in the
		// pool; fasthttp would write the request into it and read a
		// reset or an EOF, which cannot be told from an upstream that
		// read the request and then failed. Looked at now, before a byte
		// is written, the close proves the request unread.
		if c.reused {
			closed := peerClosed(c.Conn)
			c.set = time.Time{} // peerClosed cleared it: the next Read sets it
			if closed {
				return 0, errStale
			}
		}
		c.reused = true
		c.drainUntil = time.Time{}
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
func (c *idleConn) SetReadDeadline(t time.Time) error {
	c.set = time.Time{}
	return c.Conn.SetReadDeadline(t)
}

func (c *idleConn) SetDeadline(t time.Time) error {
	c.set = time.Time{}
	return c.Conn.SetDeadline(t)
}

func (c *idleConn) Read(p []byte) (int, error) {
	if c.beforeRead != nil {
		c.beforeRead()
	}
	c.sending = false
	want, b, exact := time.Now().Add(c.idle), budgetIdle, false
	if c.awaiting || (c.whole && c.deadline.Before(want)) {
		want, b, exact = c.deadline, c.headBudget, true
	}
	if !c.drainUntil.IsZero() && c.drainUntil.Before(want) {
		want, exact = c.drainUntil, true
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
	if err != nil && c.drainUntil.IsZero() { // a drain's end is no budget's
		c.report(err, c.bound)
	}
	return n, err
}

// drainBy bounds the reading of what is left of the current answer, once
// it is known to be no part of the answer (after the terminal event): an
// upstream that keeps the body open, or trickles comments, holds the
// generation that long at most, and the connection is then closed rather
// than reused.
func (c *idleConn) drainBy(t time.Time) {
	if c != nil {
		c.drainUntil = t
	}
}

// report tells timedOut, once, that budget b cut the connection.
func (c *idleConn) report(err error, b timeBudget) {
	if c.cut || c.timedOut == nil || !isTimeout(err) {
		return
	}
	c.cut = true
	bound := c.head
	if b == budgetIdle {
		bound = c.idle
	}
	c.timedOut(b, bound)
}

// hopHeaders are meaningful for one connection only and never relayed.
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// newTemplate copies the client's request for the upstream: method, path,
// query, body and end-to-end headers (Idempotency-Key among them, unchanged
// on every attempt). The upstream is asked for an uncompressed answer,
// because the proxy reads its events.
func newTemplate(ctx *fasthttp.RequestCtx) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	ctx.Request.Header.CopyTo(&req.Header)
	for _, h := range hopHeaders {
		req.Header.Del(h)
	}
	// A header named by Connection is hop-by-hop too.
	if c := ctx.Request.Header.Peek("Connection"); len(c) > 0 {
		for _, name := range bytes.Split(c, []byte(",")) {
			req.Header.DelBytes(bytes.TrimSpace(name))
		}
	}
	req.Header.Del("Accept-Encoding")
	req.Header.Del("Content-Length")
	req.SetBody(ctx.Request.Body())
	req.SetRequestURIBytes(ctx.URI().RequestURI())
	return req
}

// prepare returns a copy of the template addressed to this upstream.
func (u *upstream) prepare(tmpl *fasthttp.Request) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	tmpl.CopyTo(req)
	uri := req.URI()
	path := u.prefix + string(tmpl.URI().PathOriginal())
	uri.SetScheme(u.base.Scheme)
	uri.SetHost(u.base.Host)
	uri.SetPath(path)
	req.Header.SetHost(u.base.Host)
	return req
}

// copyHead reads the end-to-end headers of an upstream answer.
func copyHead(resp *fasthttp.Response) cache.Head {
	h := cache.Head{
		Status:      resp.StatusCode(),
		ContentType: string(resp.Header.ContentType()),
	}
	h.Stream = h.Status >= 200 && h.Status < 300 && isEventStream(h.ContentType)
	for k, v := range resp.Header.All() {
		name := string(k)
		if skipResponseHeader(name) {
			continue
		}
		h.Header = append(h.Header, cache.Header{Name: name, Value: string(v)})
	}
	return h
}

func skipResponseHeader(name string) bool {
	for _, h := range hopHeaders {
		if strings.EqualFold(name, h) {
			return true
		}
	}
	switch strings.ToLower(name) {
	case "content-length", "content-type", "content-encoding", "date", "server", "set-cookie":
		return true
	case "ssegate-outcome", "ssegate-stored":
		// An ssegate behind speaks of its own key; this proxy says what
		// became of its own (outcomeHead), and a stored answer replays
		// without them.
		return true
	}
	return false
}

func isEventStream(ct string) bool {
	ct = strings.TrimSpace(strings.ToLower(ct))
	return strings.HasPrefix(ct, "text/event-stream")
}

// readBody reads a non-streamed answer up to limit bytes.
func readBody(resp *fasthttp.Response, limit int) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(bodyOf(resp), int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(body) > limit {
		return nil, errBodyTooLarge
	}
	return body, nil
}

var errBodyTooLarge = errors.New("upstream body exceeds the byte bound")

// bodyOf is the reader of an answer's body. fasthttp streams a body, but
// gives no stream where there is none to read (the answer to a HEAD, a 204
// or a 304): then what it holds, nothing, is the body.
func bodyOf(resp *fasthttp.Response) io.Reader {
	if r := resp.BodyStream(); r != nil {
		return r
	}
	return bytes.NewReader(resp.Body())
}

// isTimeout reports whether err is a timeout (the upstream went silent).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, fasthttp.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout())
}

// isDial reports whether err happened before anything was sent.
func isDial(err error) bool {
	var de *dialError
	return errors.As(err, &de) || errors.Is(err, fasthttp.ErrNoFreeConns) // nothing was sent
}

// URLForLog returns u as logs and metrics may show it: without its
// password, query and fragment, which may hold credentials.
func URLForLog(u *url.URL) string {
	c := *u
	c.RawQuery, c.ForceQuery, c.Fragment, c.RawFragment = "", false, "", ""
	return c.Redacted()
}
