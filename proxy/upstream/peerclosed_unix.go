//go:build linux || darwin || openbsd

package upstream

import (
	"crypto/tls"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// peerClosed reports whether the peer of an idle connection has closed it
// (or reset it, or sent what no request asked for), by a look at the
// socket that neither waits nor takes a byte. A TLS connection is looked
// at below TLS: an alert or a FIN is there before TLS reads it. It clears
// the connection's read deadline (one left from the last answer would
// stop the look), so the caller sets the next.
func peerClosed(c net.Conn) bool {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if c.SetReadDeadline(time.Time{}) != nil {
		return true
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	var b [1]byte
	if err := rc.Read(func(fd uintptr) bool {
		_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		// n == 0 with no error is the peer's FIN; bytes on an idle
		// connection are no answer to anything, and an error other than
		// "nothing there" means the connection is broken.
		closed = err == nil || (err != unix.EAGAIN && err != unix.EINTR)
		return true // never wait
	}); err != nil {
		return true
	}
	return closed
}
