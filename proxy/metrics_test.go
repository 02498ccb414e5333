package proxy

import (
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
)

// TestMetrics: the scrape counts decisions, suppressed generations, the
// tokens they saved, upstream attempts, relayed events and key states.
func TestMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(10*time.Millisecond, 10))
	key := newKey("metrics")
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`
	first := e.do(req{key: key, body: body})
	// Its head came: the generation is live (10 events 10 ms apart).
	e.waitState(key, "", cache.StateExecutionStarted)
	joined := e.fetch(req{key: key, body: body}) // join
	first.Body.Close()
	e.waitState(key, "", cache.StateCommitted)
	e.fetch(req{key: key, body: body})                             // hit
	e.fetch(req{key: key, body: `{"other":1}`})                    // conflict
	e.fetch(req{key: "bad key"})                                   // invalid
	e.fetch(req{})                                                 // relay
	e.fetch(req{key: key, body: body, lastEventID: joined.ids[3]}) // resume
	e.wantCalls(2)

	got := e.fetch(req{method: http.MethodGet, path: "/metrics"})
	if got.status != 200 {
		t.Fatalf("GET /metrics: got %d", got.status)
	}
	s := string(got.raw)
	for series, want := range map[string]float64{
		`ssegate_requests_total{decision="miss"}`:       1,
		`ssegate_requests_total{decision="join"}`:       1,
		`ssegate_requests_total{decision="hit"}`:        1,
		`ssegate_requests_total{decision="resume"}`:     1,
		`ssegate_requests_total{decision="conflict"}`:   1,
		`ssegate_requests_total{decision="invalid"}`:    1,
		`ssegate_requests_total{decision="relay"}`:      1,
		`ssegate_duplicates_suppressed_total`:           3,
		`ssegate_upstream_attempts_total{outcome="ok"}`: 2,
		`ssegate_keys{state="committed"}`:               1,
		`ssegate_commits_total`:                         1,
		`ssegate_cache_skipped_total{reason="no_key"}`:  1,
		// the join and the hit each saved the whole answer's 10 output tokens
		`ssegate_tokens_saved_total{kind="output"}`: 20,
	} {
		if v := metricValue(t, s, series); v != want {
			t.Errorf("%s: got %v; want %v", series, v, want)
		}
	}
	if v := metricValue(t, s, "ssegate_events_relayed_total"); v < 2*13 {
		t.Errorf("events relayed: got %v; want at least %d", v, 2*13)
	}
	if v := metricValue(t, s, "ssegate_proxy_first_event_added_seconds_count"); v < 2 {
		t.Errorf("first-event histogram count: got %v; want at least 2", v)
	}
	// Every cause a stream can be aborted with is there from the start,
	// at 0, so that rate() sees its first abort; a cause the provider
	// states itself (an error event) is no abort.
	if v := metricValue(t, s, `ssegate_streams_aborted_total{cause="upstream_read_error"}`); v != 0 {
		t.Errorf("aborts by upstream_read_error: got %v; want 0", v)
	}
	if strings.Contains(s, `ssegate_streams_aborted_total{cause="error_event"}`) {
		t.Error("error_event is counted as an abort cause")
	}
	// The bounds beside what they bound, at their defaults.
	for series, want := range map[string]float64{
		"ssegate_live_generations_limit":   10000,
		"ssegate_live_journal_bytes_limit": 256 << 20,
		"ssegate_store_bytes_limit":        512 << 20,
		"ssegate_keys_limit":               1_000_000,
	} {
		if v := metricValue(t, s, series); v != want {
			t.Errorf("%s: got %v; want %v", series, v, want)
		}
	}
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, key) {
			t.Fatalf("a key leaked into a label: %s", line)
		}
	}
}

// TestMetricsAtWarn: decisions are counted whatever the log level.
func TestMetricsAtWarn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withConfig(func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}))
	key := newKey("warn")
	e.fetch(req{key: key})
	e.fetch(req{key: key})
	s := string(e.fetch(req{method: http.MethodGet, path: "/metrics"}).raw)
	for series, want := range map[string]float64{
		`ssegate_requests_total{decision="miss"}`: 1,
		`ssegate_requests_total{decision="hit"}`:  1,
		`ssegate_duplicates_suppressed_total`:     1,
	} {
		if got := metricValue(t, s, series); got != want {
			t.Errorf("%s: got %v; want %v", series, got, want)
		}
	}
}

// TestDecisionsDocumented: docs/metrics.md lists the decisions of the
// table, notes included, and which of them count as suppressed, as the
// metrics' help does.
func TestDecisionsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	cell := func(metric string) string {
		for _, line := range strings.Split(string(doc), "\n") {
			if cells := strings.Split(strings.TrimSuffix(line, " |"), " | "); len(cells) == 3 && cells[0] == "| `"+metric+"`" {
				return strings.ReplaceAll(cells[2], "`", "")
			}
		}
		t.Fatalf("docs/metrics.md has no row for %s", metric)
		return ""
	}
	seen := map[string]bool{}
	for d := decisionNone + 1; d < numDecisions; d++ {
		if l := d.String(); l == "" || seen[l] {
			t.Errorf("decision %d: label %q empty or not unique", d, l)
		}
		seen[d.String()] = true
	}
	if got, want := cell("ssegate_requests_total{decision}"), decisionList(false); got != want {
		t.Errorf("docs/metrics.md, ssegate_requests_total:\n got %s\nwant %s", got, want)
	}
	if got, want := cell("ssegate_duplicates_suppressed_total"), decisionList(true)+": "; !strings.HasPrefix(got, want) {
		t.Errorf("docs/metrics.md, ssegate_duplicates_suppressed_total:\n got %s\nwant it to begin %q", got, want)
	}
}
