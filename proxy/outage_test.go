package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
)

// outageEnv is ssegate with -fallback primary=fb and otherwise the
// default retries, budget and circuits, in front of the mock: "primary"
// fails as the test sets it, and "limited" always answers 429 with
// Retry-After: 1, so that its requests are retried and spend the retry
// budget every model shares.
func outageEnv(t *testing.T) *env {
	t.Helper()
	return newEnv(t, func(pc *Config, _ *cache.Config, mc *mockllm.Config) {
		pc.Fallbacks = map[string][]string{"primary": {"fb"}}
		mc.ModelFaults = map[string]string{"limited": "status=429"}
		mc.Tokens = 8
	})
}

// post sends body with key (none when empty) from any goroutine, and
// reads the whole answer.
func (e *env) post(key, body string) (result, error) {
	hr, err := http.NewRequest(http.MethodPost, e.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return result{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	if key != "" {
		hr.Header.Set("Idempotency-Key", key)
	}
	resp, err := e.client.Do(hr)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return parseResult(resp, raw, err), nil
}

// wholeBy says how r falls short of a whole stream answered by model,
// or "" when it does not.
func wholeBy(r result, model string) string {
	if r.status != 200 || r.aborted || r.lastData() != "[DONE]" {
		return fmt.Sprintf("got %d aborted=%v ending %q; want a whole stream", r.status, r.aborted, r.lastData())
	}
	for _, ev := range r.events {
		if i := strings.Index(ev.Data, `"model":"`); i >= 0 {
			rest := ev.Data[i+len(`"model":"`):]
			if by := rest[:strings.IndexByte(rest, '"')]; by != model {
				return fmt.Sprintf("answered by %q; want %q", by, model)
			}
			return ""
		}
	}
	return "no event names a model"
}

// TestOutageAnsweredByFallback: the primary model answers 503 for 60 s
// while another model's 429s spend the retry budget. Every request for the
// primary, a keyed and an unkeyed one every 3 s, is answered whole by the
// fallback; once its circuit is open the primary sees at most its probe,
// one call per -breaker-open-max, never a retry; and after it recovers,
// requests are back on it within about a second (-breaker-open-max's
// default), although it recovers just after a failed probe.
func TestOutageAnsweredByFallback(t *testing.T) {
	t.Parallel()
	e := outageEnv(t)
	e.mock.SetModelFault("primary", "status=503") //nolint:errcheck // a valid spec
	const outage, step = 60 * time.Second, 3 * time.Second
	body := modelBody("primary")

	// Retries to a rate-limited model, as other tenants would make them.
	stop := make(chan struct{})
	var side sync.WaitGroup
	side.Add(1)
	go func() {
		defer side.Done()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			side.Add(1)
			go func() {
				defer side.Done()
				e.post("", modelBody("limited")) //nolint:errcheck // only its retries matter
			}()
		}
	}()
	defer func() {
		close(stop)
		side.Wait()
	}()

	start := time.Now()
	var fbAnswers int64
	var opened time.Time
	var callsAtOpen int64
	var mu sync.Mutex
	var failures []string
	ticks := 0
	for at := time.Duration(0); at <= outage; at += step {
		time.Sleep(time.Until(start.Add(at)))
		ticks++
		var wg sync.WaitGroup
		for _, key := range []string{newKey("outage"), ""} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := e.post(key, body)
				mu.Lock()
				defer mu.Unlock()
				switch why := wholeBy(r, "fb"); {
				case err != nil:
					failures = append(failures, fmt.Sprintf("at %v (key %q): %v", at, key, err))
				case why != "":
					failures = append(failures, fmt.Sprintf("at %v (key %q): %s", at, key, why))
				default:
					fbAnswers++
				}
			}()
		}
		wg.Wait()
		if opened.IsZero() && e.proxy.ups[0].breaker.modelState("primary") != circuitClosed {
			opened, callsAtOpen = time.Now(), e.mock.CallsFor("primary")
		}
	}
	// The last tick's probe failed just now: the primary recovers at the
	// worst moment for the circuit, a whole -breaker-open-max before its
	// next probe.
	e.mock.SetModelFault("primary", "") //nolint:errcheck // clears it
	recovered := time.Now()
	primaryDuring := e.mock.CallsFor("primary")
	for _, f := range failures {
		t.Error(f)
	}
	if opened.IsZero() {
		t.Fatal("the primary's circuit never opened")
	}
	// Each tick after the opening probes the primary at most once (its
	// -breaker-open-max is 1s, a tick 3s): no retries, and one of each
	// tick's two requests goes to the fallback with no call at all.
	if probes, limit := primaryDuring-callsAtOpen, int64(ticks); probes > limit {
		t.Errorf("primary calls while its circuit was open: got %d; want at most %d (one probe a tick)", probes, limit)
	}
	if got := e.mock.CallsFor("fb"); got != fbAnswers {
		t.Errorf("fallback calls: got %d; want %d, one per answer", got, fbAnswers)
	}

	var backOn time.Duration = -1
	for time.Since(recovered) < 5*time.Second {
		sent := time.Since(recovered) // not when answered: the machine's load would add to it
		r, err := e.post(newKey("recovered"), body)
		if err != nil {
			t.Fatal(err)
		}
		if wholeBy(r, "primary") == "" {
			backOn = sent
			break
		}
		if why := wholeBy(r, "fb"); why != "" {
			t.Fatalf("after the recovery: %s", why)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if backOn < 0 || backOn > 1500*time.Millisecond {
		t.Fatalf("the first request served by the primary was sent %v after its recovery; want within about a second", backOn)
	}
	t.Logf("%d requests over the outage; primary calls %d (%d before its circuit opened); back on the primary %v after its recovery",
		2*ticks, primaryDuring, callsAtOpen, backOn)
}

// TestFallbackPastSpentBudget: with the retry budget spent, a request
// whose model fails is not retried, and goes on to its fallback, which
// answers: the budget bounds repeats to a failing model, never a first
// call to another.
func TestFallbackPastSpentBudget(t *testing.T) {
	t.Parallel()
	e := outageEnv(t)
	e.mock.SetModelFault("primary", "status=503") //nolint:errcheck // a valid spec
	// Spent with a margin: the request itself adds a tenth of a retry.
	e.proxy.budget.request(time.Now())
	for e.proxy.budget.retry(time.Now()) {
	}
	r, err := e.post(newKey("spent"), modelBody("primary"))
	if err != nil {
		t.Fatal(err)
	}
	if why := wholeBy(r, "fb"); why != "" {
		t.Fatal(why)
	}
	wantModelCalls(t, e, "primary", 1)
	wantModelCalls(t, e, "fb", 1)
}

// TestFallbackPastOpenedCircuit: a 503 with Retry-After that opens the
// model's circuit sends the request on to its fallback at once, rather
// than after the wait to probe the primary again.
func TestFallbackPastOpenedCircuit(t *testing.T) {
	t.Parallel()
	ms := newModelServer(t, func(model string, _ int64, w http.ResponseWriter) {
		if model == "primary" {
			w.Header().Set("Retry-After", "1")
			unavailable(w)
			return
		}
		okStream(w)
	})
	e := retryEnv(t, []string{ms.url}, func(pc *Config) {
		pc.Fallbacks = map[string][]string{"primary": {"fb"}}
		pc.Retry.BreakerFailures = 1
	})
	start := time.Now()
	r, err := e.post(newKey("opened"), chatFor("primary"))
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if !clean(r) {
		t.Fatalf("got %d ending %q; want a whole stream", r.status, r.lastData())
	}
	if got := ms.callsFor("primary"); got != 1 {
		t.Errorf("primary calls: got %d; want 1, the one that opened its circuit", got)
	}
	if got := ms.callsFor("fb"); got != 1 {
		t.Errorf("fallback calls: got %d; want 1", got)
	}
	if took >= time.Second {
		t.Errorf("answered in %v; want the fallback's answer without the primary's Retry-After", took)
	}
}
