package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/redis"
)

// unknownAnswer fails the test unless got is the outcome-unknown answer:
// status, the marker, no Retry-After.
func unknownAnswer(t *testing.T, who string, got result, status int) {
	t.Helper()
	if got.status != status || got.header.Get(outcomeHeader) != "unknown" || got.header.Get("Retry-After") != "" {
		t.Fatalf("%s: got %d %s: %q, Retry-After %q (%s); want %d with %s: unknown and no Retry-After",
			who, got.status, outcomeHeader, got.header.Get(outcomeHeader), got.header.Get("Retry-After"), got.raw, status, outcomeHeader)
	}
}

// settle lets a wrong retry or fallback happen before calls are counted:
// the backoffs of these proxies are milliseconds long.
func settle() { time.Sleep(200 * time.Millisecond) }

// TestChainOutcomeUnknown: two ssegates in a chain, the outer one with
// -retry-ambiguous naming the inner one and a -fallback for the model,
// in front of an upstream that takes the request and then fails (a reset
// after reading it, or no answer within the inner one's budget). The
// inner one answers its outcome-unknown 502 or 504 with the marker; the
// outer one neither repeats nor falls back: one upstream call, and the
// client gets the outer one's outcome-unknown answer, both keys
// commit_unknown.
func TestChainOutcomeUnknown(t *testing.T) {
	t.Parallel()
	plain := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	cases := []struct {
		name   string
		script func(*rawUpstream, net.Conn)
		body   string
		status int
		inner  cache.State // the inner one's key
	}{
		{"reset after reading, stream", hangUpRaw, chatBody, 502, cache.StateCommitUnknown},
		{"reset after reading, not streaming", hangUpRaw, plain, 502, cache.StateCommitUnknown},
		{"no answer in time, stream", stallRaw, chatBody, 504, cache.StateCommitUnknown},
		{"no answer in time, not streaming", stallRaw, plain, 504, cache.StateCommitUnknown},
		// The inner one's key is free (an answer came, not a stream),
		// but the upstream may have run the request: marked all the same.
		{"200 that is not an event stream", answerRaw("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 20\r\n\r\n<html>error</html>\r\n"), chatBody, 502, cache.StateFailedRetryable},
		// The inner one sends its head, then stream_aborted as its first
		// event: the outer one neither takes it for the provider's "not
		// run" error event nor repeats it.
		{"malformed first event", answerRaw(withLength("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n", "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tru\n\n")), chatBody, 502, cache.StateFailedRetryable},
		{"not streaming, body cut where the connection closed", answerRaw("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"id\":\"chatcmpl-1\",\"choi"), plain, 502, cache.StateFailedRetryable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			up := newRawUpstream(t, c.script)
			fallback := map[string][]string{"gpt-4o-mini": {"gpt-4o"}}
			inner := retryEnv(t, []string{up.url}, func(pc *Config) {
				shortBudgets(pc)
				pc.Fallbacks = fallback
			})
			outer := retryEnv(t, []string{inner.url}, func(pc *Config) {
				pc.RetryAmbiguous = []string{inner.url}
				pc.Fallbacks = fallback
			})
			key := newKey("chain")
			got := outer.fetch(req{key: key, body: c.body})
			settle()
			wantCount(t, "upstream calls", up.calls.Load(), 1)
			unknownAnswer(t, "client of the outer ssegate", got, c.status)
			outer.waitState(key, "", cache.StateCommitUnknown)
			inner.waitState(key, "", c.inner)
		})
	}
}

// withLength is an HTTP answer of head (the status line and headers, each
// ending in CRLF) and body, framed by a Content-Length.
func withLength(head, body string) string {
	return fmt.Sprintf("%sContent-Length: %d\r\n\r\n%s", head, len(body), body)
}

// hangUpRaw reads the request and closes the connection.
func hangUpRaw(_ *rawUpstream, c net.Conn) { readRequest(c) }

// stallRaw reads the request and answers nothing until the test ends.
func stallRaw(u *rawUpstream, c net.Conn) {
	readRequest(c)
	u.stall()
}

