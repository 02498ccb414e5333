//go:build !(linux || darwin || openbsd)

package proxy

// nonBlockingWrites: every client is written by a goroutine of its own.
const nonBlockingWrites = false

func (c *client) writeFD(uintptr) bool { return true }
