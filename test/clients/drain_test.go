package clients_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/poll"
)

// drainTimeout is the -shutdown-timeout the drain test gives ssegate.
const drainTimeout = 1500 * time.Millisecond

// drainStream is one client stream open when SIGTERM arrives.
type drainStream struct {
	name    string
	keyed   bool
	tokens  int           // X-Mock-Tokens
	delay   time.Duration // X-Mock-Delay, before each event
	long    bool          // would outlast the drain
	started chan struct{} // closed at the first event
	done    chan struct{} // closed when the body has ended
	// Set before done is closed.
	events []event
	err    error
	ended  time.Time
}

// TestGracefulDrain: the built binary gets SIGTERM during live streams.
// Streams that can finish within -shutdown-timeout end cleanly with
// [DONE]; the rest end with event: error of type stream_aborted once the
// time is up (not before); new connections are refused; the process exits
// with status 0.
func TestGracefulDrain(t *testing.T) {
	args := []string{"-upstream", "mock", "-mock-delay", "50ms", "-shutdown-timeout", drainTimeout.String()}
	// GET /readyz turning 503 while draining can only be seen on an admin
	// listener that outlives the main one; check it when the binary has one.
	adminURL := ""
	if hasFlag(t, "admin-listen") {
		admin := gatetest.FreePort(t)
		args = append(args, "-admin-listen", admin)
		adminURL = "http://" + admin
	} else {
		t.Log("the binary has no -admin-listen: /readyz during the drain is not checked")
	}
	g := startGate(t, args...)

	streams := []*drainStream{
		// About 9 events at 50 ms: done some 0.4 s after SIGTERM.
		{name: "short-1", keyed: true, tokens: 6, delay: 50 * time.Millisecond},
		{name: "short-2", keyed: true, tokens: 6, delay: 50 * time.Millisecond},
		{name: "short-unkeyed", tokens: 6, delay: 50 * time.Millisecond},
		// About 10 s: cut by the drain.
		{name: "long-1", keyed: true, tokens: 200, delay: 50 * time.Millisecond, long: true},
		{name: "long-2", keyed: true, tokens: 200, delay: 50 * time.Millisecond, long: true},
		{name: "long-unkeyed", tokens: 200, delay: 50 * time.Millisecond, long: true},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for i, s := range streams {
		s.started, s.done = make(chan struct{}), make(chan struct{})
		go s.run(ctx, client, g.URL, fmt.Sprintf("drain-%d-%d", time.Now().UnixNano(), i))
	}
	for _, s := range streams {
		select {
		case <-s.started:
		case <-s.done:
			t.Fatalf("%s ended before its first event: %v", s.name, s.err)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no first event within 10s", s.name)
		}
	}
	if adminURL != "" {
		if code := getStatus(adminURL + "/readyz"); code != http.StatusOK {
			t.Errorf("GET /readyz before SIGTERM: got %d; want 200", code)
		}
	}

	sigAt := time.Now()
	if err := g.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}

	if adminURL != "" {
		// The drain is 1.5 s long: /readyz must say 503 within it.
		saw := 0
		if !poll.Until(drainTimeout, func() bool {
			saw = getStatus(adminURL + "/readyz")
			return saw == http.StatusServiceUnavailable
		}) {
			t.Errorf("GET /readyz while draining: got %d; want 503", saw)
		} else {
			t.Logf("GET /readyz on -admin-listen: 503 %v after SIGTERM", time.Since(sigAt).Round(time.Millisecond))
		}
	}

	// No new work once draining: a new connection is refused, or gets no
	// answer. Polled, as the signal reaches the process asynchronously.
	if answer := newConnAnswered(g.Addr, time.Second); answer != "" {
		t.Errorf("new request 1s after SIGTERM: got answer %q; want the connection refused or unanswered", answer)
	}

	for _, s := range streams {
		select {
		case <-s.done:
		case <-time.After(drainTimeout + 8*time.Second):
			t.Fatalf("%s: still open %v after SIGTERM; want it ended", s.name, time.Since(sigAt).Round(time.Millisecond))
		}
		after := s.ended.Sub(sigAt).Round(time.Millisecond)
		last := event{}
		if n := len(s.events); n > 0 {
			last = s.events[n-1]
		}
		if !s.long {
			if last.typ != "" || last.data != "[DONE]" {
				t.Errorf("%s (short): got last event %q %q after %v (read error %v); want data: [DONE]", s.name, last.typ, last.data, after, s.err)
			}
			if s.ended.Sub(sigAt) > drainTimeout {
				t.Errorf("%s (short): ended %v after SIGTERM; want within the %v drain", s.name, after, drainTimeout)
			}
			continue
		}
		if last.typ != "error" || !strings.Contains(last.data, `"type":"stream_aborted"`) {
			t.Errorf("%s (long): got last event %q %q after %v (%d events, read error %v); want event: error with type stream_aborted", s.name, last.typ, last.data, after, len(s.events), s.err)
		}
		// Not cut before its time was up, nor long after.
		if d := s.ended.Sub(sigAt); d < drainTimeout-300*time.Millisecond || d > drainTimeout+3*time.Second {
			t.Errorf("%s (long): ended %v after SIGTERM; want about %v (the drain timeout), at most %v", s.name, after, drainTimeout, drainTimeout+3*time.Second)
		}
		t.Logf("%s: ended %v after SIGTERM with %q", s.name, after, last.typ)
	}

	exited, err := g.Wait(drainTimeout + 8*time.Second)
	if !exited {
		t.Fatalf("process: still running %v after SIGTERM; want it exited", time.Since(sigAt).Round(time.Millisecond))
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		t.Errorf("process: got exit status %d; want 0", exit.ExitCode())
	} else if err != nil {
		t.Errorf("process: got %v; want exit status 0", err)
	}
	t.Logf("process exited %v after SIGTERM", time.Since(sigAt).Round(time.Millisecond))
}

