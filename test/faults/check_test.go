package faults_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/ssegate/ssegate/internal/gatetest"
	"sort"
	"strings"
	"sync"
)

// The invariants, as the failure messages name them.
var invariantNames = map[int]string{
	1: "every client gets one whole generation, a stream_aborted end, the provider's own failure as it sent it, or a JSON error before any byte",
	2: "no stored result is cut: a replay is whole and byte-identical to the first whole answer",
	3: "a key costs at most 1 + its failed generations in paid upstream calls",
	4: "nothing is left running: goroutines back to the baseline, ssegate_live_generations 0",
	5: "a whole upstream answer reaches the client that started it whole",
	6: "a keyed tool call runs at most once, and every caller gets a JSON-RPC answer under its own id and progress token",
}

// report collects the violations of a round.
type report struct {
	seed int64
	logs *gatetest.LogBuffer

	mu     sync.Mutex // guards found and counts
	found  map[int][]string
	counts map[int]int // violations by invariant, those not in found included
	perKey map[string]int
}

func newReport(seed int64, logs *gatetest.LogBuffer) *report {
	return &report{seed: seed, logs: logs, found: map[int][]string{}, counts: map[int]int{}, perKey: map[string]int{}}
}

// perKeyShown is how many violations of one invariant by one spec are
// spelled out; the others are counted.
const perKeyShown = 2

// add records a violation of invariant inv about spec s (nil: the round).
func (r *report) add(inv int, s *spec, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[inv]++
	who := "the round"
	if s != nil {
		who = s.describe()
		id := fmt.Sprintf("%d/%s", inv, s.name)
		if r.perKey[id]++; r.perKey[id] > perKeyShown {
			return
		}
	}
	msg := fmt.Sprintf(format, args...)
	if s != nil && s.keyed {
		if lines := about(r.logs, s.name, 10); len(lines) > 0 {
			msg += "\n\t\tssegate's log for the key:\n\t\t\t" + strings.Join(lines, "\n\t\t\t")
		}
	}
	r.found[inv] = append(r.found[inv], fmt.Sprintf("seed %d, %s: invariant %d (%s): %s", r.seed, who, inv, invariantNames[inv], msg))
}

// checker holds what a round's checks look at.
type checker struct {
	plan *plan
	up   *upstream
	xs   map[*spec][]*exchange
	rep  *report
}

// allowedErrors are the JSON errors a client may get before any byte of an
// answer in this round (docs/design.md, Errors): the upstream
// failed (502), took the request and never answered (504), or, for a
// resume, the generation the id names ended without a result (410).
// Relayed upstream errors are checked against what the upstream sent.
var allowedErrors = map[string]int{"upstream_error": 502, "upstream_timeout": 504}

// answer checks invariant 1 for one exchange.
func (c *checker) answer(x *exchange, calls []call) {
	s := x.spec
	bad := func(format string, args ...any) {
		c.rep.add(1, s, "%s: %s; got %s", x, fmt.Sprintf(format, args...), x.got())
	}
	switch {
	case x.err != nil:
		if !x.dropped {
			bad("the request got no answer")
		}
	case x.status == 200 && strings.HasPrefix(x.ctype, "text/event-stream") && s.dialect.stream():
		c.stream(x, calls, bad)
	case x.status == 200 && !s.dialect.stream():
		c.body(x, calls, bad)
	case x.status == 204:
		if x.lastID == "" {
			bad("204 to a request without Last-Event-ID")
			return
		}
		_, seq, _ := parseID(x.lastID)
		if !endsWhole(calls, int(seq)) {
			bad("204 (nothing follows) after event %d, which ends no whole answer of the key", seq)
		}
	case x.status >= 400:
		c.jsonError(x, calls, bad)
	case !s.keyed && x.status == 200:
		// Without a key the proxy relays an answer that is not an event
		// stream as it is: it must be what the upstream sent.
		for _, cl := range calls {
			if cl.origin == x.origin && bytes.Equal(cl.body, x.body) && x.readErr == nil {
				return
			}
		}
		if !x.dropped {
			bad("an answer that is neither an event stream nor the upstream's own")
		}
	default:
		bad("an answer that is neither a whole stream, an aborted one, nor a JSON error")
	}
}

