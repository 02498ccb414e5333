package proxy

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/redis"
	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
)

// metrics are the proxy's Prometheus series. Label values are drawn from
// fixed sets (decisions, causes, states, configured upstreams), never from
// keys, tenants or paths, so the series count is bounded.
type metrics struct {
	reg *prometheus.Registry

	requests       [numDecisions]prometheus.Counter // by decision; nil for decisionNone
	acceptErrors   prometheus.Counter
	suppressed     prometheus.Counter
	attempts       *prometheus.CounterVec
	retries        *prometheus.CounterVec
	noRetry        *prometheus.CounterVec
	fallbacks      *prometheus.CounterVec
	budgetRefused  prometheus.Counter
	aborted        *prometheus.CounterVec
	cacheSkipped   *prometheus.CounterVec
	tokensSaved    *prometheus.CounterVec
	attemptsPerOK  prometheus.Histogram
	ttfeUpstream   prometheus.Histogram
	ttfeAdded      prometheus.Histogram
	events         prometheus.Counter
	clientBytes    prometheus.Counter
	missingBodies  prometheus.Counter
	slowDropped    prometheus.Counter
	originHandoffs prometheus.Counter
	clientsGone    prometheus.Counter
	commitUnknowns prometheus.Counter
	wsConns        prometheus.Gauge
	wsTurns        *prometheus.CounterVec
	stops          *prometheus.CounterVec
	timeouts       *prometheus.CounterVec
	resumes        *prometheus.CounterVec
	tokensLost     [numLosses][2]prometheus.Counter // by loss, then input and output
	retryAdded     [2]prometheus.Observer           // by what answered: a retry of the model, or a fallback model

	genAI          *genAIMetrics
	tools          *prometheus.CounterVec // MCP tool calls by decision
	toolSuppressed prometheus.Counter
	toolAttempts   prometheus.Histogram
}

// retryAddedBuckets span a quick retry's milliseconds to a minute of backoff.
var retryAddedBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

// firstEventBuckets span a loopback relay's microseconds to a reasoning
// model's minute.
var firstEventBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

