package upstream

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/valyala/fasthttp"
)

// RetryConfig says when and how often a failed upstream call is tried
// again. Its zero value takes the defaults beside each field.
type RetryConfig struct {
	// Attempts bounds the calls per request, the first included (default 3;
	// 1 disables retries).
	Attempts int
	// BaseBackoff is the first backoff ceiling (default 250ms); it doubles per retry.
	BaseBackoff time.Duration
	// MaxBackoff caps one backoff (default 5s).
	MaxBackoff time.Duration
	// MaxElapsed bounds the time from the first call after which no retry
	// starts (default 30s).
	MaxElapsed time.Duration
	// RetryAfterMax is the longest Retry-After honoured (default 10s); an
	// upstream asking for longer gets its answer relayed instead.
	RetryAfterMax time.Duration
	// AttemptTimeout bounds one attempt's whole answer to a request that
	// does not ask for a stream, from the request's first byte sent
	// (default 10m, as the official OpenAI and Anthropic SDKs: a
	// non-streaming completion answers only when done). A streaming
	// request's head is bounded by Config.HeadTimeout instead.
	AttemptTimeout time.Duration
	// BudgetRatio is the share of recent requests that retries may add
	// (default 0.1); BudgetMin retries per 10 s are always allowed (default 10).
	BudgetRatio float64
	BudgetMin   int
	// BreakerFailures consecutive failures open a circuit (default 5): an
	// upstream's host circuit counts connect failures, its circuit for a
	// model the 5xx and transport failures of that model's calls
	// (circuit.go); a 4xx or 429 is never a failure. An open circuit lets
	// BreakerProbes calls through (default 1) after BreakerOpen (default
	// 250ms); each failed probe doubles the wait, up to BreakerOpenMax
	// (default 1s), and BreakerProbes successes close it.
	BreakerFailures int
	BreakerOpen     time.Duration
	BreakerOpenMax  time.Duration
	BreakerProbes   int
	// BreakerModels bounds the model circuits kept per upstream (default
	// 1000); only a model with failures or an open circuit takes one, and
	// the least recently used is reclaimed first.
	BreakerModels int
}

// SetDefaults sets each field that is zero or less to its default.
func (c *RetryConfig) SetDefaults() {
	defInt := func(n *int, v int) {
		if *n <= 0 {
			*n = v
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	defInt(&c.Attempts, 3)
	def(&c.BaseBackoff, 250*time.Millisecond)
	def(&c.MaxBackoff, 5*time.Second)
	def(&c.MaxElapsed, 30*time.Second)
	def(&c.RetryAfterMax, 10*time.Second)
	def(&c.AttemptTimeout, 10*time.Minute)
	if c.BudgetRatio <= 0 {
		c.BudgetRatio = 0.1
	}
	defInt(&c.BudgetMin, 10)
	defInt(&c.BreakerFailures, 5)
	def(&c.BreakerOpen, 250*time.Millisecond)
	def(&c.BreakerOpenMax, time.Second)
	c.BreakerOpenMax = max(c.BreakerOpenMax, c.BreakerOpen)
	defInt(&c.BreakerProbes, 1)
	defInt(&c.BreakerModels, 1000)
}

// Verdict is what one attempt's outcome allows.
type Verdict int

const (
	// Final: relay or record what came; no retry.
	Final Verdict = iota
	// Safe: the upstream did not act on the request (connect error) or
	// said it did not (429, 500, 502, 503, 504): a retry cannot double it.
	Safe
	// Ambiguous: the request went out and no answer came; a retry may
	// run the request twice, so only keyed requests are retried, with the
	// key forwarded so the upstream can deduplicate too.
	Ambiguous
)

// StatusVerdict classifies an upstream status.
func StatusVerdict(status int) Verdict {
	switch status {
	case fasthttp.StatusTooManyRequests, fasthttp.StatusInternalServerError, fasthttp.StatusBadGateway,
		fasthttp.StatusServiceUnavailable, fasthttp.StatusGatewayTimeout:
		return Safe
	}
	return Final
}

// RetryAfter parses a Retry-After header: delay-seconds or an HTTP date.
func RetryAfter(v []byte, now time.Time) time.Duration {
	if len(v) == 0 {
		return 0
	}
	if s, err := strconv.Atoi(string(v)); err == nil {
		if s < 0 {
			return 0
		}
		return time.Duration(s) * time.Second
	}
	if t, err := fasthttp.ParseHTTPDate(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// FullJitter draws each backoff uniformly between zero and an
// exponentially growing ceiling ("full jitter"), so that clients that
// failed together do not retry together.
type FullJitter struct{ exp backoff.ExponentialBackOff }

// NewFullJitter returns backoffs whose ceiling starts at base and doubles
// per call, up to ceiling.
func NewFullJitter(base, ceiling time.Duration) *FullJitter {
	j := &FullJitter{exp: backoff.ExponentialBackOff{
		InitialInterval: base, Multiplier: 2, MaxInterval: ceiling, RandomizationFactor: 0,
	}}
	j.exp.Reset()
	return j
}

// Next returns the next backoff.
func (j *FullJitter) Next() time.Duration {
	c := j.exp.NextBackOff()
	if c <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(c) + 1))
}

// Budget bounds retries to a share of recent requests: over a sliding
// window of ten one-second buckets, retries may number at most
// ratio × requests + min. When an upstream is down every request fails,
// and without a budget each would multiply the load on it by Attempts.
type Budget struct {
	ratio float64
	min   int

	mu      sync.Mutex // guards buckets
	buckets [10]struct {
		sec               int64
		requests, retries int
	}
}

// NewBudget returns a budget that allows ratio × requests + min retries
// over the last ten seconds.
func NewBudget(ratio float64, min int) *Budget { return &Budget{ratio: ratio, min: min} }

func (b *Budget) bucket(now time.Time) int {
	sec := now.Unix()
	i := int(sec % int64(len(b.buckets)))
	if b.buckets[i].sec != sec {
		b.buckets[i].sec, b.buckets[i].requests, b.buckets[i].retries = sec, 0, 0
	}
	return i
}

func (b *Budget) totals(now time.Time) (requests, retries int) {
	oldest := now.Unix() - int64(len(b.buckets)) + 1
	for _, x := range b.buckets {
		if x.sec >= oldest {
			requests += x.requests
			retries += x.retries
		}
	}
	return requests, retries
}

// Request records one request that calls the upstream.
func (b *Budget) Request(now time.Time) {
	b.mu.Lock()
	b.buckets[b.bucket(now)].requests++
	b.mu.Unlock()
}

// Retry takes one retry from the budget, or reports that it is spent.
func (b *Budget) Retry(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := b.bucket(now)
	requests, retries := b.totals(now)
	if float64(retries) >= b.ratio*float64(requests)+float64(b.min) {
		return false
	}
	b.buckets[i].retries++
	return true
}
