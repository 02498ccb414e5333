// Command ssegate is a reverse proxy for LLM APIs that relays
// Server-Sent-Event streams while it records them, so that a retried,
// duplicated or reconnecting request never pays for a second generation.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/proxy"
	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"
	"go.opentelemetry.io/otel/trace"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stderr, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		if errors.Is(err, errVersion) {
			fmt.Print(versionText())
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "ssegate:", err)
		os.Exit(2)
	}
}

// options are the flags, each also read from SSEGATE_<NAME>.
type options struct {
	listen        string
	adminListen   string
	listenFile    string
	keyHeaders    listFlag
	tenantHeaders listFlag
	accountHeader string
	anonymousKeys string
	maxCreds      int
	secret        string
	retryAmbig    listFlag
	ambigStatus   string
	ambigStatuses []int // parsed from ambigStatus
	fallbacks     fallbackFlag
	fallbackCodes listFlag
	mcpPaths      listFlag
	mcpDedupe     listFlag
	mcpWindow     time.Duration
	ws            proxy.WSConfig
	mcpUnknownTTL time.Duration
	upstreams     listFlag
	retry         proxy.RetryConfig
	inflight      string
	logLevel      string
	logFormat     string
	ttl           time.Duration
	heartbeat     time.Duration
	maxBody       int
	maxEvent      int
	maxStream     int
	maxStoreBytes int64
	maxLiveBytes  int64
	sealStream    int
	sealAge       time.Duration
	sealLive      int64
	maxKeys       int
	maxTenantKeys int
	maxStrangers  int
	maxLiveTenant int64
	maxSubs       int
	maxStreams    int
	maxConns      int
	pprof         bool
	maxDuration   time.Duration
	idleTimeout   time.Duration
	headTimeout   time.Duration
	preambleHold  time.Duration
	slowClient    time.Duration
	stopTimeout   time.Duration
	shutdown      time.Duration
	missingBody   string
	mockTokens    int
	mockDelay     time.Duration
	metricsModels int
	traces        string
	redis         redisOptions

	// The Go runtime's memory settings; setGC is false when the GOGC
	// environment variable decides instead.
	gcPercent   int
	setGC       bool
	memoryLimit int64
	memoryRatio float64       // -memory-limit-ratio
	memory      memorySetting // what applyMemory decided
	version     bool          // -version: print the build and exit
}