func newMetrics(p *Proxy) *metrics {
	reg := prometheus.NewRegistry()
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m := &metrics{reg: reg}
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ssegate_" + name, Help: help}, labels)
		f(v)
		return v
	}
	c := func(name, help string) prometheus.Counter {
		v := prometheus.NewCounter(prometheus.CounterOpts{Name: "ssegate_" + name, Help: help})
		f(v)
		return v
	}
	requests := cv("requests_total", "Requests by decision: "+decisionList(false)+".", "decision")
	for d := decisionNone + 1; d < numDecisions; d++ {
		m.requests[d] = requests.WithLabelValues(d.String())
	}
	m.suppressed = c("duplicates_suppressed_total", "Requests answered without a new upstream generation ("+decisionList(true)+"): generations saved.")
	m.attempts = cv("upstream_attempts_total", "Upstream calls by outcome.", "outcome")
	m.retries = cv("retries_total", "Upstream calls retried, by the failure that caused the retry.", "reason")
	m.noRetry = cv("retries_refused_total", "Retryable failures not retried, by why: attempts, max_elapsed, retry_after_too_long, budget.", "why")
	m.fallbacks = cv("fallbacks_total", "Requests that went on to the next model of their -fallback rule, by the failure of the model given up on.", "reason")
	m.budgetRefused = c("retry_budget_exhausted_total", "Retries refused because the retry budget was spent.")
	m.aborted = cv("streams_aborted_total", "Streams that started and ended without a clean end, by cause.", "cause")
	// Each cause a stream can be aborted with starts at 0: a series born
	// at 1 shows no increase, and rate() would miss each cause's first.
	for c := causeNone + 1; c < numCauses; c++ {
		if causes[c].abort != "" && !causes[c].relayEnd {
			m.aborted.WithLabelValues(c.String())
		}
	}
	m.cacheSkipped = cv("cache_skipped_total", "Answers relayed whole and not stored, by reason: no_key, store_refused, error_body, or the detector reason of a stream its provider ended that is its failure or cannot be proven whole (error_event, response_failed, unexpected_choice, missing_usage, missing_stop_reason, unknown_dialect).", "reason")
	m.tokensSaved = cv("tokens_saved_total", "Upstream-reported tokens of answers served without a new generation.", "kind")
	m.events = c("events_relayed_total", "Events read from upstream streams and journaled.")
	m.clientBytes = c("client_bytes_total", "Bytes written to clients in streamed answers.")
	m.missingBodies = c("missing_bodies_total", "Committed keys whose body the store no longer held when asked for.")
	m.slowDropped = c("slow_clients_dropped_total", "Clients dropped because their connection accepted nothing for -slow-client-timeout.")
	m.originHandoffs = c("clients_behind_total", "Clients of a generation that fell behind its events and were handed from the generation's own writes to a writer of their own.")
	m.clientsGone = c("clients_gone_total", "Answers whose client went away before the end: mid-stream, or while waiting for a non-streaming answer it joined.")
	m.timeouts = cv("upstream_timeouts_total", "Upstream connections cut by a time budget: head (-head-timeout), attempt (-attempt-timeout), idle (-upstream-idle-timeout).", "budget")
	m.resumes = cv("upstream_resumes_total", "Reconnects of background Responses streams whose upstream connection broke mid-stream, by outcome: resumed, refused (the upstream answered otherwise), failed (no reconnect got through).", "outcome")
	m.acceptErrors = c("accept_errors_total", "Connections the listener could not take for want of file descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM): each is waited out and the accept tried again.")
	m.wsConns = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ssegate_ws_connections", Help: "Responses WebSocket connections open (-ws-max-conns)."})
	f(m.wsConns)
	m.wsTurns = cv("ws_turns_total", "Responses WebSocket turns (response.create frames) by decision: relay (unkeyed), miss, join, duplicate (a re-send on the lane the turn is delivered on: nothing more is sent), hit, conflict, unknown, gone, cancelled, invalid, refused.", "decision")
	m.commitUnknowns = c("commit_unknown_total", "Generations that ended with an unknowable outcome (state commit_unknown).")
	m.stops = cv("stops_total", "Stops of live generations by their tenant (DELETE /streams/{key}, POST /v1/responses/{id}/cancel), by result: stopped (it ended cancelled), unconfirmed (not seen to end within -stop-timeout), ended (it had ended otherwise), not_found.", "result")
	for _, r := range stopResults {
		m.stops.WithLabelValues(r)
	}
	lost := cv("tokens_lost_total", "Upstream-reported tokens of generations no client got whole, by kind (input, output) and loss: aborted (the stream reached clients and did not end whole), retried (an attempt failed before any output and was made again), fallback (the model's last attempt, given up for the next model), failed (the last attempt failed before any output).", "kind", "loss")
	for l := range numLosses {
		m.tokensLost[l] = [2]prometheus.Counter{lost.WithLabelValues("input", l.String()), lost.WithLabelValues("output", l.String())}
	}
	added := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ssegate_retry_added_seconds",
		Help:    "Time retries and fallbacks added to answers that took more than one upstream call: from the first call's start to the start of the call that answered, by what answered (retry: the request's model; fallback: another).",
		Buckets: retryAddedBuckets}, []string{"by"})
	f(added)
	m.retryAdded = [2]prometheus.Observer{added.WithLabelValues("retry"), added.WithLabelValues("fallback")}
	m.genAI = newGenAIMetrics(reg, p.cfg.MetricsModels)
	m.tools = cv("tool_calls_total", "MCP tools/call requests by decision: miss, join, hit, conflict, unknown (its outcome unknown: not run again), in_flight, gone, unprotected, relay (no key).", "decision")
	for _, d := range []string{"miss", "join", "hit", "conflict", "unknown", "in_flight", "gone", "unprotected", "relay"} {
		m.tools.WithLabelValues(d)
	}
	m.toolSuppressed = c("tool_duplicate_side_effects_suppressed_total", "Keyed MCP tool calls answered without running the tool again (join, hit, unknown): side effects not repeated.")
	m.toolAttempts = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ssegate_tool_call_attempts",
		Help: "Calls to the MCP server per keyed tool call that was sent.", Buckets: []float64{1, 2, 3, 4, 5}})
	f(m.toolAttempts)
	if ts, ok := p.store.(ToolStore); ok && len(p.cfg.MCPPaths) > 0 {
		f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ssegate_tool_calls_unknown",
			Help: "Keyed MCP tool calls whose outcome is unknown (commit_unknown), held until -mcp-unknown-ttl or DELETE /keys/{key}; with -redis, those this replica ended."},
			func() float64 { return float64(ts.ToolUnknowns()) }))
	}
	m.attemptsPerOK = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ssegate_upstream_attempts_per_success",
		Help: "Upstream calls it took to get an answer that started.", Buckets: []float64{1, 2, 3, 4, 5, 8}})
	m.ttfeUpstream = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ssegate_upstream_first_event_seconds",
		Help: "Time from sending the upstream request to its first event journaled (its first output, or its preamble at -preamble-hold).", Buckets: firstEventBuckets})
	m.ttfeAdded = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ssegate_proxy_first_event_added_seconds",
		Help: "Time from reading the upstream's first event to flushing it to the client that started the generation.", Buckets: firstEventBuckets})
	f(m.attemptsPerOK)
	f(m.ttfeUpstream)
	f(m.ttfeAdded)
	f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ssegate_live_generations", Help: "Upstream calls and streams in progress."},
		func() float64 { return float64(p.streams.Load()) }))
	f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ssegate_live_generations_limit", Help: "The bound on ssegate_live_generations (-max-streams)."},
		func() float64 { return float64(p.cfg.MaxStreams) }))
	for _, up := range p.ups {
		b := up.Breaker()
		l := prometheus.Labels{"upstream": up.Name()}
		f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ssegate_upstream_circuit_open",
			Help: "1 while an upstream's host circuit (connect failures) is open, 0.5 half-open (a probe out), 0 closed.", ConstLabels: l},
			func() float64 {
				switch b.HostState() {
				case upstream.CircuitOpen:
					return 1
				case upstream.CircuitHalfOpen:
					return 0.5
				}
				return 0
			}))
		f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ssegate_upstream_model_circuits_open",
			Help: "An upstream's model circuits (5xx and transport failures of one model) that are open.", ConstLabels: l},
			func() float64 { _, n, _ := b.Counts(); return float64(n) }))
		f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ssegate_upstream_model_circuits",
			Help: "An upstream's model circuits kept: models with recent failures or an open circuit (at most -breaker-models).", ConstLabels: l},
			func() float64 { n, _, _ := b.Counts(); return float64(n) }))
		f(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ssegate_upstream_circuits_opened_total",
			Help: "Times an upstream's circuits opened, by scope: host (connect failures) or model.", ConstLabels: prometheus.Labels{"upstream": up.Name(), "scope": "host"}},
			func() float64 { _, _, s := b.Counts(); return float64(s.HostOpened) }))
		f(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ssegate_upstream_circuits_opened_total",
			Help: "Times an upstream's circuits opened, by scope: host (connect failures) or model.", ConstLabels: prometheus.Labels{"upstream": up.Name(), "scope": "model"}},
			func() float64 { _, _, s := b.Counts(); return float64(s.ModelsOpened) }))
		f(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ssegate_upstream_model_circuits_reclaimed_total",
			Help: "Model circuits dropped, least recently used first, because -breaker-models were kept.", ConstLabels: l},
			func() float64 { _, _, s := b.Counts(); return float64(s.ModelsEvicted) }))
	}
	switch s := p.store.(type) {
	case interface{ Stats() cache.Stats }:
		f(&storeCollector{stats: s.Stats})
	case redisStore:
		f(&redisCollector{stats: s.Stats, unknown: s.UnknownKeys})
	}
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, b := range []upstream.TimeBudget{upstream.BudgetHead, upstream.BudgetAttempt, upstream.BudgetIdle} {
		m.timeouts.WithLabelValues(b.String())
	}
	return m
}

