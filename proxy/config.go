package proxy

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/ssegate/ssegate/proxy/upstream"
	"go.opentelemetry.io/otel/trace"
)

// Inflight is what a request gets when its key's generation is still live.
type Inflight string

const (
	// InflightJoin: follow the live stream (the default).
	InflightJoin Inflight = "join"
	// InflightConflict: answer 409 idempotency_in_flight with Retry-After.
	InflightConflict Inflight = "conflict"
)

// Anonymous is what a keyed request that carries no credential gets.
type Anonymous string

const (
	// AnonymousAllow: the request is decided in the one anonymous tenant
	// that every request without a credential shares (the default).
	AnonymousAllow Anonymous = "allow"
	// AnonymousDeny: 401 credential_required.
	AnonymousDeny Anonymous = "deny"
)

// MinSecretBytes is the shortest Config.Secret New accepts.
const MinSecretBytes = 16

// RetryConfig says when and how often a failed upstream call is tried
// again; its zero value takes the defaults beside each field.
type RetryConfig = upstream.RetryConfig

// Config configures a Proxy. Its zero value, with Upstream and Store set,
// is usable: every zero field takes the default documented beside it.
type Config struct {
	// Upstreams are the base URLs of the LLM API, e.g.
	// https://api.openai.com, in order of preference: a request goes to the
	// first whose circuit is closed, and fails over to the next before its
	// first byte reached the client. A path in a URL is prefixed to every
	// relayed path.
	Upstreams []string
	// Retry says when a failed upstream call is tried again.
	Retry RetryConfig
	// Store decides keyed requests; nil relays every request unrecorded.
	Store Store
	// Inflight picks join (default) or conflict for a live key.
	Inflight Inflight
	// Heartbeat is the pause after which an idle client gets ": ping" (default 15s).
	Heartbeat time.Duration
	// MaxBodyBytes bounds a request body (default 32 MiB); larger ones get 413.
	MaxBodyBytes int
	// MaxEventBytes bounds one upstream event (default 4 MiB); a larger one aborts the stream.
	MaxEventBytes int
	// MaxStreamBytes bounds a non-streaming upstream body and an unkeyed
	// stream's journal (default 16 MiB); the store bounds keyed journals.
	MaxStreamBytes int
	// MaxStreamDuration bounds one generation (default 30m); past it the stream is aborted.
	MaxStreamDuration time.Duration
	// PreambleHold bounds how long a stream's preamble (events that carry
	// no model output: response.created, message_start, ping, a role-only
	// chunk) is held back from clients, from its first event (default
	// 2s; negative: nothing is held). While it is held an error from the
	// upstream is a failed attempt, retried or fallen back from; the first
	// event with output, or the bound, relays it.
	PreambleHold time.Duration
	// HeadTimeout bounds the wait for the response head of a request that
	// asks for a stream (top-level "stream": true), from the request's
	// first byte sent (default 30s: providers send a stream's head before
	// the model has produced anything). A non-streaming request waits up
	// to Retry.AttemptTimeout instead. Past it the client gets 504
	// upstream_timeout.
	HeadTimeout time.Duration
	// UpstreamIdleTimeout bounds a silence of the upstream once its answer
	// began: between the head and the first event, and between events
	// (default 2m). It does not cover the wait for the head. Providers
	// keep long generations busy (Anthropic's ping events, the Responses
	// API's progress events), so what it must outlast is a reasoning
	// model's pause between a chat completion's role chunk and its
	// content; 2m is twice the 60 s after which common load balancers cut
	// a silent connection, and far below the minutes a hung upstream
	// would otherwise hold a client.
	UpstreamIdleTimeout time.Duration
	// UpstreamTLS configures TLS to https upstreams (nil: the system's
	// roots); ServerName defaults to the upstream URL's host.
	UpstreamTLS *tls.Config
	// UpstreamConnectTimeout bounds dialing the upstream (default 10s).
	UpstreamConnectTimeout time.Duration
	// UpstreamMaxConns bounds connections to each upstream, for streaming
	// requests and for the others each: they have pools of their own
	// (upstream). The default is MaxStreams: every upstream call in
	// progress can have one, and MaxStreams bounds the calls of both.
	UpstreamMaxConns int
	// SlowClientTimeout drops a client whose connection takes no piece
	// (writePiece, 64 KiB) of its answer for this long (default 30s); the
	// client can resume. A big answer read steadily is never "slow".
	SlowClientTimeout time.Duration
	// StopTimeout bounds how long a stop (stop.go) waits for the
	// generation to end before it answers 202 (default 5s).
	StopTimeout time.Duration
	// MaxStreams bounds concurrent upstream calls (default 10000); more get 503.
	MaxStreams int
	// WS bounds OpenAI's Responses WebSocket mode (ws.go).
	WS WSConfig
	// ReadTimeout bounds reading one request (default 60s).
	ReadTimeout time.Duration
	// IdleTimeout bounds a keep-alive connection between requests (default 90s).
	IdleTimeout time.Duration
	// KeyHeaders name headers that carry an idempotency key when
	// Idempotency-Key is absent, tried in order: e.g. webhook-id (Standard
	// Webhooks) or X-GitHub-Delivery, so a redelivered webhook is answered
	// from the store instead of running twice.
	KeyHeaders []string
	// ResumeTokenTTL is how long the signed resume URL that every answer
	// of a keyed stream carries (Ssegate-Resume-Url) stays good (default
	// 24h; set it to the store's TTL, past which there is nothing to
	// resume).
	ResumeTokenTTL time.Duration
	// RetryAmbiguous names the upstreams (as in Upstreams, or "*" for all)
	// known to deduplicate on Idempotency-Key, such as another ssegate: a
	// keyed request whose call to one of them failed ambiguously (the
	// request went out, and no answer or no valid stream came) is tried
	// again. For any other upstream it is not: the chat endpoints of the
	// real providers do not deduplicate, so a repeat may be a second paid
	// generation.
	RetryAmbiguous []string
	// AmbiguousStatus are the upstream statuses (5xx) that say the
	// request may be running or have run behind the upstream, so that a
	// repeat could be a second paid generation: never repeated, never
	// fallen back from, and the key ends commit_unknown, except that
	// RetryAmbiguous still repeats them to an upstream that deduplicates.
	// nil means the default, 504 (a gateway timed out waiting for the
	// backend that has the request); an empty slice names none. An answer
	// carrying the outcome-unknown marker (Ssegate-Outcome: unknown) is
	// ambiguous whatever its status, and never repeated.
	AmbiguousStatus []int
	// Fallbacks maps a model to the models tried after it, in order, when
	// it cannot answer (-fallback): every attempt for it ended in a
	// failure the upstream said it did not run (429, 5xx, a connect
	// error, an error event before any other), its circuits are open, or
	// the upstream answered 400 with one of FallbackOnCodes. "*" is the
	// rule of every model without one of its own. The fallback model goes
	// into the request's top-level "model" field, on the same upstreams
	// and path, so it never crosses API shapes.
	Fallbacks map[string][]string
	// FallbackOnCodes are the error codes of a 400 answer that fall back
	// to the next model (default context_length_exceeded; Anthropic's
	// "prompt is too long" counts as it).
	FallbackOnCodes []string
	// RelayWhenStoreDown relays keyed requests unprotected (no
	// deduplication, nothing recorded) while the store is unreachable,
	// instead of failing them with 503 store_unavailable.
	RelayWhenStoreDown bool
	// TenantHeaders name headers that are part of the tenant besides the
	// providers' credential headers (Authorization, x-api-key, api-key,
	// x-goog-api-key) and the key query parameter: e.g. a user or
	// organization header set by an authenticating layer in front. Names
	// are matched without regard to case.
	TenantHeaders []string
	// AccountHeader names a header that an authenticating layer in front
	// sets, and clients cannot, naming the customer it authenticated
	// (e.g. an organization id, where one upstream API key serves many
	// customers). A request that carries it is counted by every
	// per-tenant bound against its value alone, instead of against its
	// credential values; it is part of the tenant too (TenantHeaders).
	// Only for such a layer: a client that could set it would choose its
	// account. Empty (the default): accounts are the credential values.
	AccountHeader string
	// MaxCredentials bounds the distinct credential values (Authorization,
	// x-api-key, api-key, x-goog-api-key, ?key=) a keyed request, resume
	// or key lookup may carry, each an account its key is counted against
	// (default 5, one for each place a credential goes): past it, 400
	// invalid_request. It bounds the accounts one key costs.
	MaxCredentials int
	// AnonymousKeys says what a keyed request with no credential at all
	// gets: the shared anonymous tenant (allow, the default) or 401
	// credential_required (deny).
	AnonymousKeys Anonymous
	// Secret keys the tenant hash (HMAC-SHA256), so that a tenant in a log
	// line or a store's key names cannot be brute-forced back to a weak
	// credential, and any other MAC the proxy makes (Proxy.mac). Replicas
	// that share a store must share it: otherwise one credential is a
	// different tenant on each. At least MinSecretBytes when set; nil
	// draws a random one, which suits a single process with an in-memory
	// store only (its keys are unreachable after a restart anyway).
	Secret []byte
	// MCPPaths are the paths (exact, e.g. "/mcp") on which requests are
	// MCP streamable HTTP (docs/design.md, Tool calls): a keyed tools/call
	// is one intent, answered under each caller's own JSON-RPC id;
	// everything else on them is relayed untouched. None by default.
	MCPPaths []string
	// MCPDedupe names the tools (or "*" for all) whose calls without a
	// key get one derived from the tenant, the tool's name and its
	// canonical arguments, standing for MCPDedupeWindow.
	MCPDedupe []string
	// MCPDedupeWindow is how long a derived key stands (default 10m): an
	// agent that is not sure a write ran calls it again within its turn,
	// seconds to minutes later, while a deliberate repeat of the same
	// call comes later than that.
	MCPDedupeWindow time.Duration
	// MCPUnknownTTL is how long a tool call whose outcome is unknown
	// (commit_unknown) keeps answering so to its re-issues, rather than
	// running again (default 24h: a day for someone to look, as long as a
	// committed answer is kept by default). DELETE /keys/{key} clears it
	// sooner.
	MCPUnknownTTL time.Duration
	// AdminSeparate keeps /metrics, /healthz and /readyz off the proxy's
	// handler (they are served by AdminHandler on another listener).
	AdminSeparate bool
	// Logger receives the decision log (default slog.Default()).
	Logger *slog.Logger
	// MetricsModels bounds the request models that get a label of their
	// own in the GenAI metrics (gen_ai_request_model), the first seen
	// first (default 20; negative: none); every other model is "other".
	MetricsModels int
	// Tracer makes the proxy's spans (docs/metrics.md, Traces): one per
	// request, one per upstream call. nil: no spans are made, and the
	// upstream gets no traceparent of the proxy's (the caller's goes as
	// it came).
	Tracer trace.TracerProvider
}

