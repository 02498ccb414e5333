//go:build unix

package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// The peers' process groups and the descriptor limit, where the system
// has both.

// raiseNoFile raises RLIMIT_NOFILE, soft and hard, to at least n for this
// process; children inherit it. It returns the limit in force afterwards.
func raiseNoFile(n uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("getrlimit: %w", err)
	}
	// The fields are uint64 on Linux and macOS, int64 on FreeBSD (where
	// RLIM_INFINITY, -1, reads as the largest uint64).
	cur, hard := uint64(lim.Cur), uint64(lim.Max)
	if cur >= n && hard >= n {
		// Set it anyway: an explicit Setrlimit makes os/exec pass this
		// limit to children instead of restoring the one at start.
		err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		return cur, err
	}
	want := lim
	if hard < n {
		setRlim(&want.Max, n)
	}
	setRlim(&want.Cur, n)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		// Not allowed to raise the hard limit: take what there is.
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		return hard, fmt.Errorf("setrlimit %d: %w", n, err)
	}
	return n, nil
}

// setRlim sets a field of syscall.Rlimit, whatever its integer type.
func setRlim[T int64 | uint64](f *T, n uint64) { *f = T(n) }

// ownGroup has cmd start in a process group of its own, so that a stuck
// nginx can be killed with its workers, and the terminal's Ctrl-C reaches
// only the bench.
func ownGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }

// terminate asks p to end (SIGTERM).
func terminate(p *os.Process) { _ = p.Signal(syscall.SIGTERM) }

// killGroup kills p's process group (ownGroup), p and its children.
func killGroup(p *os.Process) { _ = syscall.Kill(-p.Pid, syscall.SIGKILL) }
