package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/ssegate/ssegate/internal/mockllm"
)

// The upstream of every path is the embedded mock LLM, run in a child
// process of the bench binary: so that the bench process holds only the
// clients' sockets (10,000 streams need 10,000 descriptors on each side, and
// a container may cap them at 20,000), and so that the mock's CPU is
// nobody's measurement. Its chunks are the mock's default, about 240 bytes
// an event; each request says its length and pace in X-Mock-* headers.

// mockCommand is the hidden first argument that makes the bench binary
// serve the mock upstream.
const mockCommand = "serve-mock"

// callsPath answers how many model requests the mock has served, so that a
// measurement can count the generations it caused.
const callsPath = "/_bench/calls"

// serveMock serves the mock LLM on addr until SIGTERM.
func serveMock(addr string) error {
	m := mockllm.New(mockllm.Config{})
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) == callsPath {
				ctx.SetBodyString(strconv.FormatInt(m.Calls(), 10))
				return
			}
			m.Handler(ctx)
		},
		Name:            "mockllm",
		Concurrency:     1 << 20,
		ReadBufferSize:  16 << 10,
		NoDefaultDate:   true,
		CloseOnShutdown: true,
		Logger:          quietLogger{},
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return untilSignal(func() error { return srv.Serve(ln) }, func() {
		_ = m.Close() // ends the streams
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.ShutdownWithContext(sctx)
		_ = ln.Close()
	})
}

// quietLogger discards fasthttp's log lines.
type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// upstreamCalls asks the mock how many model requests it has served.
func (e *env) upstreamCalls() int64 {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(e.mockURL + callsPath)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// startMock starts the mock upstream child.
func (e *env) startMock() (*server, error) {
	s, err := e.start(kindMock)
	if err != nil {
		return nil, err
	}
	e.mockAddr = s.addr
	e.mockURL = "http://" + s.addr
	if e.upstreamCalls() < 0 {
		s.stop()
		return nil, fmt.Errorf("mock upstream on %s does not answer %s", s.addr, callsPath)
	}
	return s, nil
}

// untilSignal runs serve, a peer process's server loop, and calls stop
// when SIGTERM or an interrupt arrives (the suite stops its peers so).
func untilSignal(serve func() error, stop func()) error {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	go func() {
		<-ctx.Done()
		stop()
	}()
	return serve()
}
