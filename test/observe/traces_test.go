package observe_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/poll"
)

// jaegerModuleDir is the module the trace receiver is built from, with
// the version go.mod pins: the Go module proxy serves it, and the module
// and build caches keep it for the next run.
const jaegerModuleDir = "jaeger"

var (
	jaegerOnce sync.Once
	jaegerBin  string
	jaegerErr  error
)

// buildJaeger builds Jaeger (all-in-one: an OTLP receiver, a store in
// memory and its query API) from jaegerModuleDir into the user's cache
// directory, once per test binary; go build leaves an up-to-date binary
// as it is, so a later run costs no link.
func buildJaeger(t *testing.T) string {
	t.Helper()
	jaegerOnce.Do(func() {
		dir, err := os.UserCacheDir()
		if err != nil {
			dir = os.TempDir()
		}
		jaegerBin = filepath.Join(dir, "ssegate-test", "jaeger")
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		out, err := exec.Command(gobin, "build", "-C", abs(t, jaegerModuleDir), "-trimpath", "-o", jaegerBin, "github.com/jaegertracing/jaeger/cmd/jaeger").CombinedOutput()
		if err != nil {
			jaegerErr = fmt.Errorf("go build -C %s: %v\n%s", jaegerModuleDir, err, out)
		}
	})
	if jaegerErr != nil {
		t.Fatal(jaegerErr)
	}
	return jaegerBin
}

// jaeger is a Jaeger of the test's own.
type jaeger struct {
	otlp  string // OTLP/HTTP endpoint, http://host:port
	query string // query API, http://host:port
}

// startJaeger runs the built Jaeger with its OTLP/HTTP receiver and query
// API on free loopback ports, storing traces in memory, and waits until
// both answer.
func startJaeger(t *testing.T) *jaeger {
	t.Helper()
	bin := buildJaeger(t)
	otlp, query, grpc := gatetest.FreePort(t), gatetest.FreePort(t), gatetest.FreePort(t)
	conf := fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memory
    http:
      endpoint: %q
    grpc:
      endpoint: %q
  jaeger_storage:
    backends:
      memory:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: %q
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memory
`, query, grpc, otlp)
	file := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	p := start(t, "jaeger", exec.Command(bin, "--config", file))
	j := &jaeger{otlp: "http://" + otlp, query: "http://" + query}
	poll.For(t, 30*time.Second, "jaeger ready", func() bool {
		if p.exited() {
			t.Fatalf("jaeger exited:\n%s", p.logs.String())
		}
		for _, u := range []string{j.query + "/api/services", j.otlp + "/v1/traces"} {
			resp, err := http.Get(u)
			if err != nil {
				return false
			}
			resp.Body.Close()
		}
		return true
	})
	return j
}

// span is a span as Jaeger's query API gives it.
type span struct {
	SpanID     string `json:"spanID"`
	Operation  string `json:"operationName"`
	References []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	Tags []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
}

// tag returns the value of the span's attribute key as text, "" if it has
// none.
func (s span) tag(key string) string {
	for _, t := range s.Tags {
		if t.Key == key {
			return fmt.Sprint(t.Value)
		}
	}
	return ""
}

// parent returns the span id s is a child of, "" for a root.
func (s span) parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// trace returns the spans Jaeger holds of the trace id.
func (j *jaeger) trace(id string) ([]span, error) {
	resp, err := http.Get(j.query + "/api/traces/" + id)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	var d struct {
		Data []struct {
			Spans []span `json:"spans"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		return nil, fmt.Errorf("trace %s: %d, %v", id, resp.StatusCode, err)
	}
	var spans []span
	for _, t := range d.Data {
		spans = append(spans, t.Spans...)
	}
	return spans, nil
}

// traceID makes a W3C trace id, and the traceparent of a caller's span in
// it.
func traceID(t *testing.T) (id, traceparent string) {
	t.Helper()
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	id = hex.EncodeToString(b[:16])
	return id, "00-" + id + "-" + hex.EncodeToString(b[16:]) + "-01"
}

