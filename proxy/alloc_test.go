//go:build !race

package proxy

import (
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/ssegate/ssegate/sse"
)

// TestOfferAllocs holds the generation's write of an event to its client
// (a chunk frame and one writev that never waits) at zero allocations;
// the race detector's instrumentation allocates, hence the build tag.
func TestOfferAllocs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(io.Discard, c) //nolint:errcheck // drains until the test closes
			c.Close()
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rc, err := conn.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{m: newMetrics(&Proxy{})}
	c := &client{p: p, conn: conn, rc: rc}
	c.wfn = c.writeFD
	ev := sse.AppendEvent(nil, sse.ID{Gen: 1, Seq: 1}, "", `{"choices":[{"index":0,"delta":{"content":"hello"}}]}`)
	if got := testing.AllocsPerRun(1000, func() {
		if _, err := c.offer(false, ev); err != nil {
			t.Fatal(err)
		}
		if err := c.flush(); err != nil { // whatever the socket did not take
			t.Fatal(err)
		}
	}); got != 0 {
		t.Errorf("offer: got %v allocs per event; want 0", got)
	}
}