// flagSet declares every flag of ssegate into o. A default the proxy or
// a store has is taken from proxy.Defaults, cache.DefaultConfig or
// redis.DefaultConfig, so that it is written once;
// docs/flags.md's table is held to these by TestFlagsDoc.
func flagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("ssegate", flag.ContinueOnError)
	// Parse errors are returned as one line naming the flag; only -h
	// prints the usage.
	fs.SetOutput(io.Discard)
	d := proxy.Defaults()
	cd := cache.DefaultConfig()
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to serve on")
	fs.StringVar(&o.adminListen, "admin-listen", "", "address for /metrics, /healthz and /readyz alone (empty: serve them on -listen)")
	fs.StringVar(&o.listenFile, "listen-file", "", "write the address -listen bound (host:port) to this file once ssegate serves, and remove it at exit: how a supervisor or a test learns the port of -listen 127.0.0.1:0 (empty: none)")
	fs.Var(&o.retryAmbig, "retry-ambiguous", "an upstream (as given to -upstream, or * for all) known to deduplicate on Idempotency-Key, such as another ssegate: a keyed request whose call to it failed after the request was sent is tried again; repeatable. Default none: a repeat to a provider could be a second paid generation")
	fs.StringVar(&o.ambigStatus, "ambiguous-status", statuses(d.AmbiguousStatus), "upstream statuses (5xx, comma-separated, or none) that say the request may be running or have run behind the upstream (a gateway that timed out waiting for it): never retried nor fallen back from, the key ends commit_unknown, and the client gets the answer with Ssegate-Outcome: unknown; -retry-ambiguous still retries them to an upstream that deduplicates. An answer carrying Ssegate-Outcome: unknown is ambiguous whatever its status, and never retried")
	fs.Var(&o.fallbacks, "fallback", "FROM=TO[,TO...]: when model FROM cannot answer (429, 5xx, connect errors or an error event before any other, after -retry-attempts; its circuits open; or a 400 naming a -fallback-on-code), the request goes to model TO, then the next, on the same upstreams and path; FROM * is every model without a rule of its own. Repeatable; SSEGATE_FALLBACK takes rules separated by semicolons. Never after the first event, nor after a failure that may have left a generation running")
	fs.Var(&o.fallbackCodes, "fallback-on-code", "an error code of a 400 answer that falls back to the next model (error.code, or Anthropic's error.type); repeatable or comma-separated; Anthropic's \"prompt is too long\" counts as context_length_exceeded")
	// Not given, the list stays empty and the proxy takes its default.
	fs.Lookup("fallback-on-code").DefValue = strings.Join(d.FallbackOnCodes, ",")
	fs.Var(&o.keyHeaders, "key-header", "a header that carries the idempotency key when Idempotency-Key is absent, e.g. webhook-id or X-GitHub-Delivery; repeatable")
	fs.Var(&o.tenantHeaders, "tenant-header", "a header that is part of the tenant besides the credentials (Authorization, x-api-key, api-key, x-goog-api-key, ?key=), e.g. a user or organization header set by an authenticating layer in front; repeatable")
	fs.Var(&o.mcpPaths, "mcp-path", "a path (e.g. /mcp) on which requests are MCP streamable HTTP: a tools/call with a key (Idempotency-Key, or params._meta[\"ssegate/idempotency-key\"]) runs once, its re-issues join or replay it under their own JSON-RPC id; everything else there is relayed untouched. Repeatable or comma-separated; default none")
	fs.Var(&o.mcpDedupe, "mcp-dedupe", "a tool (or * for all) whose calls without a key get one derived from the tenant, the tool's name and its arguments, standing for -mcp-dedupe-window; repeatable or comma-separated")
	fs.IntVar(&o.ws.MaxConns, "ws-max-conns", d.WS.MaxConns, "Responses WebSocket connections open at once (a handshake past it gets 503 capacity_exceeded)")
	fs.IntVar(&o.ws.MaxTurns, "ws-max-turns", d.WS.MaxTurns, "response.create frames one WebSocket connection may send (one past it gets an error frame, code max_turns)")
	fs.IntVar(&o.ws.MaxFrameBytes, "ws-max-frame-bytes", d.WS.MaxFrameBytes, "largest WebSocket frame a client may send (the connection closes with 1009 above)")
	fs.DurationVar(&o.ws.IdleTimeout, "ws-idle-timeout", d.WS.IdleTimeout, "a WebSocket connection that sent nothing and runs no turn for this long is closed (1000)")
	fs.DurationVar(&o.ws.MaxLifetime, "ws-max-lifetime", d.WS.MaxLifetime, "longest WebSocket connection (closed with 1001 after; the API's own bound is 60 minutes)")
	fs.DurationVar(&o.ws.DedupeWindow, "ws-dedupe-window", d.WS.DedupeWindow, "when positive, a WebSocket turn without metadata.ssegate_idempotency_key is keyed by its tenant and canonical response.create body for this long: an unmodified client's re-send after a drop joins or replays the first (0: off)")
	fs.DurationVar(&o.mcpWindow, "mcp-dedupe-window", d.MCPDedupeWindow, "how long a derived tool-call key (-mcp-dedupe) stands: an agent unsure a write ran calls it again within its turn; a deliberate repeat comes later")
	fs.DurationVar(&o.mcpUnknownTTL, "mcp-unknown-ttl", d.MCPUnknownTTL, "how long a tool call whose outcome is unknown (the server may have run it) answers its re-issues with the outcome-unknown error rather than running again; DELETE /keys/{key} clears it sooner")
	fs.StringVar(&o.accountHeader, "account-header", "", "a header that an authenticating layer in front sets (and clients cannot) naming the customer, where one upstream API key serves many: a request carrying it is counted by every per-tenant bound against its value instead of its credentials, and it is part of the tenant; default none (bounds count credential values)")
	fs.IntVar(&o.maxCreds, "max-credentials", d.MaxCredentials, "distinct credential values (Authorization, x-api-key, api-key, x-goog-api-key, ?key=) a keyed request, resume or key lookup may carry, each an account its key counts against for every per-tenant bound: past it, 400 invalid_request")
	fs.StringVar(&o.anonymousKeys, "anonymous-keys", string(d.AnonymousKeys), "what a keyed request, resume or key lookup with no credential gets: allow (one anonymous tenant that every such request shares) or deny (401 credential_required); an exposed deployment should deny")
	fs.StringVar(&o.secret, "secret", "", "the deployment secret that keys the tenant hash (at least 16 bytes; better given as SSEGATE_SECRET than on the command line). Default: with -redis, one kept in Redis and shared by every replica; without, a random one per process")
	fs.Var(&o.upstreams, "upstream", "base URL of the LLM API (http or https), or \"mock\" for the embedded mock LLM; repeat it (or give a comma-separated list) for failover, in order of preference")
	fs.StringVar(&o.inflight, "inflight", string(d.Inflight), "what a duplicate of a live request gets: join (follow the live stream) or conflict (409 idempotency_in_flight)")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "json", "log format: json or text")
	fs.DurationVar(&o.ttl, "ttl", d.ResumeTokenTTL, "how long a committed response is kept")
	fs.DurationVar(&o.heartbeat, "heartbeat", d.Heartbeat, "keep-alive comment interval to an idle stream client")
	fs.IntVar(&o.maxBody, "max-body", d.MaxBodyBytes, "largest request body in bytes (413 above)")
	fs.IntVar(&o.maxEvent, "max-event", d.MaxEventBytes, "largest upstream event in bytes (the stream is aborted above)")
	fs.IntVar(&o.maxStream, "max-stream-bytes", d.MaxStreamBytes, "bytes recorded per stream or non-streaming body (the stream is aborted above)")
	fs.Int64Var(&o.maxStoreBytes, "max-store-bytes", cd.MaxStoreBytes, "bytes of committed responses held in memory (older ones are evicted)")
	fs.Int64Var(&o.maxLiveBytes, "max-live-bytes", cd.Limits.MaxLiveBytes, "bytes of all live stream journals together (new keyed requests get 503 above)")
	fs.IntVar(&o.sealStream, "seal-stream-bytes", cd.Limits.SealStreamBytes, "a live keyed stream whose journal holds this many bytes compresses (S2) each full block its clients have read, from then on; below it, and below -seal-age and -seal-live-bytes, a stream costs no compression until its commit")
	fs.DurationVar(&o.sealAge, "seal-age", cd.Limits.SealAge, "a live keyed stream this old compresses its journal's full blocks from then on (see -seal-stream-bytes)")
	fs.Int64Var(&o.sealLive, "seal-live-bytes", 0, "while all live journals together hold this many raw bytes, every keyed stream compresses its full blocks (see -seal-stream-bytes): many live streams trade a little CPU for about a tenth of their journals' memory; at most -max-live-bytes (0: 8 MiB, or half of -max-live-bytes if that is less)")
	fs.IntVar(&o.maxKeys, "max-keys", cd.MaxKeys, "keys the ledger tracks, with -redis all replicas' together (new keys get 503 above)")
	fs.IntVar(&o.maxStrangers, "max-stranger-keys", 0, "unexpired keys of strangers together: credentials none of whose keys has completed (a minted or refused credential is one); above it their new keys get 503 capacity_exceeded, while a credential with a completed key still gets the rest of -max-keys (0: half of -max-keys)")
	fs.Int64Var(&o.maxLiveTenant, "max-live-bytes-per-tenant", 0, "one credential's share of -max-live-bytes: past it, its new keyed requests get 503 capacity_exceeded while less than two shares are free, and its streams that grow are aborted while less than one is, so that another credential's stream within its share is never cut; a deployment with one credential sets it to -max-live-bytes (0: a quarter of -max-live-bytes)")
	fs.IntVar(&o.maxTenantKeys, "max-keys-per-tenant", 0, "unexpired keys one credential (tenant) may hold, live, completed or failed: its new keys get 503 capacity_exceeded above, other credentials' do not (0: a tenth of -max-keys)")
	fs.IntVar(&o.maxSubs, "max-followers", cd.Limits.MaxSubscribers, "clients following one live generation besides the request that started it")
	fs.IntVar(&o.maxStreams, "max-streams", d.MaxStreams, "concurrent upstream calls (503 above)")
	fs.IntVar(&o.maxConns, "upstream-max-conns", 0, "connections to each upstream, for streaming requests and for the others each (0: as many as -max-streams)")
	fs.BoolVar(&o.pprof, "pprof", false, "serve Go's profiler at /debug/pprof/ on -admin-listen (only there)")
	fs.DurationVar(&o.maxDuration, "max-stream-duration", d.MaxStreamDuration, "longest upstream stream (aborted after)")
	fs.DurationVar(&o.preambleHold, "preamble-hold", d.PreambleHold, "longest hold of a stream's preamble (events before the first model output), during which an upstream error is retried or fallen back from; negative holds nothing")
	fs.DurationVar(&o.headTimeout, "head-timeout", d.HeadTimeout, "longest wait for the response head of a request that asks for a stream (\"stream\": true), from sending it; 504 upstream_timeout after")
	fs.DurationVar(&o.idleTimeout, "upstream-idle-timeout", d.UpstreamIdleTimeout, "longest upstream silence once its answer began, not the wait for the head (504 before the first event, the stream aborted after it). Anthropic's pings and the Responses API's progress events keep long generations busy; 2m outlasts a reasoning model's pause between a chat completion's role chunk and its content, at twice the 60 s after which common load balancers cut a silent connection")
	fs.DurationVar(&o.slowClient, "slow-client-timeout", d.SlowClientTimeout, "a client that takes no 64 KiB piece of its answer for this long is dropped (it can resume); a big answer read steadily is never slow")
	fs.DurationVar(&o.stopTimeout, "stop-timeout", d.StopTimeout, "how long a stop (DELETE /streams/{key}, POST /v1/responses/{id}/cancel) waits for the generation to end before it answers 202")
	fs.DurationVar(&o.shutdown, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long open streams may run before they are aborted")
	r := &o.retry
	fs.IntVar(&r.Attempts, "retry-attempts", d.Retry.Attempts, "upstream calls per request at most, the first included (1 disables retries)")
	fs.DurationVar(&r.BaseBackoff, "retry-backoff", d.Retry.BaseBackoff, "first backoff ceiling; it doubles per retry, each wait drawn uniformly below it (full jitter)")
	fs.DurationVar(&r.MaxBackoff, "retry-max-backoff", d.Retry.MaxBackoff, "largest backoff ceiling")
	fs.DurationVar(&r.MaxElapsed, "retry-max-elapsed", d.Retry.MaxElapsed, "no retry starts later than this after the first call")
	fs.DurationVar(&r.RetryAfterMax, "retry-after-max", d.Retry.RetryAfterMax, "longest upstream Retry-After honoured; a longer one is relayed to the client instead")
	fs.DurationVar(&r.AttemptTimeout, "attempt-timeout", d.Retry.AttemptTimeout, "longest wait for one attempt's whole answer to a request that does not ask for a stream, from sending it (a non-streaming completion answers only when done; the official SDKs wait 10m too); 504 upstream_timeout after")
	fs.Float64Var(&r.BudgetRatio, "retry-budget", d.Retry.BudgetRatio, "retries may add at most this share of recent (10 s) requests")
	fs.IntVar(&r.BudgetMin, "retry-budget-min", d.Retry.BudgetMin, "retries per 10 s always allowed, whatever the budget")
	fs.IntVar(&r.BreakerFailures, "breaker-failures", d.Retry.BreakerFailures, "consecutive failures that open a circuit: an upstream's for connect failures, or its circuit for one model for that model's 5xx and transport failures (a 4xx or 429 never counts)")
	fs.DurationVar(&r.BreakerOpen, "breaker-open", d.Retry.BreakerOpen, "how long an open circuit keeps calls away before probing; it doubles per failed probe")
	fs.DurationVar(&r.BreakerOpenMax, "breaker-open-max", d.Retry.BreakerOpenMax, "longest wait between probes of an open circuit: recovery is found this soon after the upstream serves again")
	fs.IntVar(&r.BreakerProbes, "breaker-probes", d.Retry.BreakerProbes, "calls let through an open circuit per wait, and successes in a row that close it")
	fs.IntVar(&r.BreakerModels, "breaker-models", d.Retry.BreakerModels, "model circuits kept per upstream (only models with recent failures take one; least recently used reclaimed first)")
	fs.StringVar(&o.missingBody, "missing-body", "regenerate", "when a committed body was evicted from memory: regenerate (new upstream call) or gone (410 stream_gone)")
	fs.IntVar(&o.mockTokens, "mock-tokens", 16, "with -upstream mock: tokens per completion")
	fs.DurationVar(&o.mockDelay, "mock-delay", 20*time.Millisecond, "with -upstream mock: pause before each event")
	fs.IntVar(&o.metricsModels, "metrics-models", d.MetricsModels, "request models that get a label of their own in the GenAI metrics (gen_ai_request_model), the first seen first; every other model is \"other\" (0: none)")
	fs.StringVar(&o.traces, "traces", "", "otlp: export spans over OTLP/HTTP, configured by the standard OTEL_EXPORTER_OTLP_* environment; none: no spans. Empty: from OTEL_TRACES_EXPORTER, else on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set")
	fs.IntVar(&o.gcPercent, "gc-percent", 50, "the Go garbage collector's heap growth between collections, as GOGC (-1: off); lower holds less memory per stream for more CPU. Without this flag a GOGC environment variable is used instead")
	fs.Int64Var(&o.memoryLimit, "memory-limit", 0, "soft limit in bytes on the process's Go memory, as GOMEMLIMIT: the collector works harder near it; -max-store-bytes and -max-live-bytes, when not given, default to at most a quarter and an eighth of it (0: GOMEMLIMIT's, else -memory-limit-ratio of the container's memory limit read from the cgroup, else none)")
	fs.Float64Var(&o.memoryRatio, "memory-limit-ratio", 0.9, "without -memory-limit and GOMEMLIMIT, the share of the container's memory limit (cgroup v2 memory.max or v1 memory.limit_in_bytes) taken as the soft limit; the rest is for memory the Go runtime does not count, such as the kernel's socket buffers charged to the cgroup (0: ignore the cgroup)")
	fs.BoolVar(&o.version, "version", false, "print the version, commit and Go version, and exit")
	o.redis.register(fs)
	return fs
}

