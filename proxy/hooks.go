package proxy

import (
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/valyala/fasthttp"
)

// hooks are the moments of a request, and of the generation that answers
// it, that the proxy's telemetry hears of, in the shape of
// net/http/httptrace.ClientTrace: one struct of named funcs, each told of
// one moment. The metrics (metrics.go, genai.go) and the spans (trace.go)
// each fill in the hooks they listen to over nopHooks, and compose joins
// them, so that a call site calls one hook (g.p.hooks.retry(g, a)) and
// knows nothing of who listens. Every hook of Proxy.hooks is set. A hook
// runs on the goroutine of the moment it names and must not block; those
// of the relay path (eventJournaled, wrote) run once per event or write,
// and must not allocate.
type hooks struct {
	// requestStarted and requestEnded: a request came, and its handler
	// returns (a connection that took over its answer ends it later).
	requestStarted func(ctx *fasthttp.RequestCtx)
	requestEnded   func(ctx *fasthttp.RequestCtx)
	// decided: the request was decided d, answered from generation gen
	// (0: none).
	decided func(ctx *fasthttp.RequestCtx, d decision, gen uint64)
	// answerFrom: the request is answered from flight f or, without one,
	// from a key in state; linkTo is the traceparent of the request whose
	// generation answers it ("": its own, or none).
	answerFrom func(ctx *fasthttp.RequestCtx, f *cache.Flight, state cache.State, linkTo string)
	// missingBody: a committed key's body was gone from the store.
	missingBody func()
	// saved: an answer was served without a new generation; u is the
	// usage its upstream reported.
	saved func(u cache.Usage)

	// generationStarted: g starts, for the request ctx.
	generationStarted func(g *gen, ctx *fasthttp.RequestCtx)
	// attemptStarted: g's call n goes to up with req.
	attemptStarted func(g *gen, up *upstream.Upstream, req *fasthttp.Request, n int)
	// attemptEnded: g's call came to outcome: its answer's head came (its
	// status class: 2xx, 4xx, 5xx…) or it failed (its cause).
	attemptEnded func(g *gen, outcome string)
	// sawEvent: an event of the call's stream before its first output.
	sawEvent func(g *gen, data string)
	// usage: the call's upstream reported its tokens.
	usage func(g *gen, input, output int64)
	// firstOutput: the call's first output (or its preamble at
	// -preamble-hold) was journaled; the call was sent at sent.
	firstOutput func(g *gen, sent time.Time)
	// eventJournaled: an event of an upstream stream was journaled.
	eventJournaled func()
	// retry: g's attempt a failed and is made again.
	retry func(g *gen, a attempt)
	// retryRefused: a retryable failure is not retried, for why
	// (attempts, max_elapsed, retry_after_too_long, budget).
	retryRefused func(why string)
	// fallback: g gives up a's model for the model to.
	fallback func(g *gen, a attempt, to string)
	// answered: g's answer came and ended its flight, after calls calls
	// over every model.
	answered func(g *gen, calls int)
	// passedRaw: g's answer, of status, goes to its client as it came.
	passedRaw func(g *gen, status int)
	// gaveUp: g's attempts ended with a, the last, and no answer: its
	// flight is failed next.
	gaveUp func(g *gen, a attempt)
	// aborted: a stream that started ended without a clean end, for c.
	aborted func(c cause)
	// tokensLost: the upstream reported u for a generation no client got
	// whole, lost as l.
	tokensLost func(l loss, u cache.Usage)
	// notStored: an answer went to its client whole and was not stored,
	// for reason (no_key, store_refused, or a cause's).
	notStored func(reason string)
	// ended: g's flight ended; errType names the cause of an end without a
	// whole answer ("" for none); unknown: its outcome is unknown.
	ended func(g *gen, errType string, unknown bool)
	// runEnded: g's goroutine returns, after calls upstream calls.
	runEnded func(g *gen, calls int)
	// healed: a background Responses stream's broken connection was
	// resumed, refused or failed (outcome).
	healed func(outcome string)
	// timedOut: a time budget cut an upstream connection.
	timedOut func(b upstream.TimeBudget)

	// firstFlushed: f's first event reached a client.
	firstFlushed func(f *cache.Flight)
	// wrote: n bytes of a streamed answer went to a client.
	wrote func(n int)
	// clientBehind: a client fell behind its generation's events and was
	// handed to a writer of its own.
	clientBehind func()
	// clientGone: a client went away before the end of its answer; slow:
	// it was dropped for accepting nothing for -slow-client-timeout.
	clientGone func(slow bool)
	// acceptError: the listener could not take a connection.
	acceptError func()
	// tool: an MCP tool call was decided kind; suppressed: it was
	// answered without running the tool again.
	tool func(kind string, suppressed bool)
	// wsConnection: a Responses WebSocket connection opened (delta 1) or
	// closed (-1).
	wsConnection func(delta int)
	// wsTurn: a WebSocket turn was decided label; a keyed one's decision
	// is d (decisionNone for the others).
	wsTurn func(label string, d decision)
	// stopped: a tenant's stop of a live generation was answered, with
	// result (stop.go: stopped, unconfirmed, ended, not_found).
	stopped func(result string)
}