// Defaults returns the values Config's zero fields take (Retry's
// included), for a caller that shows or declares them, as cmd/ssegate's
// flags do: each default is written once, in setDefaults. What is
// derived from another field or made per process (UpstreamMaxConns,
// Secret, Logger) stays zero, and Upstreams empty.
func Defaults() Config {
	c := Config{Upstreams: []string{"http://127.0.0.1"}}
	if err := c.setDefaults(); err != nil {
		panic("proxy: the zero Config does not validate: " + err.Error())
	}
	c.Upstreams, c.UpstreamMaxConns, c.Secret, c.Logger = nil, 0, nil, nil
	return c
}

func (c *Config) setDefaults() error {
	if c.FallbackOnCodes == nil {
		c.FallbackOnCodes = []string{"context_length_exceeded"}
	}
	if c.Inflight == "" {
		c.Inflight = InflightJoin
	}
	if c.Inflight != InflightJoin && c.Inflight != InflightConflict {
		return fmt.Errorf("inflight: %q is neither join nor conflict", c.Inflight)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	defInt := func(n *int, v int) {
		if *n <= 0 {
			*n = v
		}
	}
	def(&c.Heartbeat, 15*time.Second)
	defInt(&c.WS.MaxConns, 1000)
	defInt(&c.WS.MaxTurns, 1000)
	defInt(&c.WS.MaxFrameBytes, 16<<20)
	def(&c.WS.IdleTimeout, 5*time.Minute)
	def(&c.WS.MaxLifetime, 60*time.Minute)
	defInt(&c.MaxCredentials, 5)
	def(&c.MCPDedupeWindow, 10*time.Minute)
	def(&c.MCPUnknownTTL, 24*time.Hour)
	def(&c.ResumeTokenTTL, 24*time.Hour)
	def(&c.MaxStreamDuration, 30*time.Minute)
	def(&c.HeadTimeout, 30*time.Second)
	if c.PreambleHold == 0 {
		c.PreambleHold = 2 * time.Second
	}
	def(&c.UpstreamIdleTimeout, 2*time.Minute)
	def(&c.UpstreamConnectTimeout, 10*time.Second)
	def(&c.SlowClientTimeout, 30*time.Second)
	def(&c.StopTimeout, 5*time.Second)
	def(&c.ReadTimeout, 60*time.Second)
	def(&c.IdleTimeout, 90*time.Second)
	defInt(&c.MaxBodyBytes, 32<<20)
	defInt(&c.MaxEventBytes, 4<<20)
	defInt(&c.MaxStreamBytes, 16<<20)
	defInt(&c.MaxStreams, 10000)
	defInt(&c.UpstreamMaxConns, c.MaxStreams)
	if len(c.Upstreams) == 0 {
		return fmt.Errorf("no upstream")
	}
	if c.AmbiguousStatus == nil {
		c.AmbiguousStatus = []int{504} // Gateway Timeout
	}
	for _, st := range c.AmbiguousStatus {
		if st < 500 || st > 599 {
			return fmt.Errorf("ambiguous-status: %d is not a 5xx status", st)
		}
	}
	for _, u := range c.RetryAmbiguous {
		if u != "*" && !slices.Contains(c.Upstreams, u) {
			return fmt.Errorf("retry-ambiguous: %q is not one of the upstreams", u)
		}
	}
	if c.AnonymousKeys == "" {
		c.AnonymousKeys = AnonymousAllow
	}
	if c.AnonymousKeys != AnonymousAllow && c.AnonymousKeys != AnonymousDeny {
		return fmt.Errorf("anonymous-keys: %q is neither allow nor deny", c.AnonymousKeys)
	}
	for _, mp := range c.MCPPaths {
		if !strings.HasPrefix(mp, "/") {
			return fmt.Errorf("mcp-path: %q does not start with /", mp)
		}
	}
	headers, err := tenantHeaders(c.TenantHeaders)
	if err != nil {
		return err
	}
	if c.AccountHeader != "" {
		account, err := tenantHeaders([]string{c.AccountHeader})
		if err != nil || len(account) == 0 {
			return fmt.Errorf("account-header: %q is not a header name that is not a credential's", c.AccountHeader)
		}
		c.AccountHeader = account[0]
		if !slices.Contains(headers, c.AccountHeader) {
			headers = append(headers, c.AccountHeader)
		}
	}
	c.TenantHeaders = headers
	switch {
	case len(c.Secret) == 0:
		c.Secret = make([]byte, 32)
		_, _ = rand.Read(c.Secret) // never fails (crypto/rand documents it)
	case len(c.Secret) < MinSecretBytes:
		return fmt.Errorf("secret: %d bytes; want at least %d", len(c.Secret), MinSecretBytes)
	default:
		c.Secret = bytes.Clone(c.Secret)
	}
	switch {
	case c.MetricsModels == 0:
		c.MetricsModels = 20
	case c.MetricsModels < 0:
		c.MetricsModels = 0
	}
	c.Retry.SetDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// tenantHeaders validates names and returns them lowercased, each once,
// without the credential headers the tenant always includes.
func tenantHeaders(names []string) ([]string, error) {
	var out []string
	for _, n := range names {
		if n == "" || strings.IndexFunc(n, func(r rune) bool { return !isTokenChar(r) }) >= 0 {
			return nil, fmt.Errorf("tenant-header: %q is not a header name", n)
		}
		n = strings.ToLower(n)
		if !slices.Contains(credentialHeaders, n) && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// isTokenChar reports whether r may appear in a header name (RFC 9110 token).
func isTokenChar(r rune) bool {
	return r < 0x7f && r > 0x20 && !strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r)
}

// credentialHeaders carry the providers' API keys: OpenAI's and most
// others' Authorization, Anthropic's x-api-key, Azure OpenAI's api-key and
// Gemini's x-goog-api-key. The tenant hashes them in this order, then the
// key query parameter, then Config.TenantHeaders.
var credentialHeaders = []string{"authorization", "x-api-key", "api-key", "x-goog-api-key"}

// credentialParam is the query parameter that carries a credential
// (Gemini's ?key=). It is part of the tenant and not of the fingerprint.
const credentialParam = "key"