func parseFlags(args []string, getenv func(string) string, out io.Writer) (*options, error) {
	o := &options{}
	fs := flagSet(o)
	usage := func() {
		fs.SetOutput(out)
		fmt.Fprintf(out, "Usage: ssegate -upstream URL|mock [flags]\n\nEvery flag can also be set as SSEGATE_<NAME> (e.g. -max-body as SSEGATE_MAX_BODY); a flag on the command line wins.\n\n")
		fs.PrintDefaults()
	}
	fs.Usage = func() {} // printed below for -h only
	// Environment first, so the command line overrides it.
	var envErr error
	set := map[string]bool{} // flags given, in the environment or on the command line
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "version" {
			return // an action, not a setting
		}
		name := "SSEGATE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(name); v != "" && envErr == nil {
			if err := f.Value.Set(v); err != nil {
				envErr = fmt.Errorf("invalid value %q for %s (-%s): %w", v, name, f.Name, err)
			}
			set[f.Name] = true
		}
	})
	if envErr != nil {
		return nil, envErr
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage()
		}
		return nil, err
	}
	if o.version {
		return nil, errVersion
	}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// -gc-percent applies unless GOGC is set and the flag was not given.
	o.setGC = getenv("GOGC") == "" || getenv("SSEGATE_GC_PERCENT") != ""
	fs.Visit(func(f *flag.Flag) { o.setGC = o.setGC || f.Name == "gc-percent" })
	if o.gcPercent < -1 || o.memoryLimit < 0 {
		return nil, errors.New("-gc-percent must be -1 (off) or more, -memory-limit 0 (none) or more")
	}
	if o.memoryRatio < 0 || o.memoryRatio > 1 {
		return nil, fmt.Errorf("-memory-limit-ratio: %v; want from 0 (ignore the cgroup) to 1", o.memoryRatio)
	}
	o.memory = o.applyMemory(set, getenv, o.memoryRatio)
	if len(o.upstreams) == 0 {
		return nil, errors.New("-upstream is required (a URL, or \"mock\")")
	}
	r := &o.retry
	if r.Attempts < 1 || r.BudgetRatio < 0 || r.BreakerFailures < 1 || r.BreakerProbes < 1 || r.BreakerModels < 1 {
		return nil, errors.New("-retry-attempts, -breaker-failures, -breaker-probes and -breaker-models must be at least 1, -retry-budget at least 0")
	}
	if r.BreakerOpen <= 0 || r.BreakerOpenMax < r.BreakerOpen {
		return nil, errors.New("-breaker-open must be positive, -breaker-open-max at least -breaker-open")
	}
	if o.sealStream < 1 || o.sealAge <= 0 || o.sealLive < 0 || o.sealLive > o.maxLiveBytes {
		return nil, errors.New("-seal-stream-bytes and -seal-age must be positive, -seal-live-bytes from 0 (the default share) to -max-live-bytes")
	}
	if o.maxTenantKeys < 0 {
		return nil, errors.New("-max-keys-per-tenant must be 0 (a tenth of -max-keys) or more")
	}
	if o.maxStrangers < 0 || o.maxStrangers > o.maxKeys {
		return nil, errors.New("-max-stranger-keys must be from 0 (half of -max-keys) to -max-keys")
	}
	if o.maxLiveTenant < 0 || o.maxLiveTenant > o.maxLiveBytes {
		return nil, errors.New("-max-live-bytes-per-tenant must be from 0 (a quarter of -max-live-bytes) to -max-live-bytes")
	}
	if o.maxTenantKeys == 0 && o.maxKeys > 0 {
		o.maxTenantKeys = max(o.maxKeys/10, 1)
	}
	if o.redis.down != "reject" && o.redis.down != "relay" {
		return nil, fmt.Errorf("-redis-down: %q is neither reject nor relay", o.redis.down)
	}
	if o.redis.abandon < 1 {
		return nil, fmt.Errorf("-redis-abandon-max: %d; want 1 or more", o.redis.abandon)
	}
	if o.maxCreds < 1 {
		return nil, fmt.Errorf("-max-credentials: %d; want at least 1", o.maxCreds)
	}
	if o.anonymousKeys != "allow" && o.anonymousKeys != "deny" {
		return nil, fmt.Errorf("-anonymous-keys: %q is neither allow nor deny", o.anonymousKeys)
	}
	if o.secret != "" && len(o.secret) < proxy.MinSecretBytes {
		return nil, fmt.Errorf("-secret: %d bytes; want at least %d", len(o.secret), proxy.MinSecretBytes)
	}
	if o.missingBody != "regenerate" && o.missingBody != "gone" {
		return nil, fmt.Errorf("-missing-body: %q is neither regenerate nor gone", o.missingBody)
	}
	if o.mcpWindow <= 0 || o.mcpUnknownTTL <= 0 {
		return nil, errors.New("-mcp-dedupe-window and -mcp-unknown-ttl must be positive")
	}
	var err error
	if o.ambigStatuses, err = statusList(o.ambigStatus); err != nil {
		return nil, err
	}
	return o, nil
}

