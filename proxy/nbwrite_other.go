//go:build !(linux || darwin || openbsd)

package proxy

import "net"

// nonBlockingWrites: every client is written by a goroutine of its own.
const nonBlockingWrites = false

func (c *clientConn) writeFD(uintptr) bool { return true }

// peerClosed cannot look at the socket here: a close while idle is found
// only by the request's own failure.
func peerClosed(net.Conn) bool { return false }
