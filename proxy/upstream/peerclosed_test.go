//go:build (linux || darwin || openbsd) && !race

// The race detector adds allocations, so this runs only without it.

package upstream

import (
	"net"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/poll"
)

// TestPeerClosed: a look at an idle connection's socket tells an open peer
// from one that closed, takes no byte, and costs at most the one
// allocation of the system call's wrapper (its address buffer), not a
// socket handle and a closure a request. Not parallel: AllocsPerRun counts
// every goroutine's allocations.
func TestPeerClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peer := <-accepted
	if peer == nil {
		t.Fatal("no connection accepted")
	}
	p := newPeeker(c)
	if p.peerClosed() {
		t.Fatal("an open, idle peer: got closed")
	}
	if got := testing.AllocsPerRun(100, func() { p.peerClosed() }); got > 1 {
		t.Errorf("a look: got %v allocations; want at most 1", got)
	}
	// Bytes no request asked for: the connection is not to be used, and
	// the look leaves them there.
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if !poll.Until(time.Second, p.peerClosed) {
		t.Fatal("bytes sent unasked: got open")
	}
	var b [1]byte
	c.SetReadDeadline(time.Now().Add(time.Second)) //nolint:errcheck // the read says
	if n, err := c.Read(b[:]); n != 1 || b[0] != 'x' {
		t.Fatalf("the byte looked at: read %d %q, %v; want it still there", n, b[:n], err)
	}
	peer.Close()
	if !poll.Until(time.Second, p.peerClosed) {
		t.Fatal("a peer that closed: got open")
	}
}