func newLogger(o *options, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, fmt.Errorf("-log-level: %w", err)
	}
	ho := &slog.HandlerOptions{Level: level}
	switch o.logFormat {
	case "json":
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, ho)), nil
	}
	return nil, fmt.Errorf("-log-format: %q is neither json nor text", o.logFormat)
}

// gcPercent returns the collector's GOGC setting in effect.
func gcPercent() int64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return -1
	}
	return int64(s[0].Value.Uint64())
}

// memoryLimit returns the Go memory limit in effect for the log: its
// bytes, or "none" for the runtime's "no limit" (math.MaxInt64).
func memoryLimit() any {
	if n := debug.SetMemoryLimit(-1); n != math.MaxInt64 { // -1 reads it
		return n
	}
	return "none"
}

// run starts ssegate and serves until ctx ends or a SIGTERM/SIGINT
// arrives. ready, when not nil, receives the listening address.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready chan<- string) error {
	o, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(o, stderr)
	if err != nil {
		return err
	}
	sig, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if o.setGC {
		debug.SetGCPercent(o.gcPercent)
	}
	if o.memoryLimit > 0 {
		debug.SetMemoryLimit(o.memoryLimit)
	}
	if o.memory.err != nil {
		log.Warn("memory: the cgroup's memory limit could not be read; no limit taken from it", "err", o.memory.err.Error())
	}
	log.Info("memory", o.memory.logArgs(o)...)
	upstreams := append([]string(nil), o.upstreams...)
	for i, u := range upstreams {
		if u != "mock" {
			continue
		}
		mock := mockllm.New(mockllm.Config{Tokens: o.mockTokens, Delay: o.mockDelay})
		if upstreams[i], err = mock.Start("127.0.0.1:0"); err != nil {
			return fmt.Errorf("mock upstream: %w", err)
		}
		defer mock.Close()
		log.Info("embedded mock LLM started", "url", upstreams[i])
	}
	missing := cache.Regenerate
	if o.missingBody == "gone" {
		missing = cache.Refuse
	}
	store, closeStore, err := newStore(&o.redis, cache.Config{
		TTL: o.ttl, MaxStoreBytes: o.maxStoreBytes, MaxKeys: o.maxKeys,
		Limits: cache.Limits{MaxLiveBytes: o.maxLiveBytes, MaxStreamBytes: o.maxStream, MaxSubscribers: o.maxSubs,
			MaxKeysPerTenant: o.maxTenantKeys, MaxStrangerKeys: o.maxStrangers, MaxLiveBytesPerTenant: o.maxLiveTenant, SealStreamBytes: o.sealStream, SealAge: o.sealAge, SealLiveBytes: o.sealLive},
		MissingBody: missing,
	}, log)
	if err != nil {
		return err
	}
	defer closeStore()
	secret, err := deploymentSecret(sig, o.secret, store, log)
	if err != nil {
		return err
	}
	var tracer trace.TracerProvider
	if on, err := tracesOn(o.traces, getenv); err != nil {
		return err
	} else if on {
		tp, shutdown, err := newTracer(ctx)
		if err != nil {
			return err
		}
		tracer = tp
		// After the drain: the spans of the streams it ended go too.
		defer func() {
			flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := shutdown(flush); err != nil {
				log.Warn("traces: spans not flushed", "err", err.Error())
			}
		}()
		log.Info("traces exported over OTLP")
	}
	models := o.metricsModels
	if models == 0 {
		models = -1 // Config's zero is its default
	}
	p, err := proxy.New(proxy.Config{
		Upstreams: upstreams, Retry: o.retry, ResumeTokenTTL: o.ttl, Store: store, Inflight: proxy.Inflight(o.inflight),
		Heartbeat: o.heartbeat, MaxBodyBytes: o.maxBody, MaxEventBytes: o.maxEvent,
		MaxStreamBytes: o.maxStream, MaxStreamDuration: o.maxDuration,
		PreambleHold: o.preambleHold, HeadTimeout: o.headTimeout, UpstreamIdleTimeout: o.idleTimeout, SlowClientTimeout: o.slowClient, StopTimeout: o.stopTimeout,
		MaxStreams: o.maxStreams, UpstreamMaxConns: o.maxConns, Logger: log,
		KeyHeaders: o.keyHeaders, AdminSeparate: o.adminListen != "", RetryAmbiguous: o.retryAmbig,
		AmbiguousStatus: o.ambigStatuses,
		Fallbacks:       o.fallbacks.rules, FallbackOnCodes: o.fallbackCodes,
		RelayWhenStoreDown: o.redis.down == "relay",
		WS:                 o.ws, MCPPaths: o.mcpPaths, MCPDedupe: o.mcpDedupe, MCPDedupeWindow: o.mcpWindow, MCPUnknownTTL: o.mcpUnknownTTL,
		TenantHeaders: o.tenantHeaders, AccountHeader: o.accountHeader, AnonymousKeys: proxy.Anonymous(o.anonymousKeys), MaxCredentials: o.maxCreds, Secret: secret,
		MetricsModels: models, Tracer: tracer,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	serveErr := make(chan error, 2)
	go func() { serveErr <- p.Server().Serve(p.Listener(ln)) }()
	if o.adminListen != "" {
		aln, err := net.Listen("tcp", o.adminListen)
		if err != nil {
			ln.Close()
			return fmt.Errorf("-admin-listen: %w", err)
		}
		handler := p.AdminHandler
		if o.pprof {
			handler = func(ctx *fasthttp.RequestCtx) {
				if strings.HasPrefix(string(ctx.Path()), "/debug/pprof/") {
					pprofhandler.PprofHandler(ctx)
					return
				}
				p.AdminHandler(ctx)
			}
		}
		admin := &fasthttp.Server{Handler: handler, Name: "ssegate-admin", ReadTimeout: 10 * time.Second}
		go func() { serveErr <- admin.Serve(p.Listener(aln)) }()
		defer admin.Shutdown() //nolint:errcheck // the process is ending
		log.Info("admin listening", "addr", aln.Addr().String())
	}
	if o.listenFile != "" {
		if err := writeListenFile(o.listenFile, ln.Addr().String()); err != nil {
			return fmt.Errorf("-listen-file: %w", err)
		}
		defer os.Remove(o.listenFile) //nolint:errcheck // the process is ending
	}
	log.Info("ssegate listening", "addr", ln.Addr().String(), "upstreams", upstreamsForLog(o.upstreams),
		"gc_percent", gcPercent(), "memory_limit", memoryLimit())
	if ready != nil {
		ready <- ln.Addr().String()
	}

	select {
	case err := <-serveErr:
		return err
	case <-sig.Done():
	}
	log.Info("draining", "timeout", o.shutdown.String())
	drain, cancel := context.WithTimeout(context.Background(), o.shutdown)
	defer cancel()
	p.Shutdown(drain) //nolint:errcheck // it logs what it had to abort
	log.Info("stopped")
	return nil
}

// fallbackFlag holds -fallback's rules: FROM=TO[,TO...], several in one
// value separated by semicolons (SSEGATE_FALLBACK), or one per flag.
type fallbackFlag struct{ rules map[string][]string }

func (f *fallbackFlag) String() string {
	var parts []string
	for from, to := range f.rules {
		parts = append(parts, from+"="+strings.Join(to, ","))
	}
	slices.Sort(parts)
	return strings.Join(parts, ";")
}

func (f *fallbackFlag) Set(v string) error {
	for _, rule := range strings.Split(v, ";") {
		if rule = strings.TrimSpace(rule); rule == "" {
			continue
		}
		from, to, ok := strings.Cut(rule, "=")
		from = strings.TrimSpace(from)
		if !ok || from == "" {
			return fmt.Errorf("%q: want FROM=TO[,TO...]", rule)
		}
		var tos listFlag
		tos.Set(to) //nolint:errcheck // it never fails
		if len(tos) == 0 {
			return fmt.Errorf("%q: no model to fall back to", rule)
		}
		if f.rules == nil {
			f.rules = map[string][]string{}
		}
		f.rules[from] = tos // a later rule for FROM (the command line after SSEGATE_FALLBACK) wins
	}
	return nil
}

// statuses writes a list of statuses as -ambiguous-status takes it.
func statuses(list []int) string {
	s := make([]string, len(list))
	for i, st := range list {
		s[i] = strconv.Itoa(st)
	}
	return strings.Join(s, ",")
}

// statusList parses -ambiguous-status: comma-separated statuses, or none
// (an empty list, not the default).
func statusList(v string) ([]int, error) {
	out := []int{}
	if strings.TrimSpace(v) == "none" {
		return out, nil
	}
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 500 || n > 599 {
			return nil, fmt.Errorf("-ambiguous-status: %q is not a 5xx status", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// listFlag is a flag that may be repeated, each value a comma-separated list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// upstreamsForLog lists the upstreams as the log may show them: without
// passwords or queries.
func upstreamsForLog(ups []string) string {
	out := make([]string, len(ups))
	for i, s := range ups {
		if u, err := url.Parse(s); err == nil {
			s = upstream.URLForLog(u)
		} else {
			s = "(unparsable)"
		}
		out[i] = s
	}
	return strings.Join(out, ",")
}

// writeListenFile writes addr and a newline to path whole or not at all
// (a file beside it, renamed), so that whoever waits for it never reads
// half an address.
func writeListenFile(path, addr string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
