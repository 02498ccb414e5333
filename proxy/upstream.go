package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/valyala/fasthttp"
)

// upstream is one LLM API endpoint and the client that reaches it.
type upstream struct {
	base   *url.URL
	prefix string // path prefix from the base URL, without a trailing slash
	client *fasthttp.HostClient
}

func newUpstream(raw string, cfg *Config) (*upstream, error) {
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
	idle, connect := cfg.UpstreamIdleTimeout, cfg.UpstreamConnectTimeout
	hc := &fasthttp.HostClient{
		Addr:                          addr,
		IsTLS:                         u.Scheme == "https",
		StreamResponseBody:            true,
		MaxConns:                      cfg.UpstreamMaxConns,
		MaxIdleConnDuration:           5 * time.Second,
		ReadBufferSize:                16 << 10,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		// A POST is never retried by the client itself: whether a retry is
		// safe is the proxy's decision.
		RetryIfErr: func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		Dial: func(addr string) (net.Conn, error) {
			c, err := net.DialTimeout("tcp", addr, connect)
			if err != nil {
				return nil, &dialError{err}
			}
			return &idleConn{Conn: c, idle: idle}, nil
		},
	}
	return &upstream{base: u, prefix: strings.TrimSuffix(u.Path, "/"), client: hc}, nil
}

// dialError marks a failure to connect: nothing reached the upstream.
type dialError struct{ err error }

func (e *dialError) Error() string { return "connect: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// idleConn turns fasthttp's absolute read deadline into an idle timeout:
// every Read may wait at most idle, so a long healthy stream lives while a
// silent upstream is cut.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c *idleConn) Read(p []byte) (int, error) {
	if err := c.Conn.SetReadDeadline(time.Now().Add(c.idle)); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

// hopHeaders are meaningful for one connection only and never relayed.
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// buildRequest copies the client's request for the upstream: method, path,
// query, body and end-to-end headers. The upstream is asked for an
// uncompressed answer, because the proxy reads its events.
func (u *upstream) buildRequest(ctx *fasthttp.RequestCtx) *fasthttp.Request {
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
	uri := req.URI()
	uri.SetScheme(u.base.Scheme)
	uri.SetHost(u.base.Host)
	uri.SetPath(u.prefix + string(ctx.URI().PathOriginal()))
	uri.SetQueryStringBytes(ctx.URI().QueryString())
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
	return errors.As(err, &de) || errors.Is(err, fasthttp.ErrNoFreeConns)
}
