package clients_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binDir holds the ssegate binary built for this package's tests.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ssegate-clients-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildErr  error
)

// binary builds cmd/ssegate once per package run, so that the tests drive
// exactly what an operator deploys, with its flag parsing and signal
// handling, rather than the in-package wiring.
func binary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(binDir, "ssegate")
	buildOnce.Do(func() {
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		cmd := exec.Command(gobin, "build", "-o", bin, "github.com/ssegate/ssegate/cmd/ssegate")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/ssegate: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bin
}

// logBuffer collects a child process's stderr; the exec package writes to
// it from its own goroutine while the test may read it.
type logBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// gate is one running ssegate process.
type gate struct {
	addr string // host:port it listens on
	url  string // http://addr
	cmd  *exec.Cmd
	logs *logBuffer
	done chan struct{} // closed when the process has exited
	err  error         // the result of Wait; read only after done
}

// freePort returns a loopback port that was free a moment ago. The binary
// needs its address on the command line, so the port is picked here and
// released for it; startGate retries if another process took it meanwhile.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// startGate runs the built binary on a free loopback port with args and
// waits until it answers HTTP. The process is stopped when the test ends,
// unless the test has already waited for it.
func startGate(t *testing.T, args ...string) *gate {
	t.Helper()
	bin := binary(t)
	var last string
	for attempt := 0; attempt < 3; attempt++ {
		g := &gate{addr: freePort(t), logs: &logBuffer{}, done: make(chan struct{})}
		g.url = "http://" + g.addr
		g.cmd = exec.Command(bin, append([]string{"-listen", g.addr, "-log-format", "text"}, args...)...)
		g.cmd.Env = hermeticEnv()
		g.cmd.Stdout = g.logs
		g.cmd.Stderr = g.logs
		if err := g.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			g.err = g.cmd.Wait()
			close(g.done)
		}()
		if g.waitUp(10 * time.Second) {
			t.Cleanup(func() { g.stop(t) })
			return g
		}
		g.kill()
		last = g.logs.String()
		if !strings.Contains(last, "address already in use") {
			break
		}
	}
	t.Fatalf("ssegate did not start; its output:\n%s", last)
	return nil
}

// hermeticEnv is the test's environment without SSEGATE_* variables, which
// the binary would read as flags.
func hermeticEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SSEGATE_") {
			env = append(env, kv)
		}
	}
	return env
}

// waitUp polls until the process answers any HTTP request, or exits.
func (g *gate) waitUp(limit time.Duration) bool {
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case <-g.done:
			return false
		default:
		}
		// A key unknown to this tenant: answered by ssegate itself with a
		// 404, without touching the upstream.
		resp, err := c.Get(g.url + "/keys/startup-probe")
		if err == nil {
			resp.Body.Close()
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// kill ends the process at once and waits for it.
func (g *gate) kill() {
	g.cmd.Process.Kill() //nolint:errcheck // it may have exited already
	<-g.done
}

// stop ends the process gently if it still runs, and shows its output if
// the test failed.
func (g *gate) stop(t *testing.T) {
	select {
	case <-g.done:
	default:
		g.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // it may have exited meanwhile
		select {
		case <-g.done:
		case <-time.After(10 * time.Second):
			g.kill()
		}
	}
	if t.Failed() {
		t.Logf("ssegate output:\n%s", g.logs.String())
	}
}

// event is one SSE event as a client received it.
type event struct {
	id, typ, data string
	at            time.Time // when its blank line arrived
}

// readEvents reads an SSE body by hand (so the test does not trust the
// code under test to read what it wrote), calling each with every event
// as it arrives. Comments (": ping") are skipped. It returns the events
// and the error that ended the body, nil for a clean EOF.
func readEvents(r io.Reader, each func(event)) ([]event, error) {
	var evs []event
	var ev event
	var data []string
	seen := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if seen {
				ev.data = strings.Join(data, "\n")
				ev.at = time.Now()
				evs = append(evs, ev)
				if each != nil {
					each(ev)
				}
			}
			ev, data, seen = event{}, nil, false
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id:"):
			ev.id, seen = strings.TrimPrefix(strings.TrimPrefix(line, "id:"), " "), true
		case strings.HasPrefix(line, "event:"):
			ev.typ, seen = strings.TrimPrefix(strings.TrimPrefix(line, "event:"), " "), true
		case strings.HasPrefix(line, "data:"):
			data, seen = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")), true
		}
	}
	err := sc.Err()
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return evs, err
}

// isCI reports whether the tests run in CI, where a missing browser is a
// broken set-up, not a reason to skip.
func isCI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v != "" && v != "false" && v != "0"
}
