package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
)

// otlpSink is the OTLP/HTTP receiver ssegate exports its spans to under
// -traces: it reads each export whole and answers it, keeping only
// counts, so that what tracing costs is ssegate's (its exporter's work,
// the sink's is the bench process's).
type otlpSink struct {
	url      string
	srv      *http.Server
	requests atomic.Int64
	bytes    atomic.Int64
}

func startOTLPSink() (*otlpSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &otlpSink{url: "http://" + ln.Addr().String()}
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		s.requests.Add(1)
		s.bytes.Add(n)
		// An empty ExportTraceServiceResponse is an empty protobuf message.
		w.Header().Set("Content-Type", "application/x-protobuf")
	})}
	go s.srv.Serve(ln) //nolint:errcheck // ends with close
	return s, nil
}

func (s *otlpSink) close() { _ = s.srv.Close() }

// note says what the sink received, for the report.
func (s *otlpSink) note() string {
	return fmt.Sprintf("-traces: ssegate (not ssegate@baseline) exported its spans over OTLP/HTTP to a sink in the bench process: %d export requests, %d bytes", s.requests.Load(), s.bytes.Load())
}

// tracesArgs are the flags and environment of a measured ssegate that
// exports spans to the sink; none without -traces.
func (e *env) tracesArgs() (args, environ []string) {
	if e.otlp == nil {
		return nil, nil
	}
	return []string{"-traces", "otlp"}, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + e.otlp.url}
}
