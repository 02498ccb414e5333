package proxy

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// Listener returns ln made to ride out the accept errors of a process
// short of file descriptors or kernel memory, and of a connection that
// broke before it was taken: fasthttp's Serve ends on any accept error
// but a timeout, and with it every stream the process relays, where the
// streams it holds should go on and new connections wait in the
// backlog. Such an error is counted (ssegate_accept_errors_total), logged
// at most once a second, and waited out, from 5 ms doubling to a second,
// as net/http's server does; any other error ends Serve as before.
func (p *Proxy) Listener(ln net.Listener) net.Listener {
	return &keepAccepting{Listener: ln, p: p}
}

type keepAccepting struct {
	net.Listener
	p      *Proxy
	logged time.Time // only Accept's goroutine (Serve's) uses it
}

func (l *keepAccepting) Accept() (net.Conn, error) {
	var wait time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil || !acceptRetryable(err) {
			return c, err
		}
		l.p.hooks.acceptError()
		wait = min(max(2*wait, 5*time.Millisecond), time.Second)
		if now := time.Now(); now.Sub(l.logged) >= time.Second {
			l.logged = now
			l.p.log.Warn("accept failed; waiting to accept again", "err", err.Error(), "wait", wait.String())
		}
		time.Sleep(wait)
	}
}

// acceptRetryable reports whether err is an accept error that passes.
func acceptRetryable(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM} { // ECONNABORTED: Go accepts again itself
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