// nopHooks returns hooks that each do nothing: the base every listener
// fills in.
func nopHooks() hooks {
	return hooks{
		requestStarted:    func(*fasthttp.RequestCtx) {},
		requestEnded:      func(*fasthttp.RequestCtx) {},
		decided:           func(*fasthttp.RequestCtx, decision, uint64) {},
		answerFrom:        func(*fasthttp.RequestCtx, *cache.Flight, cache.State, string) {},
		missingBody:       func() {},
		saved:             func(cache.Usage) {},
		generationStarted: func(*gen, *fasthttp.RequestCtx) {},
		attemptStarted:    func(*gen, *upstream.Upstream, *fasthttp.Request, int) {},
		attemptEnded:      func(*gen, string) {},
		sawEvent:          func(*gen, string) {},
		usage:             func(*gen, int64, int64) {},
		firstOutput:       func(*gen, time.Time) {},
		eventJournaled:    func() {},
		retry:             func(*gen, attempt) {},
		retryRefused:      func(string) {},
		fallback:          func(*gen, attempt, string) {},
		answered:          func(*gen, int) {},
		passedRaw:         func(*gen, int) {},
		gaveUp:            func(*gen, attempt) {},
		aborted:           func(cause) {},
		tokensLost:        func(loss, cache.Usage) {},
		notStored:         func(string) {},
		ended:             func(*gen, string, bool) {},
		runEnded:          func(*gen, int) {},
		healed:            func(string) {},
		timedOut:          func(upstream.TimeBudget) {},
		firstFlushed:      func(*cache.Flight) {},
		wrote:             func(int) {},
		clientBehind:      func() {},
		clientGone:        func(bool) {},
		acceptError:       func() {},
		tool:              func(string, bool) {},
		wsConnection:      func(int) {},
		wsTurn:            func(string, decision) {},
		stopped:           func(string) {},
	}
}

