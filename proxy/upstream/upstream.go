package upstream

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// Upstream is one LLM API endpoint, the clients that reach it, and the
// circuit breaker that keeps calls away from it, or from one of its
// models, while they fail (circuit.go).
//
// A streaming request and a non-streaming one may wait very differently
// long for their answer to begin: a stream's head comes within seconds,
// a non-streaming answer only once the whole completion is done. The
// bound lives in the connection (Conn), fixed when it is dialed, so
// each kind of request has a client, and a pool, of its own. fasthttp
// has no per-request hook between taking a pooled connection and writing
// the request to it; its per-request timeout (Request.SetTimeout) is an
// absolute deadline over the whole streamed body, and it also shortens
// the wait for a pooled connection and turns running out of them into
// ErrTimeout, which would pass a local shortage for a silent upstream.
type Upstream struct {
	name    string // the base URL without password or query, for logs and metrics
	base    *url.URL
	prefix  string               // path prefix from the base URL, without a trailing slash
	addr    string               // host:port
	stream  *fasthttp.HostClient // for requests that ask for a stream: the head within HeadTimeout
	whole   *fasthttp.HostClient // for the others: the whole answer within Retry.AttemptTimeout
	breaker *Breaker
	// retryAmbiguous: the upstream deduplicates on Idempotency-Key
	// (Config.RetryAmbiguous), so an ambiguous failure may be repeated.
	retryAmbiguous bool
	// conns holds the upstream's open connections, so that an abort can
	// cut the calls that wait for a head (closeAll): fasthttp's Do has no
	// cancellation of its own.
	conns *connSet
}

// Config is what an upstream takes of the proxy's configuration. Unlike
// most configs here it has no defaults of its own: the proxy's Config
// sets them.
type Config struct {
	// ConnectTimeout bounds dialing the upstream, TLS handshake included.
	ConnectTimeout time.Duration
	// HeadTimeout bounds the wait for a streaming answer's first byte.
	HeadTimeout time.Duration
	// IdleTimeout bounds a silence of the upstream once its answer began.
	IdleTimeout time.Duration
	// MaxConns bounds the connections of each of the upstream's two clients.
	MaxConns int
	// TLS configures TLS to an https upstream (nil: the system's roots).
	TLS *tls.Config
	// Retry holds the attempt timeout and the circuits' settings; the
	// upstream keeps the pointer.
	Retry *RetryConfig
	// RetryAmbiguous names the upstreams, by base URL or "*" for all,
	// that deduplicate on Idempotency-Key.
	RetryAmbiguous []string
}

// The time budgets of an upstream connection.
const (
	BudgetHead    TimeBudget = iota // a streaming answer's first byte (HeadTimeout)
	BudgetAttempt                   // a non-streaming answer (Retry.AttemptTimeout)
	BudgetIdle                      // a silence once the answer began (UpstreamIdleTimeout)
)

// New returns the upstream at the base URL raw. changed, if not nil, is
// told of each of its circuits that opens or closes (outside the circuit's
// lock); timedOut, if not nil, of each connection a time budget cut.
func New(raw string, cfg *Config, changed func(CircuitChange), timedOut OnTimeout) (*Upstream, error) {
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
	connect := cfg.ConnectTimeout
	var tlsCfg *tls.Config // one for both clients, so that they share a session cache if it has one
	if u.Scheme == "https" {
		tlsCfg = &tls.Config{}
		if cfg.TLS != nil {
			tlsCfg = cfg.TLS.Clone()
		}
		if tlsCfg.ServerName == "" {
			tlsCfg.ServerName = u.Hostname()
		}
	}
	conns := &connSet{m: map[*Conn]struct{}{}}
	client := func(head time.Duration, b TimeBudget) *fasthttp.HostClient {
		return &fasthttp.HostClient{
			Addr:               addr,
			IsTLS:              u.Scheme == "https",
			StreamResponseBody: true,
			MaxConns:           cfg.MaxConns,
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
			RetryIfErr: func(_ *fasthttp.Request, _ int, err error) (resetTimeout, retry bool) { return false, IsStale(err) },
			Transport:  callTransport{},
			Dial: func(addr string) (net.Conn, error) {
				c, err := dial(addr, connect, tlsCfg)
				if err != nil {
					return nil, err
				}
				ic := &Conn{Conn: c, idle: cfg.IdleTimeout, head: head, whole: b == BudgetAttempt, headBudget: b}
				if timedOut != nil {
					ic.timedOut = func(b TimeBudget, bound time.Duration) { timedOut(name, b, bound) }
				}
				ic.laddr = &connAddr{Addr: c.LocalAddr(), c: ic}
				ic.owner = conns
				conns.add(ic)
				return ic, nil
			},
		}
	}
	return &Upstream{name: name, base: u, prefix: strings.TrimSuffix(u.Path, "/"), addr: addr,
		stream: client(cfg.HeadTimeout, BudgetHead), whole: client(cfg.Retry.AttemptTimeout, BudgetAttempt),
		breaker: newBreaker(name, cfg.Retry, changed), conns: conns,
		retryAmbiguous: slices.Contains(cfg.RetryAmbiguous, raw) || slices.Contains(cfg.RetryAmbiguous, "*")}, nil
}

