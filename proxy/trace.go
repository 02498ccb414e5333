package proxy

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Spans (docs/metrics.md, Traces): one server span per request, ended
// with its answer; one client span per upstream call, a child of the
// request's that started the generation. None is made while Config.Tracer
// is nil, and none on the per-event path: a call's span hears of its head,
// its first output and its end.

// tracerName is the instrumentation scope of the proxy's spans.
const tracerName = "github.com/ssegate/ssegate/proxy"

// traceContext is the W3C Trace Context propagator: traceparent and
// tracestate.
var traceContext propagation.TraceContext

// reqSpanKey is the user value under which a request keeps its span.
const reqSpanKey = "ssegate.span"

// reqSpan is a request's server span, and what it ends with.
type reqSpan struct {
	span trace.Span
	ctx  context.Context // carries span
	// f is the flight the request is answered from, whose state at the
	// end is the key's; state is the key's state when no flight is.
	f      *cache.Flight
	state  cache.State
	taken  bool // a clientConn ends it (takeOver)
	status int  // the answer's, once taken
}

// headerCarrier reads and writes a fasthttp request's headers for the
// propagator.
type headerCarrier struct{ h *fasthttp.RequestHeader }

func (c headerCarrier) Get(key string) string { return string(c.h.Peek(key)) }
func (c headerCarrier) Set(key, value string) { c.h.Set(key, value) }
func (c headerCarrier) Keys() []string        { return []string{"traceparent", "tracestate"} }

// startRequest starts the request's server span, a child of the caller's
// traceparent when it sent one; nil when tracing is off.
func (p *Proxy) startRequest(ctx *fasthttp.RequestCtx) *reqSpan {
	if p.tracer == nil {
		return nil
	}
	parent := traceContext.Extract(context.Background(), headerCarrier{&ctx.Request.Header})
	method, path := string(ctx.Method()), string(ctx.Path())
	// The paths that name a key name it as their route does.
	for _, dir := range [...]string{"/streams", "/keys"} {
		if underPath(ctx, dir) {
			path = dir + "/{key}"
		}
	}
	c, span := p.tracer.Start(parent, method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", method), attribute.String("url.path", path)))
	rs := &reqSpan{span: span, ctx: c}
	ctx.SetUserValue(reqSpanKey, rs)
	return rs
}

// requestSpan returns the request's span, or nil.
func requestSpan(ctx *fasthttp.RequestCtx) *reqSpan {
	rs, _ := ctx.UserValue(reqSpanKey).(*reqSpan)
	return rs
}

// endRequest ends the request's span unless a clientConn took it over
// (it ends it with the answer).
func endRequest(ctx *fasthttp.RequestCtx, rs *reqSpan) {
	if rs == nil || rs.taken {
		return
	}
	rs.end(ctx.Response.StatusCode(), true)
}

// end ends the span of a request answered with status; ok is false when
// the answer did not reach its client whole.
func (rs *reqSpan) end(status int, ok bool) {
	st := rs.state
	if rs.f != nil {
		select {
		case <-rs.f.Done():
			st, _, _ = rs.f.Outcome()
		default:
			st = cache.StateExecutionStarted
		}
	}
	if st != "" {
		rs.span.SetAttributes(attribute.String("ssegate.key.state", string(st)))
	}
	if status != 0 {
		rs.span.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	if status >= 500 || !ok {
		rs.span.SetStatus(codes.Error, "")
	}
	rs.span.End()
}

// traceDecision records the decision d on the request's span.
func (p *Proxy) traceDecision(ctx *fasthttp.RequestCtx, d decision, gen uint64) {
	if p.tracer == nil || d == decisionNone {
		return
	}
	rs := requestSpan(ctx)
	if rs == nil {
		return
	}
	rs.span.SetAttributes(attribute.String("ssegate.decision", d.String()))
	if gen != 0 {
		rs.span.SetAttributes(attribute.Int64("ssegate.generation", int64(gen)))
	}
}

// traceAnswer says the request is answered from flight f (nil for none)
// or, without one, that the key is in state; a request answered from a
// generation another request started links to that request's span.
func (p *Proxy) traceAnswer(ctx *fasthttp.RequestCtx, f *cache.Flight, state cache.State, linkTo string) {
	if p.tracer == nil {
		return
	}
	rs := requestSpan(ctx)
	if rs == nil {
		return
	}
	rs.f, rs.state = f, state
	if linkTo == "" {
		return
	}
	sc := trace.SpanContextFromContext(traceContext.Extract(context.Background(), propagation.MapCarrier{"traceparent": linkTo}))
	if sc.IsValid() {
		rs.span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("ssegate.link", "generation")}})
	}
}

// traceparent is the W3C traceparent of span c.
func traceparent(c context.Context) string {
	m := propagation.MapCarrier{}
	traceContext.Inject(c, m)
	return m["traceparent"]
}

// callSpan is the span of one upstream call, and what it learns on the way.
type callSpan struct {
	span  trace.Span
	sent  time.Time
	first time.Time // the call's first output relayed
	model string    // the response's model, from the stream's first events
	usage cache.Usage
	used  bool // usage was reported
}