// stream checks a streamed answer: one generation, contiguous from the
// resumed position, each event the upstream's, ending whole or aborted.
func (c *checker) stream(x *exchange, calls []call, bad func(string, ...any)) {
	s := x.spec
	from := 0
	var wantGen uint64
	if x.lastID != "" {
		g, seq, ok := parseID(x.lastID)
		if !ok {
			bad("the test resumed after %q, which it never saw", x.lastID)
			return
		}
		wantGen, from = g, int(seq)
	}
	evs := x.events
	aborted := len(evs) > 0 && isAbort(evs[len(evs)-1])
	if aborted {
		evs = evs[:len(evs)-1]
		if c.plan.chain && len(evs) > 0 && isAbort(evs[len(evs)-1]) {
			evs = evs[:len(evs)-1] // the inner ssegate's, relayed as its upstream's failure event
		}
	}
	for i, ev := range evs {
		if isAbort(ev) {
			bad("event %d is a stream_aborted error and more events follow it", i+1)
			return
		}
	}
	if s.keyed {
		var gen uint64
		for i, ev := range evs {
			g, seq, ok := parseID(ev.id)
			switch {
			case !ok:
				bad("event %d has id %q, not <generation>-<sequence>", i+1, ev.id)
				return
			case i == 0 && wantGen != 0 && g != wantGen:
				bad("resumed after an id of generation %d, it got events of generation %d (a resume into another generation must be 410 stream_gone)", wantGen, g)
				return
			case i == 0:
				gen = g
			case g != gen:
				bad("event %d is of generation %d, the events before it of %d: two generations in one answer", i+1, g, gen)
				return
			}
			if want := uint64(from + i + 1); seq != want {
				bad("event %d has sequence %d; want %d (a gap or a duplicate)", i+1, seq, want)
				return
			}
		}
	}
	switch {
	case x.dropped || aborted:
		if !prefixOfSome(calls, evs, from) {
			bad("its events are not the upstream's (no call sent them in this order from event %d)", from+1)
		}
		if aborted && x.partial {
			bad("the body ends inside an event after the stream_aborted event")
		}
	case x.readErr != nil || x.partial:
		bad("the stream just stopped: no terminal event, no stream_aborted, and the body did not end properly")
	default:
		if !wholeOfSome(calls, evs, from) && !statedOfSome(calls, evs, from) {
			bad("it ended as if whole, but its events from %d on are no whole answer the upstream sent: %s", from+1, closest(calls, evs, from))
		}
	}
}

// body checks a non-streaming 200: byte-identical to a whole answer.
func (c *checker) body(x *exchange, calls []call, bad func(string, ...any)) {
	if x.dropped {
		return
	}
	if x.readErr != nil && x.spec.keyed {
		bad("the body did not end properly")
		return
	}
	for _, cl := range calls {
		if cl.class == whole && bytes.Equal(cl.body, x.body) {
			return
		}
		if !x.spec.keyed && cl.origin == x.origin && cl.fault.kind == fCutClose && bytes.Equal(cl.body, x.body) {
			return // relayed as the upstream framed it: complete by HTTP, cut in its JSON
		}
	}
	if x.readErr != nil {
		// Without a key the body is relayed as it comes: a cut one must
		// at least show the client that it is cut.
		for _, cl := range calls {
			if bytes.HasPrefix(cl.body, x.body) {
				return
			}
		}
	}
	bad("a 200 body that is not a whole answer the upstream sent (%d bytes; the whole answer has %d)", len(x.body), len(x.spec.ref.body))
}

