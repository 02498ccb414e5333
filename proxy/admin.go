package proxy

import (
	"context"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/ssegate/ssegate/proxy/upstream"
)

// Drain marks the proxy as draining: /readyz answers 503 so load
// balancers stop sending traffic, while open streams go on.
func (p *Proxy) Drain() { p.draining.Store(true) }

// AdminHandler serves /metrics, /healthz and /readyz, for a separate
// admin listener (Config.AdminSeparate).
func (p *Proxy) AdminHandler(ctx *fasthttp.RequestCtx) {
	if !p.serveAdmin(ctx, string(ctx.Path())) {
		fillError(&ctx.Response, causeAdminNotFound.err(""))
	}
}

// serveAdmin answers the operational endpoints; it reports whether path
// was one of them.
func (p *Proxy) serveAdmin(ctx *fasthttp.RequestCtx, path string) bool {
	if !ctx.IsGet() && !ctx.IsHead() {
		return false
	}
	switch path {
	case "/metrics":
		p.metricsHandler(ctx)
	case "/healthz":
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"status":"ok"}`)
	case "/readyz":
		p.serveReady(ctx)
	default:
		return false
	}
	return true
}

func (p *Proxy) serveReady(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	why := ""
	switch {
	case p.draining.Load():
		why = "draining"
	case !p.storeReachable():
		why = "store unreachable"
	case !p.upstreamReachable():
		why = "no upstream reachable"
	}
	if why != "" {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"status":"not ready","reason":"` + why + `"}`)
		return
	}
	ctx.SetBodyString(`{"status":"ready"}`)
}

func (p *Proxy) storeReachable() bool {
	s, ok := p.store.(pinger)
	if !ok {
		return true
	}
	c, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return s.Ping(c) == nil
}

// upstreamReachable reports whether some upstream's host circuit is not
// open and a TCP connection to it opens; the answer is kept for a second so a
// busy probe does not dial on every call.
func (p *Proxy) upstreamReachable() bool {
	p.readyMu.Lock()
	defer p.readyMu.Unlock()
	if time.Since(p.readyAt) < time.Second {
		return p.readyOK
	}
	ok := false
	for _, up := range p.ups {
		if up.Breaker().HostState() == upstream.CircuitOpen {
			continue
		}
		c, err := net.DialTimeout("tcp", up.Addr(), time.Second)
		if err == nil {
			c.Close()
			ok = true
			break
		}
	}
	p.readyAt, p.readyOK = time.Now(), ok
	return ok
}
