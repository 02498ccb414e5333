package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/valyala/fasthttp"
)

// New validates cfg and returns a Proxy.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	p := &Proxy{cfg: cfg, log: cfg.Logger, store: cfg.Store, done: make(chan struct{}),
		live: make(map[*gen]struct{}), work: newWorkers(workerIdle), budget: upstream.NewBudget(cfg.Retry.BudgetRatio, cfg.Retry.BudgetMin)}
	ucfg := upstream.Config{ConnectTimeout: cfg.UpstreamConnectTimeout, HeadTimeout: cfg.HeadTimeout,
		IdleTimeout: cfg.UpstreamIdleTimeout, MaxConns: cfg.UpstreamMaxConns, TLS: cfg.UpstreamTLS,
		Retry: &cfg.Retry, RetryAmbiguous: cfg.RetryAmbiguous}
	for _, raw := range cfg.Upstreams {
		up, err := upstream.New(raw, &ucfg, p.circuitChanged, p.upstreamTimedOut)
		if err != nil {
			return nil, err
		}
		p.ups = append(p.ups, up)
	}
	if cfg.Tracer != nil {
		p.tracer = cfg.Tracer.Tracer(tracerName)
	}
	if _, passive := cfg.Store.(passiveStore); !passive {
		p.storeEnds = true
	}
	if _, ok := cfg.Store.(ToolStore); len(cfg.MCPPaths) > 0 && cfg.Store != nil && !ok {
		return nil, fmt.Errorf("mcp-path: the store (%T) does not record tool calls", cfg.Store)
	}
	p.m = newMetrics(p)
	p.hooks = p.m.hooks()
	if p.tracer != nil {
		p.hooks = compose(p.hooks, p.traceHooks())
	}
	p.metricsHandler = p.m.handler()
	p.srv = p.newServer()
	return p, nil
}

func (p *Proxy) newServer() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:            p.Handler,
		Name:               serverName,
		MaxRequestBodySize: p.cfg.MaxBodyBytes,
		ReadTimeout:        p.cfg.ReadTimeout,
		IdleTimeout:        p.cfg.IdleTimeout,
		ReadBufferSize:     8 << 10, // held for a stream's life: requests' headers fit
		TCPKeepalive:       true,
		// Streams set their own write deadline; see clientConn.flush.
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		CloseOnShutdown:       true,
		// A streamed answer takes its connection over; afterwards the proxy
		// hands it back with ServeConn (client.go), so keep-alive survives.
		KeepHijackedConns: true,
		// A streamed answer frees its worker at once (the connection is
		// taken over), so a burst of new streams leaves a burst of idle
		// workers; let their stacks go soon rather than after 10 s.
		MaxIdleWorkerDuration: workerIdle,
		Logger:                fasthttpLogger{p.log},
		// fasthttp's parse errors quote the request buffer, credentials
		// included; this leaves the quote out. The answer and the log
		// below carry fixed text anyway.
		SecureErrorLogMessage: true,
		ErrorHandler:          p.unreadable,
		ConnState:             p.connState,
	}
}

// unreadable answers a request fasthttp could not read. Neither the answer
// nor its log line carries the error's text, the method or the path: they
// come from the request's bytes, which may hold a credential.
func (p *Proxy) unreadable(ctx *fasthttp.RequestCtx, err error) {
	if brokenConn(err) {
		// Not a request at all: the connection broke while one was
		// awaited or read. There is no one to answer.
		p.log.Debug("connection broke while reading a request")
		return
	}
	c, detail := causeMalformedRequest, ""
	var small *fasthttp.ErrSmallBuffer
	var netErr net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		c, detail = causeBodyTooLarge, fmt.Sprintf("%d bytes", p.cfg.MaxBodyBytes)
	case errors.As(err, &small):
		c = causeHeadersTooLarge
	case errors.As(err, &netErr) && netErr.Timeout():
		c = causeRequestTimeout
	}
	e := c.err(detail)
	p.hooks.decided(ctx, causes[c].refusal, 0)
	fillError(&ctx.Response, e)
	p.log.Info("request refused", "status", e.status, "type", e.typ, "reason", c.String(), "msg", e.message)
}

// brokenConn reports whether err is the connection's end rather than a
// bad request: reset, closed, or ended mid-request.
func brokenConn(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// fasthttpLogger sends fasthttp's own messages (connections it could not
// serve) to the log at debug level, each as its format string alone: the
// arguments may quote a request's bytes, credentials included. Every
// fasthttp message has a constant format; each is also answered or
// counted.
type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, _ ...any) {
	l.log.Debug("fasthttp", "format", format)
}

