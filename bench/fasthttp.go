package main

import (
	"bufio"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/valyala/fasthttp"
)

// fasthttpCommand is the hidden first argument that makes the bench binary
// serve the minimal fasthttp relay, a process of its own as httputil's.
const fasthttpCommand = "serve-fasthttp"

// serveFastHTTP runs the smallest relay the libraries ssegate is built on
// allow: a fasthttp server whose handler sends the request through a
// HostClient with StreamResponseBody and copies the body to the client
// with SetBodyStreamWriter, flushing after every read of the upstream. It
// parses nothing and records nothing, so it is the floor under ssegate's
// costs on this machine: what fasthttp and the Go runtime take to relay a
// stream at all. It listens on addr, in front of upstream, until SIGTERM.
func serveFastHTTP(addr, upstream string) error {
	u, err := url.Parse(upstream)
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	hc := &fasthttp.HostClient{
		Addr:               u.Host,
		StreamResponseBody: true,
		MaxConns:           1 << 20,
		ReadBufferSize:     4 << 10, // as ssegate's upstream connections
	}
	handler := func(ctx *fasthttp.RequestCtx) {
		req := fasthttp.AcquireRequest()
		ctx.Request.CopyTo(req)
		req.Header.Del("Accept-Encoding")
		req.SetHost(u.Host)
		resp := fasthttp.AcquireResponse()
		err := hc.Do(req, resp)
		fasthttp.ReleaseRequest(req)
		if err != nil {
			fasthttp.ReleaseResponse(resp)
			ctx.Error("upstream: "+err.Error(), fasthttp.StatusBadGateway)
			return
		}
		resp.Header.CopyTo(&ctx.Response.Header)
		body := resp.BodyStream()
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			defer fasthttp.ReleaseResponse(resp)
			defer resp.CloseBodyStream() //nolint:errcheck // done with it
			buf := make([]byte, 4<<10)
			for {
				n, err := body.Read(buf)
				if n > 0 {
					if _, werr := w.Write(buf[:n]); werr != nil || w.Flush() != nil {
						return
					}
				}
				if err != nil {
					return // io.EOF: the whole body; otherwise the client sees a cut stream
				}
			}
		})
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &fasthttp.Server{Handler: handler, ReadBufferSize: 8 << 10, IdleTimeout: time.Minute}
	return untilSignal(func() error { return srv.Serve(ln) }, func() {
		_ = srv.Shutdown()
		_ = ln.Close()
	})
}