// jsonError checks an error answer before any byte.
func (c *checker) jsonError(x *exchange, calls []call, bad func(string, ...any)) {
	for _, cl := range calls {
		if cl.status == x.status && cl.status != 0 && bytes.Equal(cl.body, x.body) {
			// The upstream's own error, relayed; one that says the request
			// may have run keeps saying so.
			if cl.class == failed && !x.unknown {
				bad("the upstream's %d, which says the request may have run, relayed without Ssegate-Outcome: unknown", cl.status)
			}
			return
		}
	}
	if !strings.HasPrefix(x.ctype, "application/json") {
		bad("an error answer that is not JSON")
		return
	}
	typ := x.errType()
	if want, ok := allowedErrors[typ]; ok && want == x.status {
		if x.kind == fresh && !x.unknown && len(calls) > 0 && calls[len(calls)-1].class == failed && lastFor(calls, x.origin) {
			bad("%d %s after a call the upstream did not refuse, without Ssegate-Outcome: unknown", x.status, typ)
		}
		return
	}
	if typ == "stream_gone" && x.status == 410 && x.kind != fresh {
		return
	}
	bad("error %d %q is not an answer this round allows (upstream_error 502, upstream_timeout 504, stream_gone 410 to a resume, or the upstream's own error relayed)", x.status, typ)
}

// lastFor reports whether the last call was made for the request origin.
func lastFor(calls []call, origin string) bool {
	return len(calls) > 0 && calls[len(calls)-1].origin == origin
}

// prefixOfSome reports whether evs is a prefix of some call's events from
// position from.
func prefixOfSome(calls []call, evs []event, from int) bool {
	for _, cl := range calls {
		if matches(cl.sent, evs, from, false) {
			return true
		}
	}
	return false
}

// wholeOfSome reports whether evs is exactly a whole call's events from
// position from to their end.
func wholeOfSome(calls []call, evs []event, from int) bool {
	for _, cl := range calls {
		if cl.class == whole && matches(cl.sent, evs, from, true) {
			return true
		}
	}
	return false
}

// statedOfSome reports whether evs is a call's events from position from
// to the end its provider stated with its own failure (an error event
// mid-stream, or one before any output once no retry or fallback may
// take it), which the proxy relays as it came and does not follow with
// stream_aborted (docs/design.md, Clean end): all of them, or up to the
// error event, which ends a chat or Anthropic stream (what the upstream
// sends after it is not relayed).
func statedOfSome(calls []call, evs []event, from int) bool {
	for _, cl := range calls {
		if (cl.fault.kind != fErrorMid && cl.fault.kind != fErrorFirst) || !matches(cl.sent, evs, from, false) {
			continue
		}
		if from+len(evs) == len(cl.sent) || len(evs) > 0 && isProviderError(evs[len(evs)-1]) {
			return true
		}
	}
	return false
}

// isProviderError reports whether ev is an upstream's error event: named
// error, or data whose top-level "error" is set or whose "type" is "error".
func isProviderError(ev event) bool {
	if ev.typ == "error" {
		return true
	}
	var top map[string]json.RawMessage
	if json.Unmarshal([]byte(ev.data), &top) != nil {
		return false
	}
	e, ok := top["error"]
	return ok && string(e) != "null" || string(top["type"]) == `"error"`
}

func matches(sent, evs []event, from int, exact bool) bool {
	if from > len(sent) || len(evs) > len(sent)-from {
		return false
	}
	if exact && len(evs) != len(sent)-from {
		return false
	}
	for i, ev := range evs {
		if !ev.same(sent[from+i]) {
			return false
		}
	}
	return true
}

// endsWhole reports whether event seq is the last of a whole answer.
func endsWhole(calls []call, seq int) bool {
	for _, cl := range calls {
		if cl.class == whole && len(cl.sent) == seq {
			return true
		}
	}
	return false
}

// closest says which call the events come nearest to, for a message.
func closest(calls []call, evs []event, from int) string {
	best, bestN := -1, -1
	for i, cl := range calls {
		n := 0
		for n < len(evs) && from+n < len(cl.sent) && evs[n].same(cl.sent[from+n]) {
			n++
		}
		if n > bestN {
			best, bestN = i, n
		}
	}
	if best < 0 {
		return "the upstream made no call for it"
	}
	cl := calls[best]
	return fmt.Sprintf("they follow %s for %d of %d events (that call sent %d)", cl.String(), bestN, len(evs), len(cl.sent))
}

