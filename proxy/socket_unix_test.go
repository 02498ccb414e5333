//go:build unix

package proxy

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
)

// The raw sockets of the tests, where the system has unix's.

// setRcvBuf asks for a receive buffer of size bytes on the socket fd (a
// hint: the kernel may round it).
func setRcvBuf(fd uintptr, size int) {
	syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, size) //nolint:errcheck // a hint
}

// refusedAddr returns a loopback address that refuses connections until
// release or the test's end. Its port is held by a socket that is bound
// but does not listen, without SO_REUSEADDR, so that no listener of a
// test running meanwhile can take it, as one could take a port closed
// after net.Listen.
func refusedAddr(t *testing.T) (addr string, release func()) {
	t.Helper()
	// Close-on-exec under ForkLock, as package net makes its sockets
	// where SOCK_CLOEXEC is missing (macOS): a process a test starts
	// meanwhile does not inherit the port.
	syscall.ForkLock.RLock()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { syscall.Close(fd) }) }
	t.Cleanup(release)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port), release
}
