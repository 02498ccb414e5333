package replicas_test

import (
	"encoding/json"
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
