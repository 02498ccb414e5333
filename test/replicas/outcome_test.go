package replicas_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/poll"
	"github.com/ssegate/ssegate/internal/redistest"
)

// answer is a whole answer to a request with a body of the test's own.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// postBody sends body with key to g and reads the whole answer.
func postBody(t *testing.T, g *gatetest.Process, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, g.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer replicas-test")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", key, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

// TestRedisPausedWhileHeadAwaited: Redis stops answering for a lease while
// the upstream has the request and no head came yet. The owner fences its
// generation; its client gets the outcome-unknown answer (502 with
// Ssegate-Outcome: unknown), never a 503 with Retry-After that would have
// it send the request again. One upstream call.
func TestRedisPausedWhileHeadAwaited(t *testing.T) {
	srv := redistest.Start(t)
	// The mock holds the request far longer than the test waits: a hang-up
	// of its own would give the same outcome-unknown answer, with Redis
	// having nothing to do with it.
	e := newEnv(t, srv, mockllm.Config{HangLimit: 30 * time.Second})
	if err := e.mock.SetModelFault("gpt-4o-mini", "hang"); err != nil {
		t.Fatal(err)
	}
	a := e.start("A", "-head-timeout", "10s")
	got := make(chan answer, 1)
	go func() { got <- postBody(t, a, "paused-head", body) }()
	poll.For(t, 5*time.Second, "the upstream call", func() bool { return e.mock.Calls() == 1 })
	srv.Pause()
	defer srv.Resume()
	// Renewals fail for a lease (400 ms, each within -redis-timeout): the
	// owner fences its generation then, long before -head-timeout.
	var r answer
	select {
	case r = <-got:
	case <-time.After(4 * time.Second):
		t.Fatal("no answer 4 s after Redis paused: the wait for the head did not end with the lease")
	}
	srv.Resume()
	if r.status != http.StatusBadGateway || r.header.Get("Ssegate-Outcome") != "unknown" || r.header.Get("Retry-After") != "" {
		t.Fatalf("client: got %d Ssegate-Outcome %q Retry-After %q (%s); want 502 with Ssegate-Outcome: unknown, no Retry-After",
			r.status, r.header.Get("Ssegate-Outcome"), r.header.Get("Retry-After"), r.body)
	}
	if n := e.mock.Calls(); n != 1 {
		t.Fatalf("upstream calls: got %d; want 1", n)
	}
}

// TestRedisKilledWhileHeadAwaited: Redis is killed (SIGKILL, not paused:
// every renewal now fails at once with a refused connection instead of
// timing out) while the upstream has a keyed request and no head came yet.
// The owner fences its generation after a lease without a renewal; its
// client gets the outcome-unknown answer (502, Ssegate-Outcome: unknown)
// long before -head-timeout, never a 503 or a Retry-After: the call went
// out, and a repeat may be a second paid generation. One upstream call.
// While Redis is down a repeat of the key is refused with 503 before any
// call; once Redis is back (empty: no persistence) the replica serves new
// keys without a restart, and leaks nothing.
func TestRedisKilledWhileHeadAwaited(t *testing.T) {
	srv := redistest.Start(t)
	// The mock holds the request far longer than the test waits, as in
	// TestRedisPausedWhileHeadAwaited.
	e := newEnv(t, srv, mockllm.Config{HangLimit: 30 * time.Second})
	a := e.start("A", "-head-timeout", "10s")
	if r := postBody(t, a, "killed-warm-up", body); r.status != http.StatusOK || !strings.HasSuffix(strings.TrimSpace(string(r.body)), "data: [DONE]") {
		t.Fatalf("before the kill: got %d (%s); want a whole stream", r.status, r.body)
	}
	baseG, baseFD := settled(t, a)
	calls := e.mock.Calls()
	if err := e.mock.SetModelFault("gpt-4o-mini", "hang"); err != nil {
		t.Fatal(err)
	}
	const key = "killed-head"
	got := make(chan answer, 1)
	go func() { got <- postBody(t, a, key, body) }()
	poll.For(t, 5*time.Second, "the upstream call", func() bool { return e.mock.Calls() == calls+1 })
	srv.Stop()
	killed := time.Now()
	// Renewals fail from the kill on: the owner fences its generation a
	// lease (400 ms) after its last renewal, long before -head-timeout.
	var r answer
	select {
	case r = <-got:
	case <-time.After(4 * time.Second):
		t.Fatal("no answer 4 s after Redis was killed: the wait for the head did not end with the lease")
	}
	t.Logf("answered %v after the kill", time.Since(killed).Round(time.Millisecond))
	if r.status != http.StatusBadGateway || r.header.Get("Ssegate-Outcome") != "unknown" || r.header.Get("Retry-After") != "" {
		t.Fatalf("client: got %d Ssegate-Outcome %q Retry-After %q (%s); want 502 with Ssegate-Outcome: unknown, no Retry-After",
			r.status, r.header.Get("Ssegate-Outcome"), r.header.Get("Retry-After"), r.body)
	}
	if n := e.mock.Calls() - calls; n != 1 {
		t.Fatalf("upstream calls: got %d; want 1", n)
	}
	// Redis still down: a repeat of the key cannot be decided, and is
	// refused before any call (docs/redis.md, Failure cases: Redis down at
	// a claim), with the 503 that says "retry".
	if r := postBody(t, a, key, body); r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || r.header.Get("Ssegate-Outcome") != "" {
		t.Fatalf("a repeat while Redis is down: got %d Retry-After %q Ssegate-Outcome %q (%s); want 503 store_unavailable with Retry-After",
			r.status, r.header.Get("Retry-After"), r.header.Get("Ssegate-Outcome"), r.body)
	}
	if n := e.mock.Calls() - calls; n != 1 {
		t.Fatalf("upstream calls after a repeat while Redis is down: got %d; want 1", n)
	}
	srv.Restart()
	if err := e.mock.SetModelFault("gpt-4o-mini", ""); err != nil {
		t.Fatal(err)
	}
	// Redis back, empty: the replica serves a new key without a restart.
	// Attempts refused while it reconnects make no upstream call.
	poll.For(t, 10*time.Second, "a new key once Redis is back", func() bool {
		r := postBody(t, a, "killed-after", body)
		return r.status == http.StatusOK && strings.HasSuffix(strings.TrimSpace(string(r.body)), "data: [DONE]")
	})
	if n := e.mock.Calls() - calls; n != 2 {
		t.Fatalf("upstream calls after a new key: got %d; want 2", n)
	}
	// The same key again: the restarted Redis forgot it, and docs/redis.md
	// (Failure cases, "Redis restart without persistence": "every key is
	// forgotten ... duplicates run again") says a Redis that lost its data
	// loses the dedupe: a new generation, a second upstream call for the
	// key, is the contract. It is whole, and kept: a repeat replays it.
	if r := postBody(t, a, key, body); r.status != http.StatusOK || r.header.Get("Idempotent-Replayed") != "" || !strings.HasSuffix(strings.TrimSpace(string(r.body)), "data: [DONE]") {
		t.Fatalf("the key again once Redis is back: got %d Idempotent-Replayed %q (%s); want a new, whole stream", r.status, r.header.Get("Idempotent-Replayed"), r.body)
	}
	if n := e.mock.Calls() - calls; n != 3 {
		t.Fatalf("upstream calls after the key again: got %d; want 3", n)
	}
	if r := postBody(t, a, key, body); r.status != http.StatusOK || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the key a third time: got %d Idempotent-Replayed %q; want its replay", r.status, r.header.Get("Idempotent-Replayed"))
	}
	if n := e.mock.Calls() - calls; n != 3 {
		t.Fatalf("upstream calls after a replay: got %d; want 3", n)
	}
	// Nothing of the outage lives on: goroutines and open files come back
	// to within leakSlack of what they were before it (the fenced
	// generation's call, still awaiting its head until -head-timeout, holds
	// one of each meanwhile), the process runs, and it never panicked.
	poll.For(t, 15*time.Second, "goroutines and open files as before the kill", func() bool {
		n, fd := gauges(t, a)
		return n <= baseG+leakSlack && fd <= baseFD+leakSlack
	})
	if exited, err := a.Wait(0); exited {
		t.Fatalf("A exited: %v", err)
	}
	if strings.Contains(a.Logs(), "panic:") {
		t.Fatal("A panicked")
	}
	e.atMostOneCommit()
}