// TestAmbiguousUpstreamAnswers: an upstream's answer that says the
// request may have run is never repeated nor fallen back from: a 504 (a
// balancer that timed out waiting for its backend, after reading the
// request), and any answer carrying the outcome-unknown marker. The
// client gets the answer with the marker, and the key is commit_unknown.
// -retry-ambiguous repeats the 504 to an upstream that deduplicates, but
// never a marked answer; -ambiguous-status none makes 504 safe again.
func TestAmbiguousUpstreamAnswers(t *testing.T) {
	t.Parallel()
	marked := func(code int) func(int64, http.ResponseWriter, *http.Request) {
		return func(_ int64, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set(outcomeHeader, "unknown")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprint(w, `{"error":{"type":"upstream_error","message":"its outcome is unknown"}}`)
		}
	}
	plain := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	cases := []struct {
		name    string
		script  func(int64, http.ResponseWriter, *http.Request)
		body    string
		keyed   bool
		tune    func(pc *Config, url string)
		calls   int64
		status  int
		unknown bool
	}{
		{"balancer 504, stream", status(504), chatBody, true, nil, 1, 504, true},
		{"balancer 504, not streaming", status(504), plain, true, nil, 1, 504, true},
		{"balancer 504, no key", status(504), chatBody, false, nil, 1, 504, true},
		{"marked 502", marked(502), chatBody, true, nil, 1, 502, true},
		{"marked 503", marked(503), chatBody, true, nil, 1, 503, true},
		{"marked 502, no key", marked(502), plain, false, nil, 1, 502, true},
		{"marked 502, -retry-ambiguous", marked(502), chatBody, true, func(pc *Config, url string) { pc.RetryAmbiguous = []string{url} }, 1, 502, true},
		{"balancer 504, -retry-ambiguous", status(504), chatBody, true, func(pc *Config, url string) {
			pc.RetryAmbiguous = []string{url}
			pc.Fallbacks = nil
		}, 3, 504, true},
		{"balancer 504, -ambiguous-status none", status(504), chatBody, true, func(pc *Config, _ string) {
			pc.AmbiguousStatus = []int{}
			pc.Fallbacks = nil
		}, 3, 504, false},
		{"balancer 502 named by -ambiguous-status", status(502), chatBody, true, func(pc *Config, _ string) { pc.AmbiguousStatus = []int{502, 504} }, 1, 502, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fs := newFaultServer(t, c.script)
			e := retryEnv(t, []string{fs.url}, func(pc *Config) {
				pc.Fallbacks = map[string][]string{"gpt-4o-mini": {"gpt-4o"}}
				if c.tune != nil {
					c.tune(pc, fs.url)
				}
			})
			key := ""
			if c.keyed {
				key = newKey("ambiguous-answer")
			}
			got := e.fetch(req{key: key, body: c.body})
			settle()
			wantCount(t, "upstream calls", fs.calls.Load(), c.calls)
			if got.status != c.status || (got.header.Get(outcomeHeader) == "unknown") != c.unknown {
				t.Fatalf("client: got %d %s %q (%s); want %d, marked %v", got.status, outcomeHeader, got.header.Get(outcomeHeader), got.raw, c.status, c.unknown)
			}
			if c.unknown && got.header.Get("Retry-After") != "" {
				t.Fatalf("client: Retry-After %q on an answer whose outcome is unknown", got.header.Get("Retry-After"))
			}
			if !strings.Contains(string(got.raw), `"error"`) {
				t.Fatalf("client: got %s; want the upstream's own error body", got.raw)
			}
			if c.keyed {
				want := cache.StateFailedRetryable
				if c.unknown {
					want = cache.StateCommitUnknown
				}
				e.waitState(key, "", want)
			}
		})
	}
}

// TestUpstreamMarkersNotKept: a whole 2xx answer from an ssegate behind
// that could not keep it (Ssegate-Stored: false, Ssegate-Outcome: unknown)
// is stored here, and neither its first client nor its replays carry the
// other one's markers: they spoke of the other one's key.
func TestUpstreamMarkersNotKept(t *testing.T) {
	t.Parallel()
	fs := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set(outcomeHeader, "unknown")
		w.Header().Set(storedHeader, "false")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, plainJSON) //nolint:errcheck
	})
	e := retryEnv(t, []string{fs.url}, nil)
	key := newKey("markers")
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	for i, who := range []string{"first client", "replay"} {
		got := e.fetch(req{key: key, body: body})
		if got.status != 200 || string(got.raw) != plainJSON || got.header.Get(outcomeHeader) != "" || got.header.Get(storedHeader) != "" || got.replayed != (i == 1) {
			t.Fatalf("%s: got %d %s %q %s %q replayed %v (%s); want the 200 answer without the upstream's markers",
				who, got.status, outcomeHeader, got.header.Get(outcomeHeader), storedHeader, got.header.Get(storedHeader), got.replayed, got.raw)
		}
	}
	e.waitState(key, "", cache.StateCommitted)
	wantCount(t, "upstream calls", fs.calls.Load(), 1)
}

