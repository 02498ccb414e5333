package main

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"time"
)

// httputilCommand is the hidden first argument that makes the bench binary
// serve the httputil baseline instead of running the suite, so that the
// baseline is a process of its own whose CPU and memory /proc can show.
const httputilCommand = "serve-httputil"

// serveHTTPUtil runs the Go standard library baseline: httputil.ReverseProxy
// with FlushInterval -1 (flush after every write), listening on addr, in
// front of upstream, until SIGTERM.
//
// The handler reads the request body into memory before proxying. Without
// that, the server closes the inbound body once the response head is
// written while the Transport may still be reading it, which kills the
// upstream connection and cuts a few percent of streams
// (net/http closes a request body once the response is written, see
// http.Request.Body): the baseline would be a broken peer.
func serveHTTPUtil(addr, upstream string) error {
	u, err := url.Parse(upstream)
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024, // as nginx's keepalive 1024
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(u) },
		FlushInterval: -1,
		Transport:     tr,
		ErrorLog:      log.New(os.Stderr, "httputil: ", log.LstdFlags),
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		rp.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	err = untilSignal(func() error { return srv.Serve(ln) }, func() { _ = srv.Close() })
	if err != http.ErrServerClosed {
		return err
	}
	return nil
}
