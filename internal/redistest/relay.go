package redistest

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Relay is a TCP relay on loopback in front of a Redis that can lose a
// reply: the command reaches Redis and runs, and its answer never
// reaches the client, as when a connection is cut or times out after the
// write. Every other byte passes as it came.
type Relay struct {
	Addr   string
	target string
	ln     net.Listener

	mu     sync.Mutex // guards marker, hold, lost and conns
	marker []byte     // the reply to lose contains it; nil when not armed
	hold   time.Duration
	lost   chan struct{} // closed once the armed reply was lost
	conns  map[net.Conn]struct{}
}

// NewRelay starts a relay to the Redis at target, closed when the test
// ends.
func NewRelay(tb testing.TB, target string) *Relay {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("relay: %v", err)
	}
	r := &Relay{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	go r.accept()
	tb.Cleanup(r.Close)
	return r
}

// LoseReply arms the relay: the next reply from Redis that contains
// marker (for a script's answer, its RESP bytes, such as "$4\r\nmiss\r\n")
// is dropped with whatever came with it, the connection that carried it
// goes silent for hold (a client's timeout, when hold is longer than it)
// and is then cut. The returned channel is closed once the reply was
// dropped.
func (r *Relay) LoseReply(marker string, hold time.Duration) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.marker, r.hold, r.lost = []byte(marker), hold, make(chan struct{})
	return r.lost
}

// Close stops the relay and cuts its connections.
func (r *Relay) Close() {
	r.ln.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		c.Close()
	}
}

func (r *Relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns[c], r.conns[s] = struct{}{}, struct{}{}
		r.mu.Unlock()
		go func() {
			io.Copy(s, c) //nolint:errcheck // ends when either side closes
			s.Close()
			c.Close()
		}()
		go r.replies(s, c)
	}
}

// replies copies Redis's replies on s to the client c, but for the armed
// one.
func (r *Relay) replies(s, c net.Conn) {
	defer s.Close()
	defer c.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			r.mu.Lock()
			armed := r.marker != nil && bytes.Contains(buf[:n], r.marker)
			hold, lost := r.hold, r.lost
			if armed {
				r.marker = nil
			}
			r.mu.Unlock()
			if armed {
				close(lost)
				time.Sleep(hold)
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