// Do sends req on the client for its kind (stream: the request asks for
// a streamed answer) and returns when the answer's head is read, or the
// call failed.
func (u *Upstream) Do(req *fasthttp.Request, resp *fasthttp.Response, stream bool) error {
	return u.DoCall(req, resp, stream, nil)
}

// DoCall is Do for a call that call may interrupt while it runs, its
// wait for the head included (Call). A request without a body cannot be
// interrupted before its head came.
func (u *Upstream) DoCall(req *fasthttp.Request, resp *fasthttp.Response, stream bool, call *Call) error {
	hc := u.whole
	if stream {
		hc = u.stream
	}
	if call == nil || len(req.Body()) == 0 || req.IsBodyStream() {
		return hc.Do(req, resp)
	}
	b := &call.body
	b.call, b.resp = call, resp
	data := append(b.data[:0], req.Body()...) // the request's buffer goes back to its pool
	b.set(req, data)
	err := hc.Do(req, resp)
	call.unbind()
	b.resp = nil
	return err
}

// Pick returns the first upstream from index start on (wrapping) whose
// circuits (its host's and model's, a key from ModelKey) let a call
// through, with the function that reports the call's health to them.
func Pick(ups []*Upstream, start int, model string) (up *Upstream, idx int, done func(error), ok bool) {
	for i := range ups {
		j := (start + i) % len(ups)
		if d, ok := ups[j].breaker.allow(model); ok {
			return ups[j], j, d, true
		}
	}
	return nil, 0, nil, false
}

// ErrNotCalled settles a circuit's admission that was not used: the call
// was never made.
var ErrNotCalled = errors.New("the call was not made")

// HopHeaders are meaningful for one connection only and never relayed.
var HopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// NewTemplate copies the client's request for the upstream: method, path,
// query, body and end-to-end headers (Idempotency-Key among them, unchanged
// on every attempt). The upstream is asked for an uncompressed answer,
// because the proxy reads its events.
func NewTemplate(ctx *fasthttp.RequestCtx) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	ctx.Request.Header.CopyTo(&req.Header)
	for _, h := range HopHeaders {
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

// Prepare returns a copy of the template addressed to this upstream.
func (u *Upstream) Prepare(tmpl *fasthttp.Request) *fasthttp.Request {
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

// URLForLog returns u as logs and metrics may show it: without its
// password, query and fragment, which may hold credentials.
func URLForLog(u *url.URL) string {
	c := *u
	c.RawQuery, c.ForceQuery, c.Fragment, c.RawFragment = "", false, "", ""
	return c.Redacted()
}

// WebSocketURL is the upstream's WebSocket URL for pathAndQuery (a
// request's path and query, under the base URL's path): ws, or wss for
// an https upstream.
func (u *Upstream) WebSocketURL(pathAndQuery string) string {
	scheme := "ws"
	if u.base.Scheme == "https" {
		scheme = "wss"
	}
	return scheme + "://" + u.base.Host + u.prefix + pathAndQuery
}

// Name is the upstream's base URL as logs and metrics show it (URLForLog).
func (u *Upstream) Name() string { return u.name }

// Addr is the upstream's host:port.
func (u *Upstream) Addr() string { return u.addr }

// Hostname is the host of the upstream's base URL, without a port.
func (u *Upstream) Hostname() string { return u.base.Hostname() }

// Port is the port of the upstream's base URL, or "" when it names none.
func (u *Upstream) Port() string { return u.base.Port() }

// Breaker is the upstream's circuit breaker.
func (u *Upstream) Breaker() *Breaker { return u.breaker }

// RetryAmbiguous reports whether the upstream deduplicates on
// Idempotency-Key (Config.RetryAmbiguous), so that an ambiguous failure
// may be repeated to it.
func (u *Upstream) RetryAmbiguous() bool { return u.retryAmbiguous }

// CloseAll closes every open connection to the upstream: a call waiting
// for its head, or reading its answer, fails at once. Used when the proxy
// aborts.
func (u *Upstream) CloseAll() { u.conns.closeAll() }

// CloseIdleConnections closes the upstream's pooled connections that no
// call is using.
func (u *Upstream) CloseIdleConnections() {
	u.stream.CloseIdleConnections()
	u.whole.CloseIdleConnections()
}
