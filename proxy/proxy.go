package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"
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
	// handed holds the connections of srv whose answer the handler gives
	// the server to write (answerInHandler), counted in handedN until the
	// server is done with them (connState): Wait waits for those writes
	// as it does for taken-over answers. Not in clients: a WaitGroup's
	// Add from zero must come before its Wait, and a handler's wait
	// begins whenever a request comes.
	handed  sync.Map // net.Conn → struct{}
	handedN atomic.Int64

	readyMu sync.Mutex // guards readyAt and readyOK
	readyAt time.Time
	readyOK bool
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

// fpPrefix is the part of a fingerprint that logs show: enough to tell
// requests apart, too little to matter.
func fpPrefix(fp string) string {
	if len(fp) < 6 {
		return ""
	}
	return hex.EncodeToString([]byte(fp[:6]))
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