// run makes the stream's request and reads it to its end.
func (s *drainStream) run(ctx context.Context, client *http.Client, base, key string) {
	defer close(s.done)
	defer func() { s.ended = time.Now() }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"`+s.name+`"}]}`))
	if err != nil {
		s.err = err
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Mock-Tokens", fmt.Sprint(s.tokens))
	req.Header.Set("X-Mock-Delay", s.delay.String())
	if s.keyed {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		s.err = err
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.err = fmt.Errorf("got status %d; want 200", resp.StatusCode)
		return
	}
	first := true
	s.events, s.err = readEvents(resp.Body, func(event) {
		if first {
			first = false
			close(s.started)
		}
	})
}

// newConnAnswered polls, for up to limit, whether a new connection to addr
// still gets an HTTP answer. It returns "" once a connection is refused or
// left unanswered, else the status line of the last answer.
func newConnAnswered(addr string, limit time.Duration) string {
	answer := ""
	poll.Until(limit, func() bool {
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err != nil {
			answer = "" // refused: not accepting
			return true
		}
		c.SetDeadline(time.Now().Add(500 * time.Millisecond)) //nolint:errcheck // a fresh conn
		fmt.Fprintf(c, "GET /keys/drain-probe HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", addr)
		buf := make([]byte, 64)
		n, _ := c.Read(buf)
		c.Close()
		answer, _, _ = strings.Cut(string(buf[:n]), "\r\n")
		return n == 0 // accepted by the kernel's backlog at most, never answered
	})
	return answer
}

// getStatus is the status of GET url, 0 when there is no answer.
func getStatus(url string) int {
	c := &http.Client{Timeout: 500 * time.Millisecond}
	resp, err := c.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// hasFlag reports whether the built binary documents -name in its -h.
func hasFlag(t *testing.T, name string) bool {
	t.Helper()
	out, _ := exec.Command(gatetest.Binary(t), "-h").CombinedOutput() //nolint:errcheck // -h output is what matters
	return strings.Contains(string(out), "-"+name+" ") || strings.Contains(string(out), "-"+name+"\n")
}

// TestDrainAfterClientsLeft: clients that close or reset their streams
// mid-way, keyed and not, leave nothing behind that holds SIGTERM up: the
// live generations come back to 0 (ssegate_live_generations) within a
// second for the unkeyed streams, and the process exits within
// -shutdown-timeout although the keyed generations are still being read.
func TestDrainAfterClientsLeft(t *testing.T) {
	const shutdown = 2 * time.Second
	g := startGate(t, "-upstream", "mock", "-mock-delay", "20ms", "-shutdown-timeout", shutdown.String())
	leave := func(key string, reset bool) {
		c, err := net.Dial("tcp", g.Addr)
		if err != nil {
			t.Fatal(err)
		}
		body := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"leave"}]}`
		keyHdr := ""
		if key != "" {
			keyHdr = "Idempotency-Key: " + key + "\r\n"
		}
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sX-Mock-Tokens: 2000\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", keyHdr, len(body), body)
		c.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // a fresh conn
		buf := make([]byte, 4096)
		for got := ""; strings.Count(got, "data: ") < 3; {
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("before 3 events: %v", err)
			}
			got += string(buf[:n])
		}
		if reset {
			c.(*net.TCPConn).SetLinger(0) //nolint:errcheck
		}
		c.Close()
	}
	for i := range 8 {
		leave("", i%2 == 0)
	}
	live := func() string {
		resp, err := http.Get(g.URL + "/metrics")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "ssegate_live_generations "); ok {
				return v
			}
		}
		return "absent"
	}
	got := ""
	if !poll.Until(time.Second, func() bool { got = live(); return got == "0" }) {
		t.Fatalf("ssegate_live_generations a second after 8 unkeyed clients left: got %s; want 0", got)
	}
	// Keyed generations read on after their clients left (40 s of
	// stream each): SIGTERM must still end the process in time.
	for i := range 4 {
		leave(fmt.Sprintf("left-%d-%d", time.Now().UnixNano(), i), i%2 == 0)
	}
	sigAt := time.Now()
	if err := g.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited, err := g.Wait(shutdown + 3*time.Second)
	if !exited {
		t.Fatalf("process: still running %v after SIGTERM; want it exited within -shutdown-timeout (%v)", time.Since(sigAt).Round(time.Millisecond), shutdown)
	}
	if err != nil {
		t.Errorf("process: got %v; want exit status 0", err)
	}
	if d := time.Since(sigAt); d > shutdown+time.Second {
		t.Errorf("process exited %v after SIGTERM; want within about -shutdown-timeout (%v)", d.Round(time.Millisecond), shutdown)
	}
}
