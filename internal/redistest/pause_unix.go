//go:build unix

package redistest

import (
	"os"
	"syscall"
)

// pause stops p (SIGSTOP): its connections stay open and nothing answers.
func pause(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }

// resume continues p after pause (SIGCONT).
func resume(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
