//go:build unix

package faults_test

import "syscall"

// smallReceiveBuffer shrinks a client socket's receive buffer before it
// connects, so that a client that stops reading stops the proxy's writes
// within a few events rather than after megabytes of kernel buffers.
func smallReceiveBuffer(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
	})
	if err != nil {
		return err
	}
	return serr
}
