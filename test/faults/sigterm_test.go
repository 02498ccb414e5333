package faults_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/poll"
)

func TestMain(m *testing.M) { gatetest.Main(m) }

// TestSIGTERMWhileHeadAwaited: the built binary gets SIGTERM while the
// upstream has a keyed request and no head came yet. The drain's time runs
// out and the generation is cut: the head that then comes is dropped, or
// the call is cut at once when none comes. The client gets the outcome-unknown answer (502, Ssegate-Outcome:
// unknown, no Retry-After), never a 503 shutting_down with Retry-After,
// which it would send again: the upstream may be running the request. One
// upstream call.
func TestSIGTERMWhileHeadAwaited(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the binary")
	}
	// The head comes after the drain's time ran out, and is dropped; or
	// it never comes, and the call is cut at once rather than at
	// -head-timeout, after the process is gone.
	for _, late := range []bool{true, false} {
		name := "head comes late"
		if !late {
			name = "head never comes"
		}
		t.Run(name, func(t *testing.T) { sigtermWhileHeadAwaited(t, late) })
	}
}

func sigtermWhileHeadAwaited(t *testing.T, late bool) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var calls atomic.Int64
	release, done := make(chan struct{}), make(chan struct{})
	defer close(done)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				io.Copy(io.Discard, r.Body) //nolint:errcheck // only its end matters
				calls.Add(1)
				select {
				case <-release:
				case <-time.After(20 * time.Second):
					return
				}
				if late {
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n") //nolint:errcheck
				}
				<-done // silent until the test ends
			}()
		}
	}()
	g := gatetest.Config{Name: "sigterm"}.Start(t, "-upstream", "http://"+ln.Addr().String(),
		"-shutdown-timeout", "200ms", "-head-timeout", "20s", "-log-format", "text", "-log-level", "warn")
	type answer struct {
		status int
		header http.Header
		body   string
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "sigterm-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			got <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
	}()
	poll.For(t, 10*time.Second, "the upstream gets the call", func() bool { return calls.Load() > 0 })
	if err := g.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	poll.For(t, 10*time.Second, "the drain's time is up and the generation cut", func() bool {
		return strings.Contains(g.Logs(), "drain time is up")
	})
	close(release)
	defer ln.Close()
	var a answer
	select {
	case a = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no answer 10 s after the head came")
	}
	if a.err != nil {
		t.Fatalf("client: %v; want the outcome-unknown answer", a.err)
	}
	if a.status != http.StatusBadGateway || a.header.Get("Ssegate-Outcome") != "unknown" || a.header.Get("Retry-After") != "" {
		t.Fatalf("client: got %d Ssegate-Outcome %q Retry-After %q (%s); want 502 with Ssegate-Outcome: unknown, no Retry-After",
			a.status, a.header.Get("Ssegate-Outcome"), a.header.Get("Retry-After"), a.body)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("upstream calls: got %d; want 1", n)
	}
}