// cost checks invariant 3 for a spec: every upstream call the upstream did
// not refuse is paid; each generation that ended with a paid call and no
// whole answer frees the key for one more.
func (c *checker) cost(s *spec, calls []call) {
	paid, failedGens := 0, 0
	last := map[string]*call{}
	var order []string
	for i := range calls {
		cl := &calls[i]
		if cl.class != notRun {
			paid++
		}
		if _, ok := last[cl.origin]; !ok {
			order = append(order, cl.origin)
		}
		last[cl.origin] = cl
	}
	for _, o := range order {
		if last[o].class == failed {
			failedGens++
		}
	}
	allowed := 1 + failedGens
	if !s.keyed {
		allowed = 1 // an unkeyed request is one intent, never retried after a paid call
	}
	if paid > allowed {
		var lines []string
		for i, cl := range calls {
			note := ""
			if i > 0 && calls[i-1].origin == cl.origin && calls[i-1].class != notRun {
				note = fmt.Sprintf(" — a retry of the same request after call #%d, which the upstream did not refuse (it may have run it)", calls[i-1].n)
			} else if i > 0 && calls[i-1].origin != cl.origin && calls[i-1].class == whole {
				note = fmt.Sprintf(" — a new generation after call #%d sent a whole answer", calls[i-1].n)
			}
			lines = append(lines, cl.String()+note)
		}
		c.rep.add(3, s, "%d paid upstream calls; at most %d allowed (1 + %d generations that ended with a paid call and no whole answer):\n\t\t%s",
			paid, allowed, failedGens, strings.Join(lines, "\n\t\t"))
	}
	for _, cl := range calls {
		want := ""
		if s.keyed {
			want = s.name
		}
		if cl.key != want {
			c.rep.add(3, s, "%s carried Idempotency-Key %q upstream; want %q (forwarded unchanged)", cl.String(), cl.key, want)
		}
	}
	for _, x := range c.xs[s] {
		if !x.replayed {
			continue
		}
		for _, cl := range calls {
			if cl.origin == x.origin {
				c.rep.add(3, s, "%s was answered with Idempotent-Replayed: true, yet %s was made for it", x, cl.String())
			}
		}
	}
}

// delivered checks invariant 5 for a spec: the client whose request made
// a call that sent a whole answer (the last call for that request) got
// that answer whole, unless it left.
func (c *checker) delivered(s *spec, calls []call) {
	last := map[string]call{}
	for _, cl := range calls {
		last[cl.origin] = cl
	}
	for _, x := range c.xs[s] {
		cl, ok := last[x.origin]
		if !ok || cl.class != whole || x.dropped {
			continue
		}
		okWhole := false
		switch {
		case !s.dialect.stream():
			okWhole = x.status == 200 && bytes.Equal(x.body, cl.body)
		case x.err == nil && x.status == 200 && x.readErr == nil && !x.partial:
			okWhole = matches(cl.sent, x.events, 0, true)
		}
		if !okWhole {
			c.rep.add(5, s, "%s sent a whole answer (%d events) to the request %s, which got %s", cl.String(), len(cl.sent), x, x.got())
		}
	}
}

// firstWhole returns the first exchange (by its end) that received the
// whole answer of generation gen from its start, or nil.
func firstWhole(xs []*exchange, gen uint64, stream bool) *exchange {
	var cands []*exchange
	for _, x := range xs {
		if x.kind != fresh || x.dropped || x.err != nil || x.status != 200 || x.readErr != nil || x.partial {
			continue
		}
		if stream {
			if len(x.events) == 0 || isAbort(x.events[len(x.events)-1]) {
				continue
			}
			if g, _, ok := parseID(x.events[0].id); !ok || g != gen {
				continue
			}
		}
		cands = append(cands, x)
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].end.Before(cands[j].end) })
	if len(cands) == 0 {
		return nil
	}
	return cands[0]
}
