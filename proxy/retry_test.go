package proxy

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
)

// then answers with first for call 1 (or up to call k) and ok afterwards.
func then(k int64, first func(int64, http.ResponseWriter, *http.Request)) func(int64, http.ResponseWriter, *http.Request) {
	return func(n int64, w http.ResponseWriter, r *http.Request) {
		if n <= k {
			first(n, w, r)
			return
		}
		okStream(w)
	}
}

// reset cuts the connection abruptly, after n stream events (0: right
// after the head).
func reset(events int) func(int64, http.ResponseWriter, *http.Request) {
	return func(_ int64, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for i := range events {
			fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"},\"finish_reason\":null}]}\n\n", i)
		}
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		conn.(*net.TCPConn).SetLinger(0)
		conn.Close()
	}
}

// hang reads the request and answers nothing (for at most 5 s).
func hang(_ int64, _ http.ResponseWriter, r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-time.After(5 * time.Second):
	}
}

// TestRetries holds each upstream outcome to the rules of docs/design.md, Retries,
// counting upstream calls and checking the client's answer and the key's
// state.
func TestRetries(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		script   func(int64, http.ResponseWriter, *http.Request)
		keyed    bool
		calls    int64
		status   int
		aborted  bool
		state    cache.State
		attempts int
		minTime  time.Duration
	}{
		{"429 with Retry-After", then(1, func(_ int64, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(429)
		}), true, 2, 200, false, cache.StateCommitted, 2, 900 * time.Millisecond},
		{"503 then success", then(1, status(503)), true, 2, 200, false, cache.StateCommitted, 2, 0},
		{"always 503", status(503), true, 3, 503, false, cache.StateFailedRetryable, 3, 0},
		{"400 is terminal", status(400), true, 1, 400, false, cache.StateFailedTerminal, 1, 0},
		{"hang after reading, keyed: not retried", hang, true, 1, 504, false, cache.StateCommitUnknown, 1, 0},
		{"hang after reading, no key: not retried", hang, false, 1, 504, false, "", 0, 0},
		{"reset after the head, before the first event: not retried", then(1, reset(0)), true, 1, 502, false, cache.StateCommitUnknown, 1, 0},
		{"reset after the first event: aborted", reset(2), true, 1, 200, true, cache.StateFailedRetryable, 1, 0},
		{"503 then success, no key", then(1, status(503)), false, 2, 200, false, "", 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fs := newFaultServer(t, c.script)
			e := retryEnv(t, []string{fs.url}, func(pc *Config) {
				if c.status == 504 {
					shortBudgets(pc)
				}
			})
			key := ""
			if c.keyed {
				key = newKey("retry")
			}
			start := time.Now()
			got := e.fetch(req{key: key})
			took := time.Since(start)
			wantCount(t, "upstream calls", fs.calls.Load(), c.calls)
			if got.status != c.status || got.aborted != c.aborted {
				t.Fatalf("client: got %d aborted %v (%q); want %d aborted %v", got.status, got.aborted, got.raw, c.status, c.aborted)
			}
			if c.status == 200 && !c.aborted && got.lastData() != "[DONE]" {
				t.Fatalf("client: last event %q; want [DONE]", got.lastData())
			}
			if took < c.minTime {
				t.Fatalf("answered after %v; want at least %v (Retry-After)", took, c.minTime)
			}
			if took > 5*time.Second {
				t.Fatalf("answered after %v; retries must be bounded in time", took)
			}
			if c.keyed {
				ki := e.waitState(key, "", c.state)
				if ki.Attempts != c.attempts {
					t.Fatalf("attempts: got %d; want %d", ki.Attempts, c.attempts)
				}
			}
		})
	}
}

// TestConnectionRefused: nothing listens; every attempt is a connect
// error, retried up to the bound, and the client gets 502.
func TestConnectionRefused(t *testing.T) {
	t.Parallel()
	addr, _ := refusedAddr(t)
	e := retryEnv(t, []string{"http://" + addr}, nil)
	key := newKey("refused")
	got := e.fetch(req{key: key})
	if got.status != 502 || got.errType != "upstream_error" {
		t.Fatalf("got %d %q; want 502 upstream_error", got.status, got.errType)
	}
	ki := e.waitState(key, "", cache.StateFailedRetryable)
	if ki.Attempts != 3 {
		t.Fatalf("attempts: got %d; want 3", ki.Attempts)
	}
}

