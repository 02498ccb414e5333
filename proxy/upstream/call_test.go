package upstream

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/poll"
	"github.com/valyala/fasthttp"
)

// holdServer is a loopback HTTP server that reads each request whole and
// then answers nothing: a call to it awaits its head. got counts the
// requests read whole.
type holdServer struct {
	url string
	got atomic.Int64
}

func newHoldServer(t *testing.T) *holdServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &holdServer{url: "http://" + ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if _, err := r.Body.Read(make([]byte, 1<<16)); err != nil && err.Error() != "EOF" {
						return
					}
					s.got.Add(1)
				}
			}()
		}
	}()
	return s
}

func callRequest(url string) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI(url + "/v1/responses")
	req.Header.SetMethod("POST")
	req.SetBodyString(`{"model":"m","stream":true,"input":"` + strings.Repeat("x", 100) + `"}`)
	return req
}

// TestCallInterrupt: a call that awaits its head is ended by Interrupt at
// once, not at the head's bound; a Call interrupted before its call fails
// the call before its request is written.
func TestCallInterrupt(t *testing.T) {
	t.Parallel()
	s := newHoldServer(t)
	up, err := New(s.url, testConfig(), nil, nil) // a 30 s head bound
	if err != nil {
		t.Fatal(err)
	}
	var call Call
	req := callRequest(s.url)
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	done := make(chan error, 1)
	go func() { done <- up.DoCall(req, resp, true, &call) }()
	if !poll.Until(10*time.Second, func() bool { return s.got.Load() == 1 }) {
		t.Fatal("the upstream did not get the request")
	}
	interrupted := time.Now()
	call.Interrupt()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the interrupted call: got an answer; want an error")
		}
		t.Logf("the call ended %v after Interrupt: %v", time.Since(interrupted).Round(time.Millisecond), err)
	case <-time.After(time.Second):
		t.Fatal("the call still awaits its head a second after Interrupt")
	}
	// Interrupted already: the next call is not written.
	again := callRequest(s.url)
	defer fasthttp.ReleaseRequest(again)
	if err := up.DoCall(again, resp, true, &call); !IsInterrupted(err) {
		t.Fatalf("a call after Interrupt: got %v; want it interrupted before it was written", err)
	}
	if got := s.got.Load(); got != 1 {
		t.Fatalf("requests the upstream read whole: got %d; want 1", got)
	}
}

// TestCallStaleConnection: a call with a Call, whose body fasthttp sends
// as a stream and so would not send again itself, still passes over a
// pooled connection the upstream closed while idle, for a new one, its
// body read again from its start.
func TestCallStaleConnection(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var closed atomic.Int64
	var bodies atomic.Value
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, 1<<16)
		n, _ := io.ReadFull(r.Body, b)
		bodies.Store(string(b[:n]))
		w.Write([]byte("ok")) //nolint:errcheck // the test reads it
	}), IdleTimeout: 50 * time.Millisecond,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed {
				closed.Add(1)
			}
		}}
	go srv.Serve(ln) //nolint:errcheck // closed by the cleanup
	t.Cleanup(func() { srv.Close() })
	url := "http://" + ln.Addr().String()
	up, err := New(url, testConfig(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		var call Call
		req := callRequest(url)
		want := string(req.Body())
		resp := fasthttp.AcquireResponse()
		if err := up.DoCall(req, resp, false, &call); err != nil {
			t.Fatalf("call %d: %v; want the answer, on a new connection", i, err)
		}
		if got := bodies.Load(); got != want {
			t.Fatalf("call %d: the upstream read %q; want the body whole", i, got)
		}
		io.Copy(io.Discard, resp.BodyStream()) //nolint:errcheck // read whole, the connection goes back to the pool
		resp.CloseBodyStream()                 //nolint:errcheck // read whole
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
		if !poll.Until(10*time.Second, func() bool { return closed.Load() > int64(i) }) {
			t.Fatal("the upstream did not close the idle connection")
		}
	}
}