// decided counts a request under its decision d; decisionNone is not
// counted (a cause that ends a request already counted).
func (m *metrics) decided(d decision) {
	if d == decisionNone {
		return
	}
	m.requests[d].Inc()
	if decisions[d].suppressed {
		m.suppressed.Inc()
	}
}

// hooks are the moments the metrics count (hooks.go).
func (m *metrics) hooks() hooks {
	h := nopHooks()
	h.decided = func(_ *fasthttp.RequestCtx, d decision, _ uint64) { m.decided(d) }
	h.missingBody = m.missingBodies.Inc
	h.saved = m.saved
	h.attemptEnded = func(_ *gen, outcome string) { m.attempts.WithLabelValues(outcome).Inc() }
	h.firstOutput = func(g *gen, sent time.Time) {
		m.ttfeUpstream.Observe(time.Since(sent).Seconds())
		m.genAI.firstToken(g.ai, g.start)
	}
	h.eventJournaled = m.events.Inc
	h.retry = func(_ *gen, a attempt) {
		m.retries.WithLabelValues(a.cause.reason(a.head.Status)).Inc()
		m.lost(lossRetried, a)
	}
	h.retryRefused = func(why string) {
		if why == "budget" {
			m.budgetRefused.Inc()
		}
		m.noRetry.WithLabelValues(why).Inc()
	}
	h.fallback = func(_ *gen, a attempt, _ string) {
		m.fallbacks.WithLabelValues(a.reason()).Inc()
		m.lost(lossFallback, a)
	}
	h.answered = func(g *gen, calls int) {
		if !g.kind.model {
			return
		}
		m.attemptsPerOK.Observe(float64(calls))
		if calls > 1 {
			by := 0
			if g.fellBack {
				by = 1
			}
			m.retryAdded[by].Observe(g.lastSent.Sub(g.firstSent).Seconds())
		}
	}
	// The last call's tokens, once: an earlier call relayed instead was
	// counted when it was retried or fallen back from.
	h.gaveUp = func(_ *gen, a attempt) { m.lost(lossFailed, a) }
	h.aborted = func(c cause) { m.aborted.WithLabelValues(c.String()).Inc() }
	h.tokensLost = m.lostTokens
	h.notStored = func(reason string) { m.cacheSkipped.WithLabelValues(reason).Inc() }
	h.ended = func(g *gen, errType string, unknown bool) {
		if unknown {
			m.commitUnknowns.Inc()
		}
		m.genAI.end(g, errType)
	}
	h.runEnded = func(g *gen, calls int) {
		if g.kind.perCall != nil && calls > 0 {
			g.kind.perCall(m).Observe(float64(calls))
		}
	}
	h.healed = func(outcome string) { m.resumes.WithLabelValues(outcome).Inc() }
	h.timedOut = func(b upstream.TimeBudget) { m.timeouts.WithLabelValues(b.String()).Inc() }
	h.firstFlushed = func(f *cache.Flight) {
		if t := f.FirstEventAt(); !t.IsZero() {
			m.ttfeAdded.Observe(time.Since(t).Seconds())
		}
	}
	h.wrote = func(n int) { m.clientBytes.Add(float64(n)) }
	h.clientBehind = m.originHandoffs.Inc
	h.clientGone = func(slow bool) {
		if slow {
			m.slowDropped.Inc()
		}
		m.clientsGone.Inc()
	}
	h.acceptError = m.acceptErrors.Inc
	h.stopped = func(result string) { m.stops.WithLabelValues(result).Inc() }
	h.tool = func(kind string, suppressed bool) {
		m.tools.WithLabelValues(kind).Inc()
		if suppressed {
			m.toolSuppressed.Inc()
		}
	}
	h.wsConnection = func(delta int) { m.wsConns.Add(float64(delta)) }
	h.wsTurn = func(label string, d decision) {
		m.wsTurns.WithLabelValues(label).Inc()
		m.decided(d)
	}
	return h
}

