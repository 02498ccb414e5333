//go:build linux || darwin || openbsd

package upstream

import (
	"crypto/tls"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// peeker looks at one connection's socket before each request written on
// it after its first (peerClosed). Its socket handle and its look are
// made once for the connection, not for every request.
type peeker struct {
	c      net.Conn        // below TLS: an alert or a FIN is there before TLS reads it
	rc     syscall.RawConn // nil: a connection whose socket cannot be looked at
	look   func(fd uintptr) bool
	b      [1]byte
	closed bool
}

func newPeeker(c net.Conn) *peeker {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	p := &peeker{c: c}
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			p.rc = rc
		}
	}
	p.look = p.peek
	return p
}

// peek takes no byte and never waits. n == 0 with no error is the peer's
// FIN; bytes on an idle connection are no answer to anything, and an
// error other than "nothing there" means the connection is broken.
func (p *peeker) peek(fd uintptr) bool {
	_, _, err := unix.Recvfrom(int(fd), p.b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	p.closed = err == nil || (err != unix.EAGAIN && err != unix.EINTR)
	return true // never wait
}

// peerClosed reports whether the peer of an idle connection has closed it
// (or reset it, or sent what no request asked for), by a look at the
// socket that neither waits nor takes a byte. It clears the connection's
// read deadline (one left from the last answer would stop the look), so
// the caller sets the next.
func (p *peeker) peerClosed() bool {
	if p.c.SetReadDeadline(time.Time{}) != nil {
		return true
	}
	if p.rc == nil {
		return false
	}
	p.closed = false
	if err := p.rc.Read(p.look); err != nil {
		return true
	}
	return p.closed
}
