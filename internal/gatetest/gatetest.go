package gatetest

import (
	"bytes"
	"fmt"
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

	"github.com/ssegate/ssegate/internal/poll"
)

// binDir holds the binary [Binary] builds; set by [Main].
var binDir string

// Main runs the package's tests with a temporary directory for the binary
// [Binary] builds, removes it, and exits with the tests' status. Call it
// from TestMain.
func Main(m *testing.M) {
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".test")
	dir, err := os.MkdirTemp("", "ssegate-"+name+"-")
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

// Binary builds cmd/ssegate once per test binary and returns its path. A
// failed build fails every test that asks for it, with the compiler's
// output. It needs [Main] to have been called from TestMain.
func Binary(tb testing.TB) string {
	tb.Helper()
	if binDir == "" {
		tb.Fatal("gatetest: TestMain must call gatetest.Main")
	}
	bin := filepath.Join(binDir, "ssegate")
	buildOnce.Do(func() {
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		out, err := exec.Command(gobin, "build", "-o", bin, "github.com/ssegate/ssegate/cmd/ssegate").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/ssegate: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
	return bin
}

// FreePort returns a loopback address (127.0.0.1:port) that was free a
// moment ago, for an address a test must name on a command line (such as
// -admin-listen); another process may take it meanwhile. [Config.Start]
// needs none for -listen.
func FreePort(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// Config says how to start, recognise and stop processes. The zero
// Config names them "ssegate", polls /healthz and kills them at the end.
type Config struct {
	// Name names the process in failure messages and in the output
	// printed when a test fails; "ssegate" if empty.
	Name string
	// Probe is the path polled until the process answers it with any
	// HTTP status; "/healthz" if empty. It must be served on -listen.
	Probe string
	// Grace is how long the end of the test waits for the process to exit
	// after SIGTERM before it kills it. Zero kills it at once (after a
	// SIGCONT, in case the test paused it).
	Grace time.Duration
	// Env are variables (NAME=value) added to the process's environment,
	// such as the OpenTelemetry SDK's.
	Env []string
}

// Start and stop timing.
const (
	upLimit      = 10 * time.Second // for the process to answer its Probe
	probeTimeout = time.Second      // for one probe request
)

// Start runs the built binary with -listen 127.0.0.1:0 followed by args,
// learns the port the process bound from its -listen-file, and waits
// until it answers HTTP there. Its stdout and stderr are kept (see
// [Process.Logs]). It fails the test if the process exits or does not
// answer within 10 seconds, showing the process's output. No port is
// picked for it beforehand, so no other process can take it meanwhile and
// answer the probe in its place. The process is stopped when the test
// ends, as c.Grace says, unless it has exited by then; its output is
// printed if the test failed.
func (c Config) Start(tb testing.TB, args ...string) *Process {
	tb.Helper()
	name := c.Name
	if name == "" {
		name = "ssegate"
	}
	probe := c.Probe
	if probe == "" {
		probe = "/healthz"
	}
	bin := Binary(tb)
	p := &Process{Name: name, logs: &LogBuffer{}, done: make(chan struct{})}
	p.listenFile = filepath.Join(tb.TempDir(), "listen")
	p.cmd = exec.Command(bin, append([]string{"-listen", "127.0.0.1:0", "-listen-file", p.listenFile}, args...)...)
	p.cmd.Env = append(hermeticEnv(), c.Env...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	if !p.waitUp(probe) {
		p.Kill()
		tb.Fatalf("%s did not start; its output:\n%s", name, p.logs.String())
	}
	tb.Cleanup(func() {
		tb.Helper()
		p.stop(tb, c.Grace)
	})
	return p
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

// Process is one running ssegate process, started by [Config.Start].
type Process struct {
	Name string // as in its Config
	Addr string // host:port it listens on (-listen), from its log
	URL  string // http://Addr

	cmd        *exec.Cmd
	listenFile string // where it writes the address it bound (-listen-file)
	logs       *LogBuffer
	done       chan struct{} // closed when the process has exited
	err        error         // the result of Wait; read only after done
}

// waitUp waits for the process's -listen-file, sets its Addr and URL
// from it, and polls until the process answers any HTTP request to probe
// there; false if it exits first or the limit passes.
func (p *Process) waitUp(probe string) bool {
	c := &http.Client{Timeout: probeTimeout}
	exited := false
	up := poll.Until(upLimit, func() bool {
		select {
		case <-p.done:
			exited = true
			return true
		default:
		}
		if p.Addr == "" {
			b, err := os.ReadFile(p.listenFile) // written whole, once it serves
			if err != nil {
				return false
			}
			p.Addr = strings.TrimSpace(string(b))
			p.URL = "http://" + p.Addr
		}
		resp, err := c.Get(p.URL + probe)
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	return up && !exited
}

// Logs returns what the process has written to stdout and stderr so far.
func (p *Process) Logs() string { return p.logs.String() }

// Signal sends sig to the process. It fails if the process has exited.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Pause stops the process with SIGSTOP: its connections stay open and
// nothing answers, as with a hung or descheduled replica. Where there is
// no SIGSTOP (Windows) it does nothing.
func (p *Process) Pause() { _ = pause(p.cmd.Process) }

// Resume continues a paused process with SIGCONT.
func (p *Process) Resume() { _ = resume(p.cmd.Process) }

// Kill ends the process at once with SIGKILL and waits for it to exit.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill() // it may have exited already
	<-p.done
}

// Wait waits up to timeout for the process to exit. It reports whether it
// did and, if so, how: nil for exit status 0, an *exec.ExitError
// otherwise.
func (p *Process) Wait(timeout time.Duration) (exited bool, err error) {
	select {
	case <-p.done:
		return true, p.err
	case <-time.After(timeout):
		return false, nil
	}
}

// stop ends the process at the end of the test if it still runs (SIGTERM
// and up to grace for it to exit, or at once with SIGCONT and SIGKILL),
// and shows its output if the test failed.
func (p *Process) stop(tb testing.TB, grace time.Duration) {
	tb.Helper()
	select {
	case <-p.done:
	default:
		if grace > 0 {
			_ = p.Signal(syscall.SIGTERM) // it may have exited meanwhile
			if exited, _ := p.Wait(grace); !exited {
				p.Kill()
			}
		} else {
			p.Resume()
			p.Kill()
		}
	}
	if tb.Failed() {
		tb.Logf("%s output:\n%s", p.Name, p.Logs())
	}
}

// LogBuffer collects a child process's output: the exec package (or
// whatever runs the child) writes to it from its own goroutine while the
// test may read it. The zero LogBuffer is empty and ready to use.
type LogBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what has been written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