// fetchAwaitingHead sends a keyed request through a proxy on up (tuned
// by tune, if not nil) and returns once up has read it and awaits its
// head: the proxy, the key, and where the client's result comes.
func fetchAwaitingHead(t *testing.T, up *rawUpstream, name, body string, tune func(*Config)) (*env, string, chan result) {
	t.Helper()
	e := retryEnv(t, []string{up.url}, tune)
	key := newKey(name)
	done := make(chan result, 1)
	go func() { done <- e.fetch(req{key: key, body: body}) }()
	waitFor(t, func() bool { return up.calls.Load() == 1 && e.proxy.liveCount() == 1 })
	time.Sleep(50 * time.Millisecond) // the request is read by now
	return e, key, done
}

// headRead reports whether a generation of p has its upstream's answer
// head, and reads its body.
func headRead(p *Proxy) bool {
	p.liveMu.Lock()
	defer p.liveMu.Unlock()
	for g := range p.live {
		g.mu.Lock()
		read := g.resp != nil
		g.mu.Unlock()
		if read {
			return true
		}
	}
	return false
}

// TestNoRetryAfterTheCall: once the request was written upstream, no
// answer is a 503 or carries Retry-After, whatever ended it: it is the
// outcome-unknown answer, and the key ends commit_unknown.
func TestNoRetryAfterTheCall(t *testing.T) {
	t.Parallel()
	t.Run("shutdown while the head is awaited", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		up := newRawUpstream(t, func(u *rawUpstream, c net.Conn) {
			readRequest(c)
			if !u.await(release) {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n") //nolint:errcheck
			u.stall()
		})
		e, key, done := fetchAwaitingHead(t, up, "shutdown", "", nil)
		e.proxy.Abort() // what Shutdown does once the drain's time is up
		close(release)
		got := <-done
		unknownAnswer(t, "client", got, 502)
		e.waitState(key, "", cache.StateCommitUnknown)
		wantCount(t, "upstream calls", up.calls.Load(), 1)
	})
	// A request that is not a stream's waits for its answer in its
	// handler (answerInHandler); a stream's connection is taken over at
	// once: the drain ends either the same way.
	for _, body := range []struct{ name, body string }{{"stream", chatBody}, {"not a stream", plainBody}} {
		t.Run("drain that ends while the head is awaited/"+body.name, func(t *testing.T) {
			t.Parallel()
			up := newRawUpstream(t, func(u *rawUpstream, c net.Conn) {
				readRequest(c)
				u.stall() // no head, ever
			})
			e, key, done := fetchAwaitingHead(t, up, "drain", body.body, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if err := e.proxy.Shutdown(ctx); err == nil {
				t.Error("Shutdown with a head still awaited past the drain: got nil; want the drain's error")
			}
			got := <-done
			unknownAnswer(t, "client", got, 502)
			e.waitState(key, "", cache.StateCommitUnknown)
			wantCount(t, "upstream calls", up.calls.Load(), 1)
		})
	}
	t.Run("drain that ends between the head and the first event", func(t *testing.T) {
		t.Parallel()
		up := newRawUpstream(t, func(u *rawUpstream, c net.Conn) {
			readRequest(c)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n") //nolint:errcheck
			// The upstream runs the request; no event comes.
			u.stall()
		})
		e := retryEnv(t, []string{up.url}, nil)
		key := newKey("drain-head")
		done := make(chan result, 1)
		go func() { done <- e.fetch(req{key: key}) }()
		waitFor(t, func() bool { return headRead(e.proxy) })
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if err := e.proxy.Shutdown(ctx); err == nil {
			t.Error("Shutdown with a stream that had no event past the drain: got nil; want the drain's error")
		}
		got := <-done
		unknownAnswer(t, "client", got, 502)
		e.waitState(key, "", cache.StateCommitUnknown)
		wantCount(t, "upstream calls", up.calls.Load(), 1)
	})
	t.Run("shutdown before the call", func(t *testing.T) {
		t.Parallel()
		fs := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) { okStream(w) })
		e := retryEnv(t, []string{fs.url}, nil)
		e.proxy.Abort()
		got := e.fetch(req{key: newKey("shutdown-before")})
		if got.status != 503 || got.errType != "shutting_down" || got.header.Get(outcomeHeader) != "" {
			t.Fatalf("client: got %d %q marker %q; want 503 shutting_down, unmarked: nothing was sent", got.status, got.errType, got.header.Get(outcomeHeader))
		}
		wantCount(t, "upstream calls", fs.calls.Load(), 0)
	})
	t.Run("ambiguous attempt, then an open circuit, -retry-ambiguous", func(t *testing.T) {
		t.Parallel()
		fs := newFaultServer(t, hangUp)
		e := retryEnv(t, []string{fs.url}, func(pc *Config) {
			pc.RetryAmbiguous = []string{fs.url}
			pc.Retry.BreakerFailures = 1
			pc.Retry.BreakerOpen = time.Minute
			pc.Retry.BreakerOpenMax = time.Minute
		})
		key := newKey("circuit")
		got := e.fetch(req{key: key})
		wantCount(t, "upstream calls", fs.calls.Load(), 1)
		unknownAnswer(t, "client", got, 502)
		e.waitState(key, "", cache.StateCommitUnknown)
		// A new key meets the open circuit before any call: 503 is right.
		got = e.fetch(req{key: newKey("circuit-after")})
		if got.status != 503 || got.header.Get(outcomeHeader) != "" {
			t.Fatalf("new key: got %d marker %q; want 503 upstream_unavailable, unmarked", got.status, got.header.Get(outcomeHeader))
		}
	})
	t.Run("max_streams refuses before any call", func(t *testing.T) {
		t.Parallel()
		up := newRawUpstream(t, stallRaw)
		e := retryEnv(t, []string{up.url}, func(pc *Config) { pc.MaxStreams = 1 })
		held, _ := http.NewRequest(http.MethodPost, e.url+"/v1/chat/completions", strings.NewReader(chatBody))
		held.Header.Set("Idempotency-Key", newKey("held"))
		go func() { // holds the one stream until the test ends
			if resp, err := e.client.Do(held); err == nil {
				io.Copy(io.Discard, resp.Body) //nolint:errcheck // only its end matters
				resp.Body.Close()
			}
		}()
		waitFor(t, func() bool { return up.calls.Load() == 1 })
		got := e.fetch(req{key: newKey("refused")})
		if got.status != 503 || got.errType != "capacity_exceeded" || got.header.Get("Retry-After") == "" || got.header.Get(outcomeHeader) != "" {
			t.Fatalf("client: got %d %q, Retry-After %q, marker %q; want 503 capacity_exceeded with Retry-After, unmarked: nothing was sent",
				got.status, got.errType, got.header.Get("Retry-After"), got.header.Get(outcomeHeader))
		}
		wantCount(t, "upstream calls", up.calls.Load(), 1)
	})
	t.Run("joiner of a flight whose outcome is unknown", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		up := newRawUpstream(t, func(u *rawUpstream, c net.Conn) {
			readRequest(c)
			u.await(release)
		})
		e := retryEnv(t, []string{up.url}, nil)
		key := newKey("joiner")
		first := make(chan result, 1)
		go func() { first <- e.fetch(req{key: key}) }()
		waitFor(t, func() bool { return up.calls.Load() == 1 })
		joined := make(chan result, 1)
		go func() { joined <- e.fetch(req{key: key}) }()
		waitFor(t, func() bool { return strings.Contains(e.scrape(), `ssegate_requests_total{decision="join"} 1`) })
		close(release)
		unknownAnswer(t, "first client", <-first, 502)
		unknownAnswer(t, "joiner", <-joined, 502)
		wantCount(t, "upstream calls", up.calls.Load(), 1)
	})
}

// TestPassiveStores: a client awaiting a head watches its flight only
// with a store that may end it itself: the Redis store may, the
// in-memory store never does.
func TestPassiveStores(t *testing.T) {
	t.Parallel()
	if _, ok := any((*redis.Store)(nil)).(passiveStore); ok {
		t.Error("the Redis store is a passiveStore; want one that ends flights (it fences them)")
	}
	if _, ok := any((*cache.Memory)(nil)).(passiveStore); !ok {
		t.Error("the in-memory store is not a passiveStore; want its clients spared the watch")
	}
}
