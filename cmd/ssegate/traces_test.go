package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestTracesOn: spans are off by default, on with -traces otlp or the
// standard environment, and off again with -traces none,
// OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED.
func TestTracesOn(t *testing.T) {
	t.Parallel()
	endpoint := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
	for _, c := range []struct {
		flag    string
		env     map[string]string
		want    bool
		wantErr bool
	}{
		{"", nil, false, false},
		{"otlp", nil, true, false},
		{"", endpoint, true, false},
		{"", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true, false},
		{"", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, false},
		{"", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, false, false},
		{"none", endpoint, false, false},
		{"otlp", map[string]string{"OTEL_SDK_DISABLED": "true"}, false, false},
		{"", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, true},
		{"jaeger", nil, false, true},
	} {
		got, err := tracesOn(c.flag, env(c.env))
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("-traces %q, env %v: got %v, %v; want %v, error %v", c.flag, c.env, got, err, c.want, c.wantErr)
		}
	}
}

// otlpSink is an OTLP/HTTP receiver on loopback that keeps the spans it
// is sent.
type otlpSink struct {
	url   string
	mu    sync.Mutex // guards spans
	spans map[string]map[string]string
}

func newOTLPSink(t *testing.T) *otlpSink {
	s := &otlpSink{spans: map[string]map[string]string{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "not a trace export", http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					a := map[string]string{}
					for _, kv := range sp.Attributes {
						a[kv.Key] = kv.Value.GetStringValue()
					}
					s.spans[sp.Name] = a
				}
			}
		}
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ = proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Write(b) //nolint:errcheck // the exporter reads it
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// TestTracesFlushedAtShutdown: with -traces otlp, the spans of a request
// go over OTLP/HTTP to the endpoint OTEL_EXPORTER_OTLP_ENDPOINT names,
// and a shutdown sends those still batched before run returns (the
// batch would otherwise wait 5 s).
func TestTracesFlushedAtShutdown(t *testing.T) {
	// Not parallel: the exporter reads the process's environment.
	sink := newOTLPSink(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.url)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
	addr, _, stop := startRun(t, []string{"-listen", "127.0.0.1:0", "-upstream", "mock", "-mock-delay", "1ms", "-traces", "otlp"}, env(nil))
	rq, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions",
		bytes.NewReader([]byte(`{"model":"gpt-4o-mini","stream":true,"messages":[]}`)))
	rq.Header.Set("Idempotency-Key", "flush-1")
	resp, err := http.DefaultClient.Do(rq)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck // read to its end
	resp.Body.Close()
	time.Sleep(100 * time.Millisecond) // the answer's span ends as its connection is handed back
	sink.mu.Lock()
	before := len(sink.spans)
	sink.mu.Unlock()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if before != 0 {
		t.Errorf("%d spans exported before the shutdown; want them batched", before)
	}
	if a, ok := sink.spans["POST"]; !ok || a["ssegate.decision"] != "miss" || a["ssegate.key.state"] != "committed" {
		t.Errorf("request span: %v (found %v); want decision miss, state committed (spans: %v)", a, ok, sink.spans)
	}
	if a, ok := sink.spans["chat gpt-4o-mini"]; !ok || a["gen_ai.request.model"] != "gpt-4o-mini" {
		t.Errorf("call span: %v (found %v); want one for gpt-4o-mini (spans: %v)", a, ok, sink.spans)
	}
}
