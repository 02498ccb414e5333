//go:build !unix

package faults_test

import "syscall"

// smallReceiveBuffer leaves the socket as it is where SO_RCVBUF cannot be
// set the unix way: a client that stops reading then fills the kernel's
// buffers first.
func smallReceiveBuffer(_, _ string, _ syscall.RawConn) error { return nil }
