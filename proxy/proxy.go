package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"
)

// Proxy is the ssegate handler. Create it with New; serve it with Server.
type Proxy struct {
	cfg    Config
	log    *slog.Logger
	store  Store
	ups    []*upstream.Upstream
	budget *upstream.Budget
	m      *metrics
	hooks  hooks        // the telemetry's: metrics, and spans when Tracer is set
	tracer trace.Tracer // nil: no spans
	work   *workers     // the goroutines requests start
	macs   sync.Pool    // *mac: HMAC states keyed by the secret, reused
	// storeEnds: the store may end a flight itself (not a passiveStore).
	storeEnds bool

	draining atomic.Bool // set by Drain: /readyz answers 503

	streams atomic.Int64 // upstream calls in progress, bounded by MaxStreams
	wsConns atomic.Int64 // Responses WebSocket connections open, bounded by WS.MaxConns

	// done is closed by Abort: every live generation and follower ends.
	done      chan struct{}
	abortOnce sync.Once
	gens      sync.WaitGroup // generation goroutines
	clients   sync.WaitGroup // streamed answers being written

	liveMu sync.Mutex // guards live
	live   map[*gen]struct{}

	metricsHandler fasthttp.RequestHandler
	// srv serves the connections the proxy hands back after a streamed
	// answer (keep-alive), whatever server took them first, and is the
	// server Server returns.
	srv      *fasthttp.Server
	accepted sync.Map // net.Conn → struct{}: the connections srv accepted and still serves (connState)

	readyMu sync.Mutex // guards readyAt and readyOK
	readyAt time.Time
	readyOK bool
}

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

// circuitChanged logs an upstream circuit that opened or closed: the
// host's (connect failures) or a model's.
func (p *Proxy) circuitChanged(c upstream.CircuitChange) {
	scope := "model"
	if c.Host {
		scope = "host"
	}
	attrs := []any{"upstream", c.Upstream, "scope", scope}
	if !c.Host {
		attrs = append(attrs, "model", c.Model)
	}
	if c.Opened {
		p.log.Warn("upstream circuit", append(attrs, "from", upstream.CircuitClosed.String(), "to", upstream.CircuitOpen.String(),
			"failures", c.Failures, "probe_in", c.Wait.String())...)
		return
	}
	p.log.Info("upstream circuit", append(attrs, "from", upstream.CircuitOpen.String(), "to", upstream.CircuitClosed.String(),
		"open_ms", c.OpenFor.Milliseconds())...)
}

// upstreamTimedOut logs and counts an upstream connection cut by one of
// the time budgets. The decision and state logs say which key it was.
func (p *Proxy) upstreamTimedOut(name string, b upstream.TimeBudget, bound time.Duration) {
	p.hooks.timedOut(b)
	p.log.Warn("upstream timeout", "upstream", name, "budget", b.Flag(), "bound", bound.String())
}

// serverName is the Server header of every answer of the proxy: those
// fasthttp writes (its Server.Name) and those written on a connection the
// proxy took over (setHead), first answers and replays alike.
// An upstream's own Server header is not relayed (skipResponseHeader): a
// replay could not repeat it truthfully, and it names the upstream's
// software to clients that did not ask it.
const serverName = "ssegate"

// Server returns the fasthttp server configured for streaming through p:
// request bounds, timeouts that do not cut long streams, and JSON errors
// for requests it cannot read. Handler works under any fasthttp server
// (keep-alive included), but only this one applies those bounds to every
// request, and its ConnState must stay the proxy's.
func (p *Proxy) Server() *fasthttp.Server { return p.srv }

