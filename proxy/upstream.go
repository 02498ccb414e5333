package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/valyala/fasthttp"
)

// upstream is one LLM API endpoint, the client that reaches it, and the
// circuit breaker that keeps calls away from it, or from one of its
// models, while they fail (circuit.go).
type upstream struct {
	name    string // the base URL, for logs
	base    *url.URL
	prefix  string // path prefix from the base URL, without a trailing slash
	client  *fasthttp.HostClient
	breaker *breaker
}

func newUpstream(raw string, cfg *Config, changed func(circuitChange)) (*upstream, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("upstream %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("upstream %q: scheme must be http or https", raw)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("upstream %q: no host", raw)
	}
	addr := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			addr += ":443"
		} else {
			addr += ":80"
		}
	}
	idle, connect, head := cfg.UpstreamIdleTimeout, cfg.UpstreamConnectTimeout, cfg.Retry.AttemptTimeout
	hc := &fasthttp.HostClient{
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
		// The client never retries on its own: whether a retry is safe is
		// the proxy's decision (retry.go).
		RetryIfErr: func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		Dial: func(addr string) (net.Conn, error) {
			c, err := net.DialTimeout("tcp", addr, connect)
			if err != nil {
				return nil, &dialError{err}
			}
			ic := &idleConn{Conn: c, idle: idle, head: head}
			ic.laddr = &connAddr{Addr: c.LocalAddr(), c: ic}
			return ic, nil
		},
	}
	return &upstream{name: raw, base: u, prefix: strings.TrimSuffix(u.Path, "/"), client: hc,
		breaker: newBreaker(raw, &cfg.Retry, changed)}, nil
}

// pick returns the first upstream from index start on (wrapping) whose
// circuits (its host's and model's, a key from requestModel) let a call
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
	return errors.Is(err, fasthttp.ErrNoFreeConns) || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// dialError marks a failure to connect: nothing reached the upstream.
type dialError struct{ err error }

func (e *dialError) Error() string { return "connect: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// idleConn turns fasthttp's absolute read deadline into an idle timeout:
// every Read may wait at most idle, so a long healthy stream lives while a
// silent upstream is cut. After each request is written, the first byte of
// the answer must come within head (the per-attempt timeout).
type idleConn struct {
	net.Conn
	idle, head   time.Duration
	headDeadline time.Time // set by Write, cleared by the first answer byte
	set          time.Time // the read deadline last set
	laddr        *connAddr
	cut          atomic.Bool // closed by interrupt: never to be pooled again
	// beforeRead, while a generation reads an answer from the connection,
	// runs before each read from the socket: the generation then writes
	// its client what it journaled since the last read, all together,
	// before it may wait for the upstream.
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

// connOf returns the connection an answer is read from, if it is one of
// the upstream client's own.
func connOf(resp *fasthttp.Response) *idleConn {
	if a, ok := resp.LocalAddr().(*connAddr); ok {
		return a.c
	}
	return nil
}

func (c *idleConn) Write(p []byte) (int, error) {
	c.headDeadline = time.Now().Add(c.head)
	return c.Conn.Write(p)
}

// SetReadDeadline and SetDeadline are fasthttp's own calls; the next Read
// sets the idle deadline again.
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
	d := time.Now().Add(c.idle)
	switch {
	case !c.headDeadline.IsZero():
		// Awaiting an answer: the deadline must be exact.
		if c.headDeadline.Before(d) {
			d = c.headDeadline
		}
	case !c.set.IsZero() && d.Sub(c.set) <= c.idle/16:
		// Moving the deadline costs a timer update per read; moving it
		// only when it is a sixteenth of idle stale keeps the bound
		// within 7%.
		d = time.Time{}
	}
	if !d.IsZero() {
		if err := c.Conn.SetReadDeadline(d); err != nil {
			return 0, err
		}
		c.set = d
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.headDeadline = time.Time{}
	}
	return n, err
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
	}
	return false
}

func isEventStream(ct string) bool {
	ct = strings.TrimSpace(strings.ToLower(ct))
	return strings.HasPrefix(ct, "text/event-stream")
}

// readBody reads a non-streamed answer up to limit bytes.
func readBody(resp *fasthttp.Response, limit int) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(resp.BodyStream(), int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(body) > limit {
		return nil, errBodyTooLarge
	}
	return body, nil
}

var errBodyTooLarge = errors.New("upstream body exceeds the byte bound")

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