// saved counts the tokens of an answer served without a new generation.
func (m *metrics) saved(u cache.Usage) {
	if u.Input > 0 {
		m.tokensSaved.WithLabelValues("input").Add(float64(u.Input))
	}
	if u.Output > 0 {
		m.tokensSaved.WithLabelValues("output").Add(float64(u.Output))
	}
}

// lost counts the tokens the upstream reported for attempt a, whose
// generation no client got whole, as l.
func (m *metrics) lost(l loss, a attempt) {
	if a.used {
		m.lostTokens(l, a.usage)
	}
}

// lostTokens counts u as lost to l.
func (m *metrics) lostTokens(l loss, u cache.Usage) {
	m.tokensLost[l][0].Add(float64(u.Input))
	m.tokensLost[l][1].Add(float64(u.Output))
}

// decisionList lists the decisions with their notes, or the labels of
// those that count as suppressed, for the metrics' help.
func decisionList(suppressed bool) string {
	var b strings.Builder
	for d := decisionNone + 1; d < numDecisions; d++ {
		r := decisions[d]
		if suppressed && !r.suppressed {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(r.label)
		if r.note != "" && !suppressed {
			b.WriteString(" (" + r.note + ")")
		}
	}
	return b.String()
}

// handler serves the metrics in Prometheus text format.
func (m *metrics) handler() fasthttp.RequestHandler {
	return fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
}

// storeCollector reads the store's counters at scrape time.
type storeCollector struct{ stats func() cache.Stats }

var (
	descEntries  = prometheus.NewDesc("ssegate_store_entries", "Committed bodies held in memory.", nil, nil)
	descBytes    = prometheus.NewDesc("ssegate_store_bytes", "Bytes of committed bodies held in memory.", nil, nil)
	descLive     = prometheus.NewDesc("ssegate_live_journal_bytes", "Bytes held by live journals.", nil, nil)
	descEvicted  = prometheus.NewDesc("ssegate_store_evictions_total", "Committed bodies evicted (by cost or TTL).", nil, nil)
	descRefused  = prometheus.NewDesc("ssegate_store_refused_total", "Committed bodies the body store refused to admit.", nil, nil)
	descCommits  = prometheus.NewDesc("ssegate_commits_total", "Answers committed to the ledger.", nil, nil)
	descKeys     = prometheus.NewDesc("ssegate_keys", "Keys in the ledger by state.", []string{"state"}, nil)
	descRegen    = prometheus.NewDesc("ssegate_regenerated_total", "Keys regenerated because their committed body was gone.", nil, nil)
	descLiveMax  = prometheus.NewDesc("ssegate_live_journal_bytes_limit", "The bound on ssegate_live_journal_bytes (-max-live-bytes).", nil, nil)
	descBytesMax = prometheus.NewDesc("ssegate_store_bytes_limit", "The bound on ssegate_store_bytes (-max-store-bytes).", nil, nil)
	descKeysMax  = prometheus.NewDesc("ssegate_keys_limit", "The bound on the ledger's keys, all states together (-max-keys).", nil, nil)
	descUnknown  = prometheus.NewDesc("ssegate_commit_unknown_keys", "Keys in state commit_unknown now: in memory, exactly; in Redis, the keys its scripts left so until their records expire (the same on every replica).", nil, nil)
	allStates    = []cache.State{cache.StateIntentReceived, cache.StateExecutionStarted, cache.StateCommitted, cache.StateFailedRetryable, cache.StateFailedTerminal, cache.StateCommitUnknown, cache.StateCancelled}
	storeDescset = []*prometheus.Desc{descEntries, descBytes, descLive, descEvicted, descRefused, descCommits, descKeys, descRegen, descLiveMax, descBytesMax, descKeysMax, descUnknown}
)

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range storeDescset {
		ch <- d
	}
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	g := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	k := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	g(descEntries, s.StoreEntries)
	g(descBytes, s.StoredBytes)
	g(descLive, s.LiveBytes)
	g(descLiveMax, s.MaxLiveBytes)
	g(descBytesMax, s.MaxStoreBytes)
	g(descKeysMax, s.MaxKeys)
	k(descEvicted, s.Evicted)
	k(descRefused, s.Rejected)
	k(descCommits, s.Commits)
	k(descRegen, s.Regenerated)
	for _, st := range allStates {
		ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, float64(s.ByState[st]), string(st))
	}
	g(descUnknown, s.ByState[cache.StateCommitUnknown])
}

