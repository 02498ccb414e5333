package proxy

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// failingListener fails its first Accepts with errs, then accepts from ln.
type failingListener struct {
	net.Listener
	errs []error
}

func (l *failingListener) Accept() (net.Conn, error) {
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		return nil, err
	}
	return l.Listener.Accept()
}

// TestListenerWaitsOut: a shortage of descriptors is waited out and
// counted, and the next connection taken; any other accept error ends
// Accept at once, as it did.
func TestListenerWaitsOut(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Upstreams: []string{"http://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	short := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	l := p.Listener(&failingListener{Listener: ln, errs: []error{short, short}})
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
			c.Read(make([]byte, 1)) //nolint:errcheck // held until the test closes
		}
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("Accept through two EMFILEs: got %v; want the connection", err)
	}
	c.Close()
	if n := testutil.ToFloat64(p.m.acceptErrors); n != 2 {
		t.Errorf("ssegate_accept_errors_total: got %v; want 2", n)
	}
	other := errors.New("listener broken")
	if _, err := p.Listener(&failingListener{Listener: ln, errs: []error{other}}).Accept(); !errors.Is(err, other) {
		t.Errorf("Accept with another error: got %v; want it returned", err)
	}
}