// TestTraces: with traces on, a built ssegate exports over OTLP to a real
// Jaeger one server span per request, with its decision and the key's
// state, as a child of the caller's traceparent; a client span per
// upstream call under it with the GenAI attributes, the reason a call was
// made again or given up for the next model, and its time to first token;
// and a duplicate links to the span of the generation that answered it.
func TestTraces(t *testing.T) {
	t.Parallel()
	j := startJaeger(t)
	g := gatetest.Config{Grace: gates.Grace,
		Env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + j.otlp, "OTEL_BSP_SCHEDULE_DELAY=100"}}.Start(t, append(mockFlags, "-mock-delay", "50ms")...)

	// A request whose model fails (503, retried) and falls back, and a
	// duplicate of it that joins its generation (or, on a slow machine,
	// replays it: both link to the generation's span).
	fallback, fallbackParent := traceID(t)
	joinID, joinParent := traceID(t)
	body := chat("mock-down", "traces fallback")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sendTraced(t, g.URL, request{path: "/v1/chat/completions", key: "traces-fallback", body: body}, fallbackParent)
	}()
	// The duplicate comes once the generation streams: its retries and
	// fallback are over by then, its stream of 800 ms not.
	poll.For(t, 10*time.Second, "the first event of traces-fallback's generation", func() bool {
		return keyEvents(t, g.URL, "traces-fallback") > 0
	})
	sendTraced(t, g.URL, request{path: "/v1/chat/completions", key: "traces-fallback", body: body}, joinParent)
	wg.Wait()

	var spans, joined []span
	poll.For(t, 30*time.Second, "the traces in jaeger", func() bool {
		var err error
		if spans, err = j.trace(fallback); err != nil {
			t.Fatal(err)
		}
		if joined, err = j.trace(joinID); err != nil {
			t.Fatal(err)
		}
		// The server span ends after its calls' spans, so it may come in
		// a later export batch than theirs: wait for it.
		return len(kind(spans, "server")) > 0 && len(kind(spans, "client")) >= 2 && len(joined) >= 1
	})

	server := only(t, spans, "server")
	if d, s := server.tag("ssegate.decision"), server.tag("ssegate.key.state"); d != "miss" || s != "committed" {
		t.Errorf("the generation's server span: decision %q, key state %q; want miss, committed", d, s)
	}
	if p, want := server.parent(), fallbackParent[36:52]; p != want {
		t.Errorf("the server span's parent: got %q; want the caller's span %s", p, want)
	}
	calls := kind(spans, "client")
	if len(calls) < 2 {
		t.Fatalf("got %d upstream call spans; want the failed calls and the fallback's", len(calls))
	}
	var retried, fellBack, answered bool
	for _, c := range calls {
		if c.parent() != server.SpanID {
			t.Errorf("call span %q: parent %q; want the server span %s", c.Operation, c.parent(), server.SpanID)
		}
		if op := c.tag("gen_ai.operation.name"); op != "chat" {
			t.Errorf("call span %q: gen_ai.operation.name %q; want chat", c.Operation, op)
		}
		switch c.tag("gen_ai.request.model") {
		case "mock-down":
			retried = retried || c.tag("ssegate.retry.reason") != ""
			fellBack = fellBack || c.tag("ssegate.fallback.reason") != ""
		case "gpt-4o-mini":
			answered = true
			for _, a := range []string{"gen_ai.response.model", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "ssegate.time_to_first_token", "gen_ai.provider.name"} {
				if c.tag(a) == "" {
					t.Errorf("the answering call's span has no %s: %v", a, c.Tags)
				}
			}
		default:
			t.Errorf("call span %q: gen_ai.request.model %q", c.Operation, c.tag("gen_ai.request.model"))
		}
	}
	if !retried || !fellBack || !answered {
		t.Errorf("call spans: a retried call %v, a call fallen back from %v, the fallback's answer %v; want all", retried, fellBack, answered)
	}

	join := only(t, joined, "server")
	if d := join.tag("ssegate.decision"); d != "join" && d != "hit" {
		t.Errorf("the duplicate's server span: decision %q; want join (or hit)", d)
	}
	if len(kind(joined, "client")) != 0 {
		t.Errorf("the duplicate's trace has upstream calls: it made a generation")
	}
	if !slices.ContainsFunc(join.References, func(r struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	}) bool {
		return r.TraceID == fallback && r.SpanID == server.SpanID
	}) {
		t.Errorf("the join's span does not link to the generation's span %s: %v", server.SpanID, join.References)
	}
}

// sendTraced is send with the caller's traceparent.
func sendTraced(t *testing.T, base string, r request, traceparent string) {
	t.Helper()
	r.traceparent = traceparent
	if a := send(t, base, r); a.status != 200 {
		t.Errorf("POST %s: got status %d; want 200", r.path, a.status)
	}
}

// keyEvents returns the events the generation of key has recorded, as
// GET /keys/{key} says (0 while there is none).
func keyEvents(t *testing.T, base, key string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/keys/"+key, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sk-observe")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ki struct {
		Events int `json:"events"`
	}
	if resp.StatusCode != http.StatusOK {
		return 0
	}
	if err := json.NewDecoder(resp.Body).Decode(&ki); err != nil {
		t.Fatalf("GET /keys/%s: %v", key, err)
	}
	return ki.Events
}

// kind returns the spans of a span.kind.
func kind(spans []span, k string) []span {
	var out []span
	for _, s := range spans {
		if s.tag("span.kind") == k {
			out = append(out, s)
		}
	}
	return out
}

// only returns the one span of kind k, failing the test otherwise.
func only(t *testing.T, spans []span, k string) span {
	t.Helper()
	ks := kind(spans, k)
	if len(ks) != 1 {
		var names []string
		for _, s := range spans {
			names = append(names, s.Operation+"/"+s.tag("span.kind"))
		}
		t.Fatalf("got %d %s spans; want 1 (spans: %s)", len(ks), k, strings.Join(names, ", "))
	}
	return ks[0]
}