// traceFrom makes g's calls children of the request's span.
func (g *gen) traceFrom(ctx *fasthttp.RequestCtx) {
	if g.p.tracer == nil {
		return
	}
	if rs := requestSpan(ctx); rs != nil {
		g.traceCtx = rs.ctx
		g.f.SetTrace(traceparent(rs.ctx))
	}
}

// startCall starts the span of call n on up, for the model of the calls
// being made, and sets the upstream request's traceparent to it.
func (g *gen) startCall(up *upstream.Upstream, req *fasthttp.Request, n int) {
	if g.traceCtx == nil {
		return
	}
	ai, model := g.ai, g.model
	name := ai.operation
	if model != "" {
		name += " " + model
	}
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", ai.operation),
		attribute.String("gen_ai.provider.name", ai.provider),
		attribute.Int("ssegate.attempt", n),
	}
	if model != "" {
		attrs = append(attrs, attribute.String("gen_ai.request.model", model))
	}
	attrs = append(attrs, attribute.String("server.address", up.Hostname()))
	if port, err := strconv.Atoi(up.Port()); err == nil {
		attrs = append(attrs, attribute.Int("server.port", port))
	}
	c, span := g.p.tracer.Start(g.traceCtx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	traceContext.Inject(c, headerCarrier{&req.Header})
	g.span = &callSpan{span: span, sent: time.Now()}
}

// sawEvent lets the call's span read the response's model off the
// stream's events before its first output (it stops there).
func (g *gen) sawEvent(data string) {
	cs := g.span
	if cs == nil || cs.model != "" {
		return
	}
	for _, path := range [...]string{"model", "response.model", "message.model"} {
		if v := gjson.Get(data, path); v.Type == gjson.String && v.Str != "" {
			cs.model = strings.Clone(v.Str)
			return
		}
	}
}

// firstOutput notes the call's first output relayed.
func (g *gen) firstOutput() {
	if cs := g.span; cs != nil && cs.first.IsZero() {
		cs.first = time.Now()
	}
}

// endSettled ends the span of the call whose answer ended the flight.
func (g *gen) endSettled() {
	if g.span == nil {
		return
	}
	h, _ := g.f.Head()
	errType := ""
	if state, reason, _ := g.f.Outcome(); state != cache.StateCommitted && !g.f.Unstored() {
		errType = reason
	}
	g.endCall(h.Status, errType)
}

// callUsage notes the tokens the call's upstream reported.
func (g *gen) callUsage(in, out int64) {
	if cs := g.span; cs != nil {
		cs.usage, cs.used = cache.Usage{Input: in, Output: out}, true
	}
}

// endCall ends the current call's span: status is its answer's (0: none),
// errType its failure ("" for none), attrs what became of it (a retry, a
// fallback).
func (g *gen) endCall(status int, errType string, attrs ...attribute.KeyValue) {
	cs := g.span
	if cs == nil {
		return
	}
	g.span = nil
	s := cs.span
	if status != 0 {
		s.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	if cs.model != "" {
		s.SetAttributes(attribute.String("gen_ai.response.model", cs.model))
	}
	if !cs.used {
		if u := g.f.Usage(); u != (cache.Usage{}) && errType == "" {
			cs.usage, cs.used = u, true
		}
	}
	if cs.used {
		s.SetAttributes(attribute.Int64("gen_ai.usage.input_tokens", cs.usage.Input), attribute.Int64("gen_ai.usage.output_tokens", cs.usage.Output))
	}
	if !cs.first.IsZero() {
		s.SetAttributes(attribute.Float64("ssegate.time_to_first_token", cs.first.Sub(cs.sent).Seconds()))
	}
	if errType != "" {
		s.SetAttributes(attribute.String("error.type", errType))
		s.SetStatus(codes.Error, errType)
	}
	s.SetAttributes(attrs...)
	s.End()
}

// traceHooks are the moments the spans hear of (hooks.go): a request's
// start and end, its decision and where its answer comes from; each call's start, the
// response's model and usage, its first output, and its end, with what
// became of it.
func (p *Proxy) traceHooks() hooks {
	h := nopHooks()
	h.requestStarted = func(ctx *fasthttp.RequestCtx) { p.startRequest(ctx) }
	h.requestEnded = func(ctx *fasthttp.RequestCtx) { endRequest(ctx, requestSpan(ctx)) }
	h.decided = p.traceDecision
	h.answerFrom = p.traceAnswer
	h.generationStarted = (*gen).traceFrom
	h.attemptStarted = (*gen).startCall
	h.sawEvent = (*gen).sawEvent
	h.usage = (*gen).callUsage
	h.firstOutput = func(g *gen, _ time.Time) { g.firstOutput() }
	h.retry = func(g *gen, a attempt) {
		g.endCall(a.head.Status, a.reason(), attribute.String("ssegate.retry.reason", a.reason()))
	}
	h.fallback = func(g *gen, a attempt, to string) {
		g.endCall(a.head.Status, a.reason(), attribute.String("ssegate.fallback.reason", a.reason()),
			attribute.String("ssegate.fallback.to", to))
	}
	h.answered = func(g *gen, _ int) { g.endSettled() }
	h.passedRaw = func(g *gen, status int) { g.endCall(status, "") }
	h.gaveUp = func(g *gen, a attempt) { g.endCall(a.head.Status, a.reason()) }
	h.runEnded = func(g *gen, _ int) { g.endCall(0, "") }
	return h
}
