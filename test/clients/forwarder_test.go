package clients_test

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// forwarder relays TCP connections from a loopback listener to a target,
// byte for byte. sever closes every connection open at that moment (as a
// flaky network or a restarted load balancer would) while new connections
// keep going through: that is what makes a browser's EventSource reconnect
// by itself.
type forwarder struct {
	ln     net.Listener
	target string

	mu    sync.Mutex // guards conns and closed
	conns map[net.Conn]struct{}
	// closed is set by close: a connection accepted after it is refused.
	closed bool

	wg sync.WaitGroup // the accept loop and one goroutine per relayed connection
}

func newForwarder(t *testing.T, target string) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *forwarder) addr() string { return f.ln.Addr().String() }

func (f *forwarder) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return // the listener was closed
		}
		f.wg.Add(1)
		go f.relay(c)
	}
}

// relay copies both ways until either side ends, then closes both.
func (f *forwarder) relay(client net.Conn) {
	defer f.wg.Done()
	up, err := net.DialTimeout("tcp", f.target, 5*time.Second)
	if err != nil {
		client.Close()
		return
	}
	if !f.track(client, up) {
		client.Close()
		up.Close()
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src) //nolint:errcheck // either side ending ends the relay
		done <- struct{}{}
	}
	go pipe(up, client)
	go pipe(client, up)
	<-done
	client.Close()
	up.Close()
	<-done
	f.untrack(client, up)
}

func (f *forwarder) track(cs ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	for _, c := range cs {
		f.conns[c] = struct{}{}
	}
	return true
}

func (f *forwarder) untrack(cs ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		delete(f.conns, c)
	}
}

// sever closes every open connection, both halves, and returns how many
// relays it cut. New connections are still accepted.
func (f *forwarder) sever() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		c.Close()
	}
	return len(f.conns) / 2
}

// close stops accepting, cuts everything and waits for the relays.
func (f *forwarder) close() {
	f.ln.Close()
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.sever()
	f.wg.Wait()
}