// redisCollector reads a Redis store's counters at scrape time, and asks
// Redis for its commit_unknown keys (no answer: the gauge is left out).
type redisCollector struct {
	stats   func() redis.Stats
	unknown func() (int64, error)
}

var redisDescs = map[string]*prometheus.Desc{}

func redisDesc(name, help string) *prometheus.Desc {
	d := prometheus.NewDesc("ssegate_redis_"+name, help, nil, nil)
	redisDescs[name] = d
	return d
}

var (
	descRClaims  = redisDesc("claims_total", "Claim scripts run.")
	descRBatches = redisDesc("append_batches_total", "Journal append batches Redis took, one per owner; on a standalone Redis several owners' batches share one script call.")
	descREvents  = redisDesc("events_appended_total", "Events this replica appended to Redis as owner.")
	descRCommits = redisDesc("commits_total", "Generations this replica committed.")
	descRFenced  = redisDesc("fenced_total", "Owned generations ended because another replica took them over.")
	descRReaped  = redisDesc("reaped_total", "Generations of dead owners this replica ended.")
	descRTails   = redisDesc("tails_total", "Tails started: one per followed generation per replica.")
	descRReads   = redisDesc("reads_total", "Journal reads (XREAD) of tails.")
	descRUnavail = redisDesc("unavailable_total", "Operations that failed because Redis was unreachable.")
	descRAbandon = redisDesc("claims_abandoned_total", "Generations of claims whose reply was lost, ended failed_retryable so that nobody waits a lease on them.")
	descRRenew   = redisDesc("renewals_total", "Lease renewals of owned generations.")
	descRAsks    = redisDesc("asks_total", "Signals sent to owner replicas asking for a journal to follow.")
	descRMirrors = redisDesc("mirrors_total", "Owned generations whose journal was mirrored to Redis because a follower asked.")
	descRWaits   = redisDesc("waits_total", "WAITs for the Redis server's replicas sent after claims and commits (-redis-wait-replicas).")
	descRShort   = redisDesc("waits_short_total", "WAITs after claims and commits that timed out or failed with fewer replicas than -redis-wait-replicas: a failover then may lose those writes.")
)

func (c *redisCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range redisDescs {
		ch <- d
	}
	ch <- descLive
	ch <- descLiveMax
	ch <- descUnknown
}

func (c *redisCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	k := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	k(descRClaims, s.Claims)
	k(descRBatches, s.Batches)
	k(descREvents, s.Events)
	k(descRCommits, s.Commits)
	k(descRFenced, s.Fenced)
	k(descRReaped, s.Reaped)
	k(descRTails, s.Tails)
	k(descRReads, s.Reads)
	k(descRUnavail, s.Unavailable)
	k(descRAbandon, s.Abandoned)
	k(descRRenew, s.Renewals)
	k(descRAsks, s.Asks)
	k(descRMirrors, s.Mirrors)
	k(descRWaits, s.Waits)
	k(descRShort, s.WaitsShort)
	ch <- prometheus.MustNewConstMetric(descLive, prometheus.GaugeValue, float64(s.LiveBytes))
	ch <- prometheus.MustNewConstMetric(descLiveMax, prometheus.GaugeValue, float64(s.MaxLiveBytes))
	if n, err := c.unknown(); err == nil {
		ch <- prometheus.MustNewConstMetric(descUnknown, prometheus.GaugeValue, float64(n))
	}
}
