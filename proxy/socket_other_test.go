//go:build !unix

package proxy

import (
	"net"
	"testing"
)

// The raw sockets of the tests, where the system has no unix sockets
// (Windows): the tests build, and those that depend on these bounds are
// for systems that have them.

// setRcvBuf leaves the socket's receive buffer as it is: a client that
// stops reading then fills the kernel's buffers first.
func setRcvBuf(uintptr, int) {}

// refusedAddr returns a loopback address that refuses connections: a
// port a listener held and closed, which a listener of a test running
// meanwhile could take (there is no bound socket that does not listen).
func refusedAddr(t *testing.T) (addr string, release func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = ln.Addr().String()
	ln.Close()
	return addr, func() {}
}
