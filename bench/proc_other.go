//go:build !unix

package main

import (
	"os"
	"os/exec"
)

// Where there are no process groups and no RLIMIT_NOFILE (Windows): the
// bench runs, a peer's children may outlive a kill, and the descriptors
// are what the system gives.

// raiseNoFile reports n: there is no descriptor limit to raise.
func raiseNoFile(n uint64) (uint64, error) { return n, nil }

// ownGroup leaves cmd as it is: there is no process group to give it.
func ownGroup(*exec.Cmd) {}

// terminate ends p: it has no signal to ask it with.
func terminate(p *os.Process) { _ = p.Kill() }

// killGroup kills p; its children, if any, are not reached.
func killGroup(p *os.Process) { _ = p.Kill() }
