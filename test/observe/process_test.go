package observe_test

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
)

// process is a program the test started (Prometheus, the trace receiver).
type process struct {
	name string
	cmd  *exec.Cmd
	logs *gatetest.LogBuffer
	done chan struct{} // closed when it has exited
}

// start runs cmd in the background, keeping its output, and stops it when
// the test ends (SIGTERM, then SIGKILL after 10 s), printing its output if
// the test failed.
func start(t *testing.T, name string, cmd *exec.Cmd) *process {
	t.Helper()
	p := &process{name: name, cmd: cmd, logs: &gatetest.LogBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s's output:\n%s", name, p.logs.String())
		}
	})
	return p
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
