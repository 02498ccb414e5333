package redistest

import (
	"bytes"
	"fmt"
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

	mu     sync.Mutex // guards marker, hold, lost, held and conns
	marker []byte     // the reply to lose contains it; nil when not armed
	hold   time.Duration
	lost   chan struct{} // closed once the armed reply was lost
	held   *Held         // the request to hold; nil when not armed
	conns  map[net.Conn]struct{}
	closed chan struct{} // closed by Close
	once   sync.Once
}

// Held is a request the relay holds back from Redis (HoldRequest): its
// client waits for an answer that does not come, until the test cuts the
// connection that carried it, then delivers it, late.
type Held struct {
	// Caught is closed once the request is held.
	Caught <-chan struct{}
	caught chan struct{}
	cut    chan struct{} // closed by Cut
	marker []byte
	target string
	b      []byte // the bytes held: the read that carried the request
}

// NewRelay starts a relay to the Redis at target, closed when the test
// ends.
func NewRelay(tb testing.TB, target string) *Relay {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("relay: %v", err)
	}
	r := &Relay{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}, closed: make(chan struct{})}
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

// HoldRequest arms the relay: the next read from a client that contains
// marker (a command's RESP bytes, such as an argument only that command
// carries) is held, with whatever came with it: Redis does not see it, and
// that connection forwards nothing more. The client's command waits for an
// answer, as when its bytes sit in a connection's buffers.
func (r *Relay) HoldRequest(marker string) *Held {
	caught := make(chan struct{})
	h := &Held{Caught: caught, caught: caught, cut: make(chan struct{}), marker: []byte(marker), target: r.target}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held = h
	return h
}

// Cut cuts the connection that carried the held request, both ways: its
// client sees the connection fail, and Redis never saw the request.
func (h *Held) Cut() {
	<-h.Caught
	close(h.cut)
}

// Deliver sends the held bytes to Redis at last, on a connection of their
// own, and returns once Redis has run them (it answered a PING sent after
// them); the answers are dropped.
func (h *Held) Deliver(timeout time.Duration) error {
	<-h.Caught
	c, err := net.DialTimeout("tcp", h.target, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.Write(append(bytes.Clone(h.b), "*1\r\n$4\r\nPING\r\n"...)); err != nil {
		return err
	}
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(got, []byte("+PONG\r\n")) {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return fmt.Errorf("delivering the held request: %w (answers so far %q)", err, got)
		}
	}
	return nil
}

// Close stops the relay and cuts its connections.
func (r *Relay) Close() {
	r.once.Do(func() { close(r.closed) })
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
		go r.requests(c, s)
		go r.replies(s, c)
	}
}

// requests copies a client's commands on c to Redis on s, but for the
// held one (HoldRequest).
func (r *Relay) requests(c, s net.Conn) {
	defer s.Close()
	defer c.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			r.mu.Lock()
			h := r.held
			armed := h != nil && bytes.Contains(buf[:n], h.marker)
			if armed {
				r.held = nil
			}
			r.mu.Unlock()
			if armed {
				h.b = bytes.Clone(buf[:n])
				close(h.caught)
				select {
				case <-h.cut:
				case <-r.closed:
				}
				return
			}
			if _, err := s.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
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