// leakSlack is how many goroutines, or open files, more than before an
// outage a replica may hold after it: its pools may grow by a few.
const leakSlack = 3

// gauges reads g's go_goroutines and process_open_fds.
func gauges(t *testing.T, g *gatetest.Process) (goroutines, fds float64) {
	t.Helper()
	resp, err := client.Get(g.URL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	found := 0
	for line := range strings.Lines(string(b)) {
		name, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		var dst *float64
		switch name {
		case "go_goroutines":
			dst = &goroutines
		case "process_open_fds":
			dst = &fds
		default:
			continue
		}
		if _, err := fmt.Sscan(v, dst); err != nil {
			t.Fatalf("/metrics: %q: %v", line, err)
		}
		found++
	}
	if found != 2 {
		t.Fatal("/metrics has no go_goroutines or process_open_fds")
	}
	return goroutines, fds
}

// settled returns g's goroutines and open files once they stopped moving
// (idle workers end after their idle time): once two looks at them a
// second apart find the same numbers. A look is a scrape, which has a
// connection and goroutines of its own, so they are not looked at more
// often.
func settled(t *testing.T, g *gatetest.Process) (goroutines, fds float64) {
	t.Helper()
	lg, lfd := gauges(t, g)
	last := time.Now()
	poll.For(t, 15*time.Second, "goroutines and open files settle", func() bool {
		if time.Since(last) < time.Second {
			return false
		}
		n, fd := gauges(t, g)
		same := n == lg && fd == lfd
		lg, lfd, last = n, fd, time.Now()
		return same
	})
	return lg, lfd
}

// TestCommitRefusedAnswerKept: Redis stops answering while an answer is
// generated, for less than a lease, so that the answer comes whole and its
// commit is what fails. The client that caused it gets it: a non-streaming
// body whole, with Ssegate-Stored: false; a stream with its own clean end,
// no stream_aborted. One upstream call each.
func TestCommitRefusedAnswerKept(t *testing.T) {
	srv := redistest.Start(t)
	// 20 events of 40 ms: the answer comes about 0.8 s after the call,
	// within the 3 s lease, so the generation is not fenced before it.
	e := newEnv(t, srv, mockllm.Config{Tokens: 20, Delay: 40 * time.Millisecond})
	a := e.start("A", "-redis-lease", "3s", "-redis-timeout", "200ms")
	cases := []struct {
		name, body string
		check      func(t *testing.T, r answer)
	}{
		{"not streaming", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`, func(t *testing.T, r answer) {
			var v struct {
				Choices []struct {
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
			}
			if r.status != http.StatusOK || r.header.Get("Ssegate-Stored") != "false" || json.Unmarshal(r.body, &v) != nil || len(v.Choices) != 1 || v.Choices[0].FinishReason != "stop" {
				t.Fatalf("client: got %d Ssegate-Stored %q (%s); want the whole 200 answer with Ssegate-Stored: false", r.status, r.header.Get("Ssegate-Stored"), r.body)
			}
		}},
		{"stream", body, func(t *testing.T, r answer) {
			if r.status != http.StatusOK || strings.Contains(string(r.body), "stream_aborted") || !strings.HasSuffix(strings.TrimSpace(string(r.body)), "data: [DONE]") {
				t.Fatalf("client: got %d (%s); want the whole stream, ended by [DONE], no stream_aborted", r.status, r.body)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := e.mock.Calls()
			got := make(chan answer, 1)
			go func() { got <- postBody(t, a, "refused-"+strings.ReplaceAll(c.name, " ", "-"), c.body) }()
			poll.For(t, 5*time.Second, "the upstream call", func() bool {
				select {
				case r := <-got:
					t.Fatalf("answered %d before the upstream was called: %s", r.status, r.body)
				default:
				}
				return e.mock.Calls() >= base+1
			})
			srv.Pause()
			var r answer
			select {
			case r = <-got:
			case <-time.After(10 * time.Second):
				srv.Resume()
				t.Fatal("no answer 10 s after Redis paused")
			}
			srv.Resume()
			c.check(t, r)
			if n := e.mock.Calls() - base; n != 1 {
				t.Fatalf("upstream calls: got %d; want 1", n)
			}
			// Redis again: the replica serves the next key (the lease of
			// the one before has lapsed by now).
			poll.For(t, 10*time.Second, "service after the pause", func() bool {
				s, err := tryOpen(http.MethodPost, a.URL+"/v1/chat/completions", "after-"+strings.ReplaceAll(c.name, " ", "-"), "")
				if err != nil {
					return false
				}
				s.readAll()
				return s.status == 200
			})
		})
	}
}