// compose returns hooks that tell a, then b, of each moment.
func compose(a, b hooks) hooks {
	return hooks{
		requestStarted: func(ctx *fasthttp.RequestCtx) { a.requestStarted(ctx); b.requestStarted(ctx) },
		requestEnded:   func(ctx *fasthttp.RequestCtx) { a.requestEnded(ctx); b.requestEnded(ctx) },
		decided: func(ctx *fasthttp.RequestCtx, d decision, gen uint64) {
			a.decided(ctx, d, gen)
			b.decided(ctx, d, gen)
		},
		answerFrom: func(ctx *fasthttp.RequestCtx, f *cache.Flight, state cache.State, linkTo string) {
			a.answerFrom(ctx, f, state, linkTo)
			b.answerFrom(ctx, f, state, linkTo)
		},
		missingBody: func() { a.missingBody(); b.missingBody() },
		saved:       func(u cache.Usage) { a.saved(u); b.saved(u) },
		generationStarted: func(g *gen, ctx *fasthttp.RequestCtx) {
			a.generationStarted(g, ctx)
			b.generationStarted(g, ctx)
		},
		attemptStarted: func(g *gen, up *upstream.Upstream, req *fasthttp.Request, n int) {
			a.attemptStarted(g, up, req, n)
			b.attemptStarted(g, up, req, n)
		},
		attemptEnded:   func(g *gen, outcome string) { a.attemptEnded(g, outcome); b.attemptEnded(g, outcome) },
		sawEvent:       func(g *gen, data string) { a.sawEvent(g, data); b.sawEvent(g, data) },
		usage:          func(g *gen, in, out int64) { a.usage(g, in, out); b.usage(g, in, out) },
		firstOutput:    func(g *gen, sent time.Time) { a.firstOutput(g, sent); b.firstOutput(g, sent) },
		eventJournaled: func() { a.eventJournaled(); b.eventJournaled() },
		retry:          func(g *gen, at attempt) { a.retry(g, at); b.retry(g, at) },
		retryRefused:   func(why string) { a.retryRefused(why); b.retryRefused(why) },
		fallback:       func(g *gen, at attempt, to string) { a.fallback(g, at, to); b.fallback(g, at, to) },
		answered:       func(g *gen, calls int) { a.answered(g, calls); b.answered(g, calls) },
		passedRaw:      func(g *gen, status int) { a.passedRaw(g, status); b.passedRaw(g, status) },
		gaveUp:         func(g *gen, at attempt) { a.gaveUp(g, at); b.gaveUp(g, at) },
		aborted:        func(c cause) { a.aborted(c); b.aborted(c) },
		tokensLost:     func(l loss, u cache.Usage) { a.tokensLost(l, u); b.tokensLost(l, u) },
		notStored:      func(reason string) { a.notStored(reason); b.notStored(reason) },
		ended: func(g *gen, errType string, unknown bool) {
			a.ended(g, errType, unknown)
			b.ended(g, errType, unknown)
		},
		runEnded:     func(g *gen, calls int) { a.runEnded(g, calls); b.runEnded(g, calls) },
		healed:       func(outcome string) { a.healed(outcome); b.healed(outcome) },
		timedOut:     func(bt upstream.TimeBudget) { a.timedOut(bt); b.timedOut(bt) },
		firstFlushed: func(f *cache.Flight) { a.firstFlushed(f); b.firstFlushed(f) },
		wrote:        func(n int) { a.wrote(n); b.wrote(n) },
		clientBehind: func() { a.clientBehind(); b.clientBehind() },
		clientGone:   func(slow bool) { a.clientGone(slow); b.clientGone(slow) },
		acceptError:  func() { a.acceptError(); b.acceptError() },
		tool:         func(kind string, suppressed bool) { a.tool(kind, suppressed); b.tool(kind, suppressed) },
		wsConnection: func(delta int) { a.wsConnection(delta); b.wsConnection(delta) },
		wsTurn:       func(label string, d decision) { a.wsTurn(label, d); b.wsTurn(label, d) },
		stopped:      func(result string) { a.stopped(result); b.stopped(result) },
	}
}

// A loss is what became of a generation that the upstream may have paid
// tokens for and that no client got whole: the label of
// ssegate_tokens_lost_total.
type loss uint8

const (
	lossAborted  loss = iota // the stream reached clients and did not end whole
	lossRetried              // the attempt failed before any output and was made again
	lossFallback             // the model's last attempt, given up for the next model
	lossFailed               // the last attempt failed before any output, relayed as it came

	numLosses
)

var lossLabels = [numLosses]string{lossAborted: "aborted", lossRetried: "retried", lossFallback: "fallback", lossFailed: "failed"}

func (l loss) String() string { return lossLabels[l] }
