package proxy

import (
	"fmt"
	"io"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// relay passes a request without a key to the upstream and its answer
// back: an event stream event by event (ended with stream_aborted when it
// does not end cleanly), anything else as it comes. Nothing is recorded,
// and a client that goes away ends the upstream call.
func (p *Proxy) relay(ctx *fasthttp.RequestCtx) {
	if !p.acquire() {
		p.writeError(ctx, errCapacity(fmt.Sprintf("-max-streams (%d) upstream calls are in progress", p.cfg.MaxStreams)))
		return
	}
	f := cache.NewDetached(p.cfg.MaxStreamBytes)
	g := p.newGen(f, sse.WantsUsage(ctx.Request.Body()))
	resp, err := g.call(p.up.buildRequest(ctx))
	if err != nil {
		g.finish()
		if !isDial(err) && isTimeout(err) {
			p.writeError(ctx, errUpstreamTimeout("the upstream did not answer in time"))
		} else {
			p.writeError(ctx, errUpstream("the upstream could not be reached: "+err.Error()))
		}
		return
	}
	head := copyHead(resp)
	writeHead(ctx, head, false)
	if !head.Stream {
		p.stream(ctx, func(c *client) bool {
			defer g.finish()
			return copyBody(c, resp.BodyStream())
		}, nil)
		return
	}
	f.SetHead(head)
	sub, _ := f.Subscribe(0)
	go func() {
		defer g.finish()
		g.pump(resp)
	}()
	p.stream(ctx, func(c *client) bool { return p.follow(c, sub, f) }, func() { g.cancel("client_gone") })
}

// copyBody relays a body that is not an event stream, flushing whatever
// arrives so a slow upstream's bytes are not held back.
func copyBody(c *client, r io.Reader) bool {
	buf := make([]byte, 16<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 && c.write(buf[:n]) != nil {
			return false
		}
		if err != nil {
			return true
		}
	}
}