// idleTimeout returns how long a kept connection of the proxy's server
// waits for its next request (IdleTimeout, else ReadTimeout, as fasthttp
// takes it), and the bound on reading that request.
func (p *Proxy) idleTimeout() (idle, read time.Duration) {
	idle, read = p.srv.IdleTimeout, p.srv.ReadTimeout
	if idle == 0 {
		idle = read
	}
	return idle, read
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

// fpPrefix is the part of a fingerprint that logs show: enough to tell
// requests apart, too little to matter.
func fpPrefix(fp string) string {
	if len(fp) < 6 {
		return ""
	}
	return hex.EncodeToString([]byte(fp[:6]))
}

// keyTenant returns the tenant whose keys the request may use: ok is
// false for a request without a credential under AnonymousKeys deny, which
// may use none, not even what a replica that allowed them left in a
// shared store.
func (p *Proxy) keyTenant(ctx *fasthttp.RequestCtx) (tenant string, ok bool) {
	t, cred := p.tenant(ctx)
	return t, cred || p.cfg.AnonymousKeys != AnonymousDeny
}

// keyScope is scope for a key the request gave, once it is a valid one
// (400 invalid_idempotency_key otherwise).
func (p *Proxy) keyScope(ctx *fasthttp.RequestCtx, key string) (cache.Scope, bool) {
	if err := validKey(key); err != nil {
		p.refuse(ctx, causeInvalidKey, err.Error())
		return cache.Scope{}, false
	}
	return p.scope(ctx, key)
}

// pathScope is keyScope for the {key} of /keys/{key}.
func (p *Proxy) pathScope(ctx *fasthttp.RequestCtx) (cache.Scope, bool) {
	key, err := keyFromPath(ctx, "/keys/")
	if err != nil {
		p.refuse(ctx, causeInvalidKey, err.Error())
		return cache.Scope{}, false
	}
	return p.scope(ctx, key)
}

// scope returns the scope of key for the request's tenant, with the
// accounts its bounds count it against (Proxy.accounts). A request
// without a credential, under AnonymousKeys deny, gets 401 and ok false;
// one with more than MaxCredentials distinct credential values, 400.
func (p *Proxy) scope(ctx *fasthttp.RequestCtx, key string) (sc cache.Scope, ok bool) {
	t, ok := p.keyTenant(ctx)
	if !ok {
		p.refuse(ctx, causeCredentialRequired, "")
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="ssegate"`)
		return cache.Scope{}, false
	}
	accounts, n := p.accounts(ctx)
	if n > p.cfg.MaxCredentials {
		p.refuse(ctx, causeTooManyCredentials, fmt.Sprintf("more than %d", p.cfg.MaxCredentials))
		return cache.Scope{}, false
	}
	return cache.Scope{Tenant: t, Key: key, Accounts: accounts}, true
}

// fingerprint hashes what makes two requests the same request: method,
// path, query and body. The key query parameter is left out: it is a
// credential, part of the tenant.
func fingerprint(ctx *fasthttp.RequestCtx) string { return fingerprintOf(ctx, ctx.Request.Body()) }

// fingerprintOf is fingerprint with body in place of the request's.
func fingerprintOf(ctx *fasthttp.RequestCtx, body []byte) string {
	h := sha256.New()
	h.Write(ctx.Method())
	h.Write([]byte{0})
	h.Write(ctx.URI().PathOriginal())
	h.Write([]byte{0})
	writeQuery(h, ctx.URI().QueryString())
	h.Write([]byte{0})
	h.Write(body)
	return string(h.Sum(nil))
}

// writeQuery writes the raw query q without its key parameters (however
// the name is escaped), the other parameters as they came.
func writeQuery(w io.Writer, q []byte) {
	first := true
	for len(q) > 0 {
		var seg []byte
		if i := bytes.IndexByte(q, '&'); i >= 0 {
			seg, q = q[:i], q[i+1:]
		} else {
			seg, q = q, nil
		}
		name, _, _ := bytes.Cut(seg, []byte("="))
		if string(name) == credentialParam || bytes.ContainsRune(name, '%') && unescaped(name) == credentialParam {
			continue
		}
		if !first {
			w.Write([]byte{'&'}) //nolint:errcheck // a hash
		}
		w.Write(seg) //nolint:errcheck // a hash
		first = false
	}
}

func unescaped(b []byte) string {
	s, err := url.QueryUnescape(string(b))
	if err != nil {
		return string(b)
	}
	return s
}

// validKey reports whether key is 1–255 visible ASCII characters, and not
// "." or "..", which no URL can carry as a path segment (browsers, curl
// and URL libraries resolve them away), so their streams could not be
// resumed by URL.
func validKey(key string) error {
	if len(key) == 0 || len(key) > 255 {
		return fmt.Errorf("Idempotency-Key must be 1 to 255 characters, got %d", len(key))
	}
	if key == "." || key == ".." {
		return fmt.Errorf("Idempotency-Key cannot be %q: no URL path can name it", key)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("Idempotency-Key must be visible ASCII; byte %d is 0x%02x", i, c)
		}
	}
	return nil
}

// keyFromPath unescapes the {key} of /streams/{key} and /keys/{key}, read
// from the path as it came (fasthttp's normalised path has unescaped a
// key's "/" and resolved its ".."): one segment after prefix.
func keyFromPath(ctx *fasthttp.RequestCtx, prefix string) (string, error) {
	raw, ok := strings.CutPrefix(string(ctx.URI().PathOriginal()), prefix)
	if !ok {
		return "", fmt.Errorf("the path must be %s{path-escaped key}", prefix)
	}
	key, err := url.PathUnescape(raw)
	if err != nil {
		return "", err
	}
	return key, validKey(key)
}

// underPath reports whether the request's path is dir or under it in any
// spelling a server on the way could read it: as it came, as fasthttp
// normalised it, or unescaped until nothing changes and then cleaned
// (%2F, //, /./, ..). Paths ssegate serves itself are matched so, so that
// none of their spellings is relayed upstream.
func underPath(ctx *fasthttp.RequestCtx, dir string) bool {
	raw := ctx.URI().PathOriginal()
	if under(raw, dir) || under(ctx.Path(), dir) {
		return true
	}
	if len(raw) > 0 && raw[0] == '/' && bytes.IndexByte(raw, '%') < 0 && bytes.IndexByte(raw, '\\') < 0 &&
		!bytes.Contains(raw, []byte("//")) && !bytes.Contains(raw, []byte("/.")) {
		return false // no other spelling: the path as sent is its own clean form
	}
	p := string(raw)
	for range 4 { // %25 nested deeper than this is no path anyone reads
		u, err := url.PathUnescape(p)
		if err != nil || u == p {
			break
		}
		p = u
	}
	return under([]byte(path.Clean("/"+strings.ReplaceAll(p, "\\", "/"))), dir)
}

// under reports whether path p is dir or below it.
func under(p []byte, dir string) bool {
	return bytes.HasPrefix(p, []byte(dir)) && (len(p) == len(dir) || p[len(dir)] == '/')
}

// acquireSlot takes one of MaxStreams slots for an upstream call.
func (p *Proxy) acquireSlot() bool {
	if p.streams.Add(1) > int64(p.cfg.MaxStreams) {
		p.streams.Add(-1)
		return false
	}
	return true
}

func (p *Proxy) releaseSlot() { p.streams.Add(-1) }

// generationOf is the "generation" among a decision's log attrs, or 0.
func generationOf(attrs []any) (gen uint64) {
	for i := 0; i+1 < len(attrs); i += 2 {
		if attrs[i] == "generation" {
			gen, _ = attrs[i+1].(uint64)
		}
	}
	return gen
}

// logDecision counts the decision d on a request for the key of sc, and
// logs it with attrs.
func (p *Proxy) logDecision(ctx *fasthttp.RequestCtx, d decision, sc cache.Scope, fp string, attrs ...any) {
	// Counted whatever the log level: metrics are not the log.
	p.hooks.decided(ctx, d, generationOf(attrs))
	if !p.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	p.log.Info("decision", append([]any{
		"decision", d.String(), "key", sc.Key, "tenant", sc.Tenant,
		"fingerprint", fpPrefix(fp),
		"method", string(ctx.Method()), "path", string(ctx.Path()),
	}, attrs...)...)
}
