//go:build linux || darwin || openbsd

package proxy

import "golang.org/x/sys/unix"

// nonBlockingWrites: offer can write a connection without waiting.
const nonBlockingWrites = true

// writeFD is the callback of offer's raw write: one writev of c.vec that
// returns at once, with what the socket buffer took.
func (c *clientConn) writeFD(fd uintptr) bool {
	n, err := unix.Writev(int(fd), c.vec)
	switch err {
	case nil:
		c.wn = n
	case unix.EAGAIN, unix.EINTR:
		// nothing taken: the client is behind
	default:
		c.werr = err
	}
	return true // never wait for the socket to be writable
}