// TestRetryBudget: 200 requests against an always-503 upstream cause at
// most 200 × 1.1 + the floor upstream calls with the budget (the floor
// once for each ten seconds the requests took: the budget's window
// slides), where without it they cause 200 × attempts.
func TestRetryBudget(t *testing.T) {
	t.Parallel()
	const requests, attempts, floor = 200, 3, 10
	run := func(ratio float64, min int) (calls int64, took time.Duration) {
		fs := newFaultServer(t, status(503))
		e := retryEnv(t, []string{fs.url}, func(pc *Config) {
			pc.Retry.Attempts = attempts
			pc.Retry.BudgetRatio = ratio
			pc.Retry.BudgetMin = min
			pc.Retry.BreakerFailures = 1 << 30 // this test is about the budget alone
		})
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		start := time.Now()
		for i := range requests {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				got := e.fetch(req{key: newKey(fmt.Sprint("budget", i))})
				if got.status != 503 {
					t.Errorf("got %d; want the upstream's 503", got.status)
				}
			}()
		}
		wg.Wait()
		return fs.calls.Load(), time.Since(start)
	}
	with, took := run(0.1, floor)
	without, _ := run(1e9, 1<<30)
	t.Logf("upstream calls for %d requests against an always-503 upstream: %d with the budget (in %v), %d without", requests, with, took.Round(time.Millisecond), without)
	// The window is ten one-second buckets: requests that took up to 9 s
	// lie in one window, and each further ten seconds (a loaded machine's)
	// is a window with a floor of its own.
	windows := 1 + int64(took/(10*time.Second))
	if took%(10*time.Second) > 9*time.Second {
		windows++
	}
	if limit := int64(requests*1.1) + floor*windows; with > limit {
		t.Fatalf("with the budget: got %d calls in %v; want at most %d", with, took.Round(time.Millisecond), limit)
	}
	if without != requests*attempts {
		t.Fatalf("without the budget: got %d calls; want %d", without, requests*attempts)
	}
}

// hangUp reads the request and closes the connection without a byte of
// answer: the upstream may have started the generation.
func hangUp(_ int64, w http.ResponseWriter, _ *http.Request) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	conn.Close()
}

// garbage answers 200 text/event-stream with a body that holds no event.
func garbage(_ int64, w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(w, "<html>upstream proxy error page</html>")
}

// htmlPage answers 200 with an HTML page, as a misconfigured proxy in
// front of the provider might.
func htmlPage(_ int64, w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html")
	fmt.Fprint(w, "<html><title>Service Unavailable</title></html>")
}

// TestAmbiguousNotRetried: a request that reached the upstream is not
// sent again unless the upstream said it did not run it, key or not,
// because the providers' chat endpoints do not deduplicate on the key and
// a repeat may be a second paid generation. The client learns that the
// outcome is unknown. -retry-ambiguous, for an upstream that does
// deduplicate, repeats it.
func TestAmbiguousNotRetried(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		script  func(int64, http.ResponseWriter, *http.Request)
		dedupe  bool // the upstream is named by -retry-ambiguous
		calls   int64
		status  int
		errType string
		state   cache.State
	}{
		{"read the request and hung up", hangUp, false, 1, 502, "upstream_error", cache.StateCommitUnknown},
		{"no answer in time", hang, false, 1, 504, "upstream_timeout", cache.StateCommitUnknown},
		{"200 that is not an event stream", garbage, false, 1, 502, "upstream_error", cache.StateFailedRetryable},
		{"200 HTML to a streaming request", htmlPage, false, 1, 502, "upstream_error", cache.StateFailedRetryable},
		{"reset after the head", reset(0), false, 1, 502, "upstream_error", cache.StateCommitUnknown},
		{"read and hung up, -retry-ambiguous", then(2, hangUp), true, 3, 200, "", cache.StateCommitted},
		{"no answer in time, -retry-ambiguous", hang, true, 3, 504, "upstream_timeout", cache.StateCommitUnknown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fs := newFaultServer(t, c.script)
			e := retryEnv(t, []string{fs.url}, func(pc *Config) {
				if c.errType == "upstream_timeout" {
					shortBudgets(pc)
				}
				if c.dedupe {
					pc.RetryAmbiguous = []string{fs.url}
				}
			})
			key := newKey("ambiguous")
			got := e.fetch(req{key: key})
			wantCount(t, "upstream calls", fs.calls.Load(), c.calls)
			if got.status != c.status || got.errType != c.errType {
				t.Fatalf("client: got %d %q (%s); want %d %q", got.status, got.errType, got.raw, c.status, c.errType)
			}
			if c.status != 200 && !strings.Contains(string(got.raw), "outcome is unknown") {
				t.Fatalf("client: got %s; want a message that says the outcome is unknown", got.raw)
			}
			e.waitState(key, "", c.state)
			// Without a key, never repeated, whatever the upstream.
			if c.dedupe {
				fs.calls.Store(0)
				fs.set(c.script)
				e.fetch(req{})
				if n := fs.calls.Load(); n != 1 {
					t.Fatalf("unkeyed: got %d upstream calls; want 1", n)
				}
			}
		})
	}
}

// TestAmbiguousRetryStaysOnItsUpstream: with -retry-ambiguous, the repeat
// of a call that may be running goes to the same upstream (the only one
// that can tell it apart), never fails over to another.
func TestAmbiguousRetryStaysOnItsUpstream(t *testing.T) {
	t.Parallel()
	first := newFaultServer(t, hangUp)
	second := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { okStream(w) })
	e := retryEnv(t, []string{first.url, second.url}, func(pc *Config) { pc.RetryAmbiguous = []string{"*"} })
	got := e.fetch(req{key: newKey("pinned")})
	if got.status != http.StatusBadGateway {
		t.Fatalf("got %d; want 502 after the first upstream's attempts", got.status)
	}
	wantCount(t, "first upstream calls", first.calls.Load(), 3)
	wantCount(t, "second upstream calls", second.calls.Load(), 0)
}
