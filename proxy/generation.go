package proxy

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// gen is one upstream call feeding one Flight. Its goroutine owns resp;
// cancel may be called from any goroutine and interrupts a blocked read
// by closing the body stream (fasthttp's supported way).
type gen struct {
	p         *Proxy
	f         *cache.Flight
	wantUsage bool

	mu       sync.Mutex // guards resp, finished and cause
	resp     *fasthttp.Response
	finished bool
	cause    string // why the generation was cut short, if it was
}

func (p *Proxy) newGen(f *cache.Flight, wantUsage bool) *gen {
	g := &gen{p: p, f: f, wantUsage: wantUsage}
	p.gens.Add(1)
	p.liveMu.Lock()
	p.live[g] = struct{}{}
	p.liveMu.Unlock()
	return g
}

// cancel cuts the generation short; the flight then fails with cause.
func (g *gen) cancel(cause string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.finished || g.cause != "" {
		return
	}
	g.cause = cause
	if g.resp != nil {
		g.resp.CloseBodyStream() //nolint:errcheck // interrupting a read
	}
}

func (g *gen) cutShort() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cause
}

// finish marks the generation over, so a late cancel no longer touches
// resp, and releases what it holds.
func (g *gen) finish() {
	g.mu.Lock()
	g.finished = true
	resp := g.resp
	g.resp = nil
	g.mu.Unlock()
	if resp != nil {
		resp.CloseBodyStream() //nolint:errcheck // the body is done with
		fasthttp.ReleaseResponse(resp)
	}
	p := g.p
	p.liveMu.Lock()
	delete(p.live, g)
	p.liveMu.Unlock()
	p.releaseSlot()
	p.gens.Done()
}

// call sends req upstream and returns the response with its body still to
// be read. It releases req.
func (g *gen) call(req *fasthttp.Request) (*fasthttp.Response, error) {
	resp := fasthttp.AcquireResponse()
	err := g.p.up.client.Do(req, resp)
	fasthttp.ReleaseRequest(req)
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		return nil, err
	}
	g.mu.Lock()
	g.resp = resp
	cause := g.cause
	g.mu.Unlock()
	if cause != "" {
		resp.CloseBodyStream() //nolint:errcheck // cancelled while waiting
	}
	return resp, nil
}

// run is a keyed generation's goroutine: call the upstream, then record
// the answer into the flight until it ends.
func (g *gen) run(req *fasthttp.Request) {
	defer g.finish()
	f := g.f
	f.Mark(cache.StateExecutionStarted, 1, 0)
	resp, err := g.call(req)
	if err != nil {
		state, reason := cache.StateFailedRetryable, "upstream_unreachable"
		if !isDial(err) && isTimeout(err) {
			state, reason = cache.StateCommitUnknown, "upstream_timeout"
		}
		g.p.log.Warn("upstream call failed", "key", f.Scope.Key, "tenant", f.Scope.Tenant,
			"generation", f.Gen, "state", state, "err", err.Error())
		f.Fail(state, reason, nil)
		return
	}
	head := copyHead(resp)
	f.Mark(cache.StateExecutionStarted, 1, head.Status)
	if !head.Stream {
		body, err := readBody(resp, g.p.cfg.MaxStreamBytes)
		f.SetHead(head)
		switch {
		case err != nil:
			f.Fail(cache.StateFailedRetryable, readFailure(err), nil)
		case head.Status >= 200 && head.Status < 300:
			f.Commit(body)
		case head.Status >= 400 && head.Status < 500 && head.Status != fasthttp.StatusTooManyRequests:
			f.Fail(cache.StateFailedTerminal, fmt.Sprintf("upstream_status_%d", head.Status), body)
		default:
			f.Fail(cache.StateFailedRetryable, fmt.Sprintf("upstream_status_%d", head.Status), body)
		}
		g.logEnd(head.Status)
		return
	}
	f.SetHead(head)
	g.pump(resp)
	g.logEnd(head.Status)
}

// pump reads the upstream's events into the flight and ends it: committed
// after a clean end, failed after anything else. The upstream body is read
// to its end even past the terminal event, so the connection can be reused.
func (g *gen) pump(resp *fasthttp.Response) {
	f := g.f
	deadline := time.AfterFunc(g.p.cfg.MaxStreamDuration, func() { g.cancel("max_stream_duration") })
	defer deadline.Stop()
	det := sse.NewDetector(g.wantUsage)
	var readErr, appendErr error
	for ev, err := range sse.Read(resp.BodyStream(), g.p.cfg.MaxEventBytes) {
		if err != nil {
			readErr = err
			break
		}
		det.Observe(ev)
		if _, err := f.Append(ev.Type, ev.Data); err != nil {
			appendErr = err
			break
		}
	}
	if cause := g.cutShort(); cause != "" {
		f.Fail(cache.StateFailedRetryable, cause, nil)
		return
	}
	switch {
	case errors.Is(appendErr, cache.ErrStreamTooLarge):
		f.Fail(cache.StateFailedRetryable, "max_stream_bytes", nil)
	case appendErr != nil:
		f.Fail(cache.StateFailedRetryable, "store_full", nil)
	case readErr != nil:
		f.Fail(cache.StateFailedRetryable, readFailure(readErr), nil)
	default:
		if ok, reason := det.Clean(); ok {
			f.Commit(nil)
		} else {
			f.Fail(cache.StateFailedRetryable, reason, nil)
		}
	}
}

func readFailure(err error) string {
	switch {
	case errors.Is(err, sse.ErrEventTooLarge):
		return "max_event_bytes"
	case errors.Is(err, errBodyTooLarge):
		return "max_stream_bytes"
	case isTimeout(err):
		return "upstream_idle_timeout"
	default:
		return "upstream_read_error"
	}
}

func (g *gen) logEnd(status int) {
	f := g.f
	if f.Gen == 0 {
		return // unkeyed: nothing was decided
	}
	state, reason, _ := f.Outcome()
	g.p.log.Info("generation ended", "key", f.Scope.Key, "tenant", f.Scope.Tenant,
		"generation", f.Gen, "state", state, "reason", reason, "upstream_status", status,
		"events", f.Events())
}

// abortMessages explain each abort cause to the client.
var abortMessages = map[string]string{
	"max_stream_bytes":      "the stream exceeded the proxy's per-stream byte bound",
	"max_event_bytes":       "an upstream event exceeded the proxy's event size bound",
	"max_stream_duration":   "the stream exceeded the proxy's stream duration bound",
	"store_full":            "the proxy's live journals are full",
	"upstream_idle_timeout": "the upstream went silent",
	"upstream_read_error":   "the upstream connection failed mid-stream",
	"shutdown":              "the proxy is shutting down",
}

func abortMessage(reason string) string {
	if m, ok := abortMessages[reason]; ok {
		return m
	}
	return "the upstream stream did not end cleanly (" + reason + ")"
}
