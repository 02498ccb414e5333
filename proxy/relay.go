package proxy

import (
	"fmt"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// relay passes a request without a key to the upstream and its answer
// back: an event stream event by event (ended with stream_aborted when it
// does not end cleanly), anything else as it comes. Nothing is recorded,
// only safe retries are made (no ambiguous ones: without a key a repeat
// could run the request twice), and a client that goes away ends the
// upstream call.
func (p *Proxy) relay(ctx *fasthttp.RequestCtx) {
	body := sse.ParseRequest(ctx.Request.Body())
	if body.Duplicate != "" {
		p.refuseDuplicate(ctx, body.Duplicate)
		return
	}
	if !p.acquireSlot() {
		p.refuse(ctx, causeMaxStreams, fmt.Sprintf("%d calls", p.cfg.MaxStreams))
		return
	}
	p.hooks.decided(ctx, decisionRelay, 0)
	f := cache.NewDetached(p.cfg.MaxStreamBytes)
	g := p.newGen(f, body, llmKind)
	p.hooks.generationStarted(g, ctx)
	g.o.onGone = func() { g.cancel(causeClientGone) }
	g.launch(upstream.NewTemplate(ctx))
	p.serveOrigin(ctx, g)
}
