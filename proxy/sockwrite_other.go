//go:build !(linux || darwin || openbsd)

package proxy

// nonBlockingWrites: every client is written by a goroutine of its own
// (offer never takes the raw write below).
const nonBlockingWrites = false

func (c *clientConn) writeFD(uintptr) bool { return true }