// abortGrace is how long Shutdown waits for aborted streams to close,
// after the drain's own time.
const abortGrace = 5 * time.Second

// Shutdown drains p, within ctx: /readyz answers 503 (Drain), the server
// stops accepting and ends idle connections, and open streams run to
// their end. When ctx ends first, every live generation is cut short
// (Abort: the clients of a stream that had its first event get
// stream_aborted, its key is left failed_retryable; a call cut before
// its first event gets the outcome-unknown answer, commit_unknown) and
// Shutdown waits up to abortGrace more for their
// connections to close. It returns nil after a whole drain, ctx's error
// when streams were aborted.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.Drain() // from now on every answer closes its connection (Handler)
	// Whatever comes after the drain, on a connection another server
	// still holds, starts no generation: it gets 503 shutting_down.
	defer p.abortOnce.Do(func() { close(p.done) })
	err := p.srv.ShutdownWithContext(ctx) // stops accepting; ends idle connections
	if err == nil {
		err = p.Wait(ctx) // streamed answers own their connections
	}
	if err == nil {
		return nil
	}
	p.log.Warn("drain time is up: aborting open streams", "err", err.Error(), "live_generations", p.liveCount())
	p.Abort()
	final, cancel := context.WithTimeout(context.Background(), abortGrace)
	defer cancel()
	_ = p.srv.ShutdownWithContext(final)
	if werr := p.Wait(final); werr != nil {
		p.log.Warn("streams still open at exit", "err", werr.Error())
	}
	return err
}

func (p *Proxy) liveCount() int {
	p.liveMu.Lock()
	defer p.liveMu.Unlock()
	return len(p.live)
}

// Abort cuts every live generation short: it ends uncommitted, and its
// clients get stream_aborted, or the outcome-unknown answer when no
// event had come (conclude, callFailed). Used when a drain's time is up; Wait then
// waits for the streams to close.
func (p *Proxy) Abort() {
	p.abortOnce.Do(func() { close(p.done) })
	p.liveMu.Lock()
	for g := range p.live {
		g.cancel(causeShutdown)
	}
	p.liveMu.Unlock()
	// A call that waits for its head is not interrupted by cancel (it
	// has no answer to close yet): closing every upstream connection
	// ends it now, rather than at its head or -head-timeout, so that its
	// client gets its answer (the outcome-unknown one) before the process
	// exits.
	for _, u := range p.ups {
		u.CloseAll()
	}
}

// Wait waits until no generation runs and no streamed answer is being
// written, or ctx ends. Streamed answers own their connections, so the
// server's own shutdown does not wait for them.
func (p *Proxy) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		p.gens.Wait()
		// Answers given to the server to write (handing) are counted
		// atomically, not in a WaitGroup: polled, as fasthttp's own
		// shutdown polls its connections. One taken over instead counts
		// in clients before it leaves handedN.
		if p.handedN.Load() > 0 {
			t := time.NewTicker(2 * time.Millisecond)
			for p.handedN.Load() > 0 {
				<-t.C
			}
			t.Stop()
		}
		p.clients.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Handler serves one request.
func (p *Proxy) Handler(ctx *fasthttp.RequestCtx) {
	if p.draining.Load() {
		ctx.SetConnectionClose() // a drain ends kept connections after their answer
	}
	path := string(ctx.Path())
	if !p.cfg.AdminSeparate && p.serveAdmin(ctx, path) {
		return
	}
	p.hooks.requestStarted(ctx)
	defer p.hooks.requestEnded(ctx)
	if ctx.IsDelete() && underPath(ctx, "/keys") {
		p.serveKeyDelete(ctx)
		return
	}
	if p.mcpPath(ctx) {
		p.serveMCP(ctx)
		return
	}
	if isWebSocket(ctx) {
		p.serveWebSocket(ctx)
		return
	}
	if underPath(ctx, "/streams") {
		p.serveStreams(ctx)
		return
	}
	if ctx.IsPost() {
		if id := responseCancelID(path); id != "" {
			p.serveResponseCancel(ctx, id)
			return
		}
	}
	if ctx.IsGet() {
		if underPath(ctx, "/keys") {
			p.serveKeyInfo(ctx)
			return
		}
		if id := responseID(path); id != "" && p.store != nil && p.serveResponseGet(ctx, id) {
			return
		}
	}
	key := p.requestKey(ctx)
	if key == nil || p.store == nil || !ctx.IsPost() {
		p.relay(ctx)
		return
	}
	p.serveKeyed(ctx, string(key))
}
