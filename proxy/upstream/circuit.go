package upstream

import (
	"container/list"
	"hash/maphash"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A Breaker keeps calls away from an upstream while it fails and finds out
// within about a second that it serves again, with a host circuit for
// connect failures and a model circuit per model for the rest, so that one
// model's outage turns away no other. docs/design.md ("Failover and
// circuits") gives the rules: what counts as a failure, the probes and
// their backoff, the memory bound, and why not gobreaker.
type Breaker struct {
	name    string // the upstream, for logs and metrics
	cfg     *RetryConfig
	changed func(CircuitChange) // called outside mu

	mu     sync.Mutex // guards everything below
	epoch  uint64     // counts openings, to tell a probe of this opening from a stale one
	host   circuit
	models map[string]*list.Element // model key → element of lru holding a *modelCircuit
	lru    list.List                // most recently used first
	stats  BreakerStats
}

// BreakerStats are a breaker's counters, for metrics.
type BreakerStats struct {
	HostOpened, ModelsOpened, ModelsEvicted uint64
}

// CircuitChange is a circuit that opened or closed.
type CircuitChange struct {
	Upstream, Model string // Model is "" for the host circuit
	Host            bool
	Opened          bool          // opened, or else closed
	Failures        int           // when opened: the consecutive failures that opened it
	Wait            time.Duration // when opened: until the first probe
	OpenFor         time.Duration // when closed: how long it was open
}

// CircuitState is a circuit's state, as metrics show it.
type CircuitState int

// The states of a circuit.
const (
	CircuitClosed CircuitState = iota
	CircuitOpen
	CircuitHalfOpen // open, with a probe out
)

// String is the state as logs show it.
func (s CircuitState) String() string {
	switch s {
	case CircuitOpen:
		return "open"
	case CircuitHalfOpen:
		return "half-open"
	}
	return "closed"
}

// outcome is what a call says of one circuit's target.
type outcome int

const (
	ignored   outcome = iota // says nothing (a failure of this process)
	succeeded                // the upstream answered
	failed
)

// circuit is one circuit's state. Its zero value is closed with no
// failures.
type circuit struct {
	open      bool
	failures  int           // consecutive failures while closed
	successes int           // consecutive successes while open
	epoch     uint64        // while open: which opening this is
	wait      time.Duration // while open: the wait from a failed probe to the next
	next      time.Time     // while open: when the next probes may go
	probes    int           // while open: probes let through since next last passed
	out       int           // while open: probes not yet reported
	since     time.Time     // while open: when it opened
}

func (c *circuit) state() CircuitState {
	switch {
	case !c.open:
		return CircuitClosed
	case c.out > 0:
		return CircuitHalfOpen
	}
	return CircuitOpen
}

// admits reports whether a call may go through at now.
func (c *circuit) admits(now time.Time, probes int) bool {
	return !c.open || !now.Before(c.next) || c.probes < probes
}

// admit lets a call through that admits allowed; it returns the opening
// the call probes, or 0 when the circuit is closed.
func (c *circuit) admit(now time.Time) (probe uint64) {
	if !c.open {
		return 0
	}
	if !now.Before(c.next) {
		// A new round of probes; a probe still out from the last one
		// does not hold it.
		c.next, c.probes = now.Add(c.wait), 0
	}
	c.probes++
	c.out++
	return c.epoch
}

// settle records the outcome of a call sent at sent; probe is what admit
// returned for it. It reports whether the circuit opened or closed.
func (c *circuit) settle(o outcome, probe uint64, sent, now time.Time, b *Breaker) (opened, closed bool) {
	cfg := b.cfg
	isProbe := c.open && probe != 0 && probe == c.epoch
	if isProbe {
		c.out--
	}
	switch {
	case o == ignored:
		if isProbe && c.probes > 0 {
			c.probes-- // it said nothing: another probe may go in its place
		}
	case !c.open && o == succeeded:
		c.failures = 0
	case !c.open:
		c.failures++
		if c.failures >= cfg.BreakerFailures {
			b.epoch++
			*c = circuit{open: true, failures: c.failures, epoch: b.epoch, wait: cfg.BreakerOpen,
				next: now.Add(cfg.BreakerOpen), probes: cfg.BreakerProbes, since: now}
			return true, false
		}
	case o == succeeded:
		// A probe, or a call sent before the circuit opened: either way
		// the upstream answered after the failures.
		c.successes++
		if c.successes >= cfg.BreakerProbes {
			return false, true
		}
		c.probes = 0 // the next probe goes at once
	case isProbe:
		c.successes = 0
		c.wait = min(2*c.wait, cfg.BreakerOpenMax)
		c.next, c.probes = sent.Add(c.wait), cfg.BreakerProbes
	}
	// A failure of a call that was not a probe says nothing new of an
	// open circuit.
	return false, false
}

// modelCircuit is a model's circuit, as the breaker's lru holds it.
type modelCircuit struct {
	model string
	circuit
}

func newBreaker(name string, cfg *RetryConfig, changed func(CircuitChange)) *Breaker {
	if changed == nil {
		changed = func(CircuitChange) {}
	}
	return &Breaker{name: name, cfg: cfg, changed: changed, models: make(map[string]*list.Element)}
}

// allow reports whether a call for model may go to the upstream now; if
// it may, done reports the call's error (nil for an answer below 500) to
// the circuits.
func (b *Breaker) allow(model string) (done func(error), ok bool) {
	now := time.Now()
	b.mu.Lock()
	el, ok := b.admitting(model, now)
	if !ok {
		b.mu.Unlock()
		return nil, false
	}
	hostProbe := b.host.admit(now)
	var modelProbe uint64
	if el != nil {
		modelProbe = el.Value.(*modelCircuit).admit(now)
		b.lru.MoveToFront(el)
	}
	b.mu.Unlock()
	return func(err error) { b.settle(model, hostProbe, modelProbe, now, err) }, true
}

// Admits reports whether a call for model (a key from ModelKey) would be let through now,
// without letting one through.
func (b *Breaker) Admits(model string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.admitting(model, time.Now())
	return ok
}

// admitting returns model's kept circuit (nil when it has none) and
// whether its circuits let a call through at now; b.mu is held.
func (b *Breaker) admitting(model string, now time.Time) (*list.Element, bool) {
	probes := b.cfg.BreakerProbes
	el := b.models[model]
	if !b.host.admits(now, probes) {
		return el, false
	}
	return el, el == nil || el.Value.(*modelCircuit).admits(now, probes)
}

// settle records what a call said of the host and of model.
func (b *Breaker) settle(model string, hostProbe, modelProbe uint64, sent time.Time, err error) {
	host, mo := succeeded, succeeded
	switch {
	case err == nil:
	case localFailure(err):
		host, mo = ignored, ignored
	case IsDial(err):
		host, mo = failed, ignored // nothing reached the upstream: a host failure only
	default:
		mo = failed // it connected, so the host is up; the call failed
	}
	now := time.Now()
	var changes [2]CircuitChange
	n := 0
	b.mu.Lock()
	if opened, closed := b.host.settle(host, hostProbe, sent, now, b); opened || closed {
		changes[n] = b.change(&b.host, "", opened, now)
		if opened {
			b.stats.HostOpened++
		} else {
			b.host = circuit{}
		}
		n++
	}
	el := b.models[model]
	if el == nil && mo == failed {
		el = b.add(model)
	}
	if el != nil {
		mc := el.Value.(*modelCircuit)
		opened, closed := mc.settle(mo, modelProbe, sent, now, b)
		if opened || closed {
			changes[n] = b.change(&mc.circuit, model, opened, now)
			n++
		}
		if opened {
			b.stats.ModelsOpened++
		}
		if closed || (!mc.open && mc.failures == 0) {
			b.lru.Remove(el)
			delete(b.models, model)
		}
	}
	b.mu.Unlock()
	for _, c := range changes[:n] {
		b.changed(c)
	}
}

// change describes c's opening or closing; b.mu is held.
func (b *Breaker) change(c *circuit, model string, opened bool, now time.Time) CircuitChange {
	ch := CircuitChange{Upstream: b.name, Model: model, Host: c == &b.host, Opened: opened}
	if opened {
		ch.Failures, ch.Wait = c.failures, c.wait
	} else {
		ch.OpenFor = now.Sub(c.since)
	}
	return ch
}

// add keeps a new closed circuit for model, reclaiming the least recently
// used one when the bound is reached; b.mu is held.
func (b *Breaker) add(model string) *list.Element {
	for len(b.models) >= b.cfg.BreakerModels {
		old := b.lru.Back()
		b.lru.Remove(old)
		delete(b.models, old.Value.(*modelCircuit).model)
		b.stats.ModelsEvicted++
	}
	el := b.lru.PushFront(&modelCircuit{model: model})
	b.models[model] = el
	return el
}

// HostState is the host circuit's state.
func (b *Breaker) HostState() CircuitState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.host.state()
}

// ModelState is model's circuit's state.
func (b *Breaker) ModelState(model string) CircuitState {
	b.mu.Lock()
	defer b.mu.Unlock()
	if el := b.models[model]; el != nil {
		return el.Value.(*modelCircuit).state()
	}
	return CircuitClosed
}

// Counts returns how many model circuits are kept and how many of them
// are open, with the breaker's counters.
func (b *Breaker) Counts() (kept, open int, s BreakerStats) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, el := range b.models {
		if el.Value.(*modelCircuit).open {
			open++
		}
	}
	return len(b.models), open, b.stats
}

// maxModelKey bounds the bytes a model name takes as a circuit's key.
const maxModelKey = 128

var modelSeed = maphash.MakeSeed()

// ModelKey returns the circuit key of a request's top-level "model": the
// name itself, or for a name longer than maxModelKey its prefix and a hash
// of the whole, so that a hostile name cannot make a kept circuit large.
// A body without one has the key "".
func ModelKey(model string) string {
	if len(model) <= maxModelKey {
		return model
	}
	h := strconv.FormatUint(maphash.String(modelSeed, model), 16)
	return strings.Clone(model[:maxModelKey-len(h)-1]) + "#" + h
}
