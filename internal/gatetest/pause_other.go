//go:build !unix

package gatetest

import (
	"errors"
	"os"
)

// errNoPause: without SIGSTOP (Windows) a process cannot be paused; the
// tests that pause one are for systems that have it.
var errNoPause = errors.New("pausing a process needs SIGSTOP, which this system lacks")

func pause(*os.Process) error { return errNoPause }

func resume(*os.Process) error { return nil }
