//go:build !race

package proxy

import (
	"io"
	"math"
	"net"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
)

// TestOfferAllocs holds the generation's write of an event to its client
// (a chunk frame and one writev that never waits) at zero allocations;
// the race detector's instrumentation allocates, hence the build tag.
func TestOfferAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun counts every allocation of the process.
	c := drainedClient(t)
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

// TestWriteAllocs holds a blocking write of a chunk larger than
// writePiece, which goes out in pieces with a deadline each, at zero
// allocations.
func TestWriteAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun counts every allocation of the process.
	c := drainedClient(t)
	c.p.cfg.SlowClientTimeout = 10 * time.Second
	big := make([]byte, 5*writePiece+123)
	if got := testing.AllocsPerRun(100, func() {
		if err := c.write(big); err != nil {
			t.Fatal(err)
		}
	}); got != 0 {
		t.Errorf("write of %d bytes: got %v allocs; want 0", len(big), got)
	}
}

// TestDeliverAllocs holds the relay of a journaled event to a client, by
// the generation itself (writes that never wait) and by a follower's
// goroutine (writes that wait), at zero allocations.
func TestDeliverAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun counts every allocation of the process.
	data := `{"choices":[{"index":0,"delta":{"content":"hello"}}]}`
	c := drainedClient(t)
	c.p.cfg.SlowClientTimeout = 10 * time.Second
	for _, wait := range []bool{false, true} {
		f := cache.NewDetached(1 << 30)
		sub, err := f.Subscribe(0)
		if err != nil {
			t.Fatal(err)
		}
		if got := testing.AllocsPerRun(1000, func() {
			if _, err := f.Append("", data); err != nil {
				t.Fatal(err)
			}
			if d := deliver(c, sub, f, wait); d.err != nil && d.err != errBehind {
				t.Fatal(d.err)
			}
			if err := c.flush(); err != nil { // whatever the socket did not take
				t.Fatal(err)
			}
		}); got != 0 {
			t.Errorf("deliver, wait %v: got %v allocs per event; want 0", wait, got)
		}
	}
}

// drainedClient is a client on a loopback connection whose other end
// reads everything.
func drainedClient(t *testing.T) *clientConn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
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
	t.Cleanup(func() { conn.Close() })
	rc, err := conn.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{m: newMetrics(&Proxy{})}
	c := &clientConn{p: p, conn: conn, rc: rc}
	c.wfn = c.writeFD
	return c
}

// TestPumpAllocs holds the relay of an upstream event, from the upstream's
// socket to the client's (read in place by sse.Scanner, observed,
// journaled and written), under one allocation per event for the whole
// process: the mock upstream and the test's client included. It takes the
// difference between a long stream and a short one, keyed and not, so
// what a request costs once cancels out.
func TestPumpAllocs(t *testing.T) {
	// Not parallel: the count is of every allocation of the process.
	e := newEnv(t)
	const short, long = 20, 820
	mallocs := func(key string, tokens int) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		resp := e.do(req{key: key, header: map[string]string{"X-Mock-Tokens": strconv.Itoa(tokens)}})
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		runtime.ReadMemStats(&after)
		return after.Mallocs - before.Mallocs
	}
	for _, keyed := range []bool{false, true} {
		key := func() string {
			if keyed {
				return newKey("allocs")
			}
			return ""
		}
		mallocs(key(), long) // warm: buffers and pools grow once
		best := math.Inf(1)
		for range 3 { // the least of a few: a stray goroutine's allocations count too
			s, l := mallocs(key(), short), mallocs(key(), long)
			best = min(best, (float64(l)-float64(s))/(long-short))
		}
		t.Logf("keyed %v: %.3f allocs per event", keyed, best)
		if best >= 1 {
			t.Errorf("keyed %v: got %.2f allocs per event; want below 1", keyed, best)
		}
	}
}
