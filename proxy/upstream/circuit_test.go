package upstream

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// errStatus stands for a 5xx answer: a failure of the model's circuit.
var errStatus = errors.New("upstream answered 5xx")

// TestCircuitBackoffSchedule follows one model circuit in fake time: it
// opens at the BreakerFailures-th failure, lets one probe through after
// 250ms, then after 500ms and 1s counted from each failed probe's send,
// never more often than that, and closes at the first success; other
// models and the host are never turned away.
func TestCircuitBackoffSchedule(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		cfg := RetryConfig{BreakerFailures: 3}
		cfg.SetDefaults()
		b := newBreaker("up", &cfg, nil)
		call := func(model string, err error) bool {
			done, ok := b.allow(model)
			if ok {
				done(err)
			}
			return ok
		}
		for i := range 3 {
			if !call("m", errStatus) {
				t.Fatalf("failure %d: turned away; want the call through while closed", i+1)
			}
		}
		start := time.Now()
		var probes []time.Duration
		for time.Since(start) < 3*time.Second {
			if call("m", errStatus) {
				probes = append(probes, time.Since(start))
			}
			if !call("other", nil) {
				t.Fatalf("another model turned away at %v", time.Since(start))
			}
			time.Sleep(10 * time.Millisecond)
		}
		want := []time.Duration{250 * time.Millisecond, 750 * time.Millisecond, 1750 * time.Millisecond, 2750 * time.Millisecond}
		if fmt.Sprint(probes) != fmt.Sprint(want) {
			t.Fatalf("probes at %v; want %v", probes, want)
		}
		if got := b.ModelState("m"); got != CircuitOpen {
			t.Fatalf("state: got %v; want open", got)
		}
		time.Sleep(time.Second)
		if !call("m", nil) || b.ModelState("m") != CircuitClosed {
			t.Fatalf("after a successful probe: got %v; want closed", b.ModelState("m"))
		}
		if kept, _, _ := b.Counts(); kept != 0 {
			t.Fatalf("circuits kept once closed: got %d; want 0", kept)
		}
		if b.HostState() != CircuitClosed {
			t.Fatalf("host circuit: got %v; want closed (5xx is not a connect failure)", b.HostState())
		}
	})
}

// TestModelKeyBound: hostile model names, many and long, keep at most
// BreakerModels circuits, each under a key of at most maxModelKey bytes,
// the least recently used reclaimed first.
func TestModelKeyBound(t *testing.T) {
	t.Parallel()
	const bound, names = 16, 300
	cfg := RetryConfig{BreakerFailures: 1, BreakerOpen: 10 * time.Second, BreakerOpenMax: 10 * time.Second, BreakerModels: bound}
	cfg.SetDefaults()
	b := newBreaker("up", &cfg, nil)
	for i := range names {
		model := fmt.Sprintf("hostile-%d", i)
		if i%3 == 0 {
			model += strings.Repeat("x", 16<<10)
		}
		done, ok := b.allow(ModelKey(model))
		if !ok {
			t.Fatalf("%.20s: turned away; want its first call through", model)
		}
		done(errStatus)
	}
	kept, open, s := b.Counts()
	if kept != bound || open != bound || s.ModelsEvicted != names-bound {
		t.Errorf("model circuits: got %d kept, %d open, %d reclaimed; want %d, %d, %d", kept, open, s.ModelsEvicted, bound, bound, names-bound)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for k := range b.models {
		if len(k) > maxModelKey {
			t.Errorf("a circuit key of %d bytes; want at most %d", len(k), maxModelKey)
		}
	}
}
