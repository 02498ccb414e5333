package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary serve as the suite's child processes (the
// httputil baseline and the mock upstream), as the bench binary does.
func TestMain(m *testing.M) {
	if child(os.Args[1:]) {
		return
	}
	os.Exit(m.Run())
}

// sseBody is a body with what the parser must handle: ids, comments, a ping
// block, CRLF line ends, a multi-line data field and [DONE].
const sseBody = "id: 1\ndata: {\"a\":1}\n\n" +
	": ping\n\n" +
	"id: 2\r\ndata: line one\r\ndata: line two\r\n\r\n" +
	"event: message\ndata: x\n\n" +
	"id: 3\ndata: [DONE]\n\n"

func TestParserEverySplit(t *testing.T) {
	for cut := 0; cut <= len(sseBody); cut++ {
		var p sseParser
		p.reset(true, false)
		p.feed([]byte(sseBody[:cut]))
		p.feed([]byte(sseBody[cut:]))
		if p.events != 4 || !p.lastDone || p.errEvent {
			t.Fatalf("cut %d: events %d, done %v, error %v; want 4, true, false", cut, p.events, p.lastDone, p.errEvent)
		}
		if got := strings.Join(p.ids, ","); got != "1,2,3" {
			t.Fatalf("cut %d: ids %q; want 1,2,3", cut, got)
		}
	}
}

func TestParserErrorEvents(t *testing.T) {
	for _, body := range []string{
		"event: error\ndata: {\"error\":{\"type\":\"stream_aborted\"}}\n\n",
		"data: {\"error\":{\"message\":\"boom\"}}\n\ndata: [DONE]\n\n",
	} {
		var p sseParser
		p.reset(false, false)
		p.feed([]byte(body))
		if !p.errEvent {
			t.Errorf("%q: no error event seen", body)
		}
	}
}

// serveCanned answers every request with resp, written in pieces of size n
// so that chunk heads, CRLFs and SSE lines straddle reads; with once, it
// closes the connection after the first answer.
func serveCanned(t *testing.T, resp string, n int, once bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					// One request per read is enough for these tests.
					if _, err := c.Read(buf); err != nil {
						return
					}
					for i := 0; i < len(resp); i += n {
						if _, err := c.Write([]byte(resp[i:min(i+n, len(resp))])); err != nil {
							return
						}
						time.Sleep(time.Millisecond / 4)
					}
					if once {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// chunk frames s as HTTP/1.1 chunks of at most size bytes.
func chunk(s string, size int) string {
	var b strings.Builder
	for i := 0; i < len(s); i += size {
		part := s[i:min(i+size, len(s))]
		b.WriteString(strconv.FormatInt(int64(len(part)), 16) + ";ext=1\r\n" + part + "\r\n")
	}
	return b.String() + "0\r\nTrailer: x\r\n\r\n"
}

func TestRoundTrip(t *testing.T) {
	head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nIdempotent-Replayed: true\r\nTransfer-Encoding: chunked\r\n\r\n"
	tests := []struct {
		name      string
		resp      string
		piece     int
		wantOK    bool
		wantKeep  bool
		wantState string
		once      bool
	}{
		{"chunked, keep-alive", head + chunk(sseBody, 7), 5, true, true, "", false},
		{"chunked, one piece", head + chunk(sseBody, 1000), 1 << 20, true, true, "", false},
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(sseBody)) + "\r\n\r\n" + sseBody, 3, true, true, "", false},
		{"truncated chunked body", head + chunk(sseBody, 7)[:40], 1000, false, false, "unexpected EOF", true},
		{"503", "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\nConnection: close\r\n\r\nbusy now!", 1000, false, false, "status 503: busy now!", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveCanned(t, tc.resp, tc.piece, tc.once)
			c := newClientConn(addr)
			defer c.close()
			first := 0
			res := c.roundTrip([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), time.Now().Add(5*time.Second), true, func() { first++ }, nil)
			if got := res.ok(4); got != tc.wantOK {
				t.Fatalf("ok = %v (%s); want %v", got, res.problem(4), tc.wantOK)
			}
			if tc.wantState != "" && !strings.Contains(res.problem(4), tc.wantState) {
				t.Errorf("problem %q; want it to contain %q", res.problem(4), tc.wantState)
			}
			if tc.wantOK {
				if first != 1 || res.ttfe <= 0 {
					t.Errorf("onFirst ran %d times, ttfe %v; want once, > 0", first, res.ttfe)
				}
				if len(res.ids) != 3 {
					t.Errorf("ids %q; want 3", res.ids)
				}
			}
			if keep := c.nc != nil; keep != tc.wantKeep {
				t.Errorf("connection kept = %v; want %v", keep, tc.wantKeep)
			}
			if tc.wantKeep {
				// The kept connection carries a second exchange.
				res = c.roundTrip([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), time.Now().Add(5*time.Second), false, nil, nil)
				if !res.ok(4) {
					t.Errorf("second request on the kept connection: %s", res.problem(4))
				}
			}
		})
	}
}

func TestStats(t *testing.T) {
	d := func(xs ...int) []time.Duration {
		out := make([]time.Duration, len(xs))
		for i, x := range xs {
			out[i] = time.Duration(x)
		}
		return out
	}
	tests := []struct {
		xs   []time.Duration
		p    float64
		want time.Duration
	}{
		{d(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 50, 5},
		{d(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10},
		{d(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 0, 1},
		{d(7), 99, 7},
		{nil, 50, 0},
	}
	for _, tc := range tests {
		if got := percentile(tc.xs, tc.p); got != tc.want {
			t.Errorf("percentile(%v, %v) = %v; want %v", tc.xs, tc.p, got, tc.want)
		}
	}
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median(3,1,2) = %v; want 2", got)
	}
	if got := median([]float64{4, 1, math.NaN(), 2, 3}); got != 2.5 {
		t.Errorf("median with NaN = %v; want 2.5", got)
	}
	if got := median(nil); !math.IsNaN(got) {
		t.Errorf("median() = %v; want NaN", got)
	}
	if got := ratio(1, 0); !math.IsNaN(got) {
		t.Errorf("ratio(1, 0) = %v; want NaN", got)
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"-quick", "-scenarios", "a,c", "-slow", "100,2000@50ms,10000@250ms:48"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.rounds != 1 || o.duration != 300*time.Millisecond || strings.Join(o.scenarios, ",") != "a,c" {
		t.Errorf("quick: rounds %d, duration %v, scenarios %v; want 1, 300ms, [a c]", o.rounds, o.duration, o.scenarios)
	}
	want := []slowStep{{100, 10 * time.Millisecond, 50}, {2000, 50 * time.Millisecond, 50}, {10000, 250 * time.Millisecond, 48}}
	if len(o.slow) != len(want) {
		t.Fatalf("slow %v; want %v", o.slow, want)
	}
	for i := range want {
		if o.slow[i] != want[i] {
			t.Errorf("slow[%d] = %+v; want %+v", i, o.slow[i], want[i])
		}
	}
	if o.peers[kindBaseline] {
		t.Error("a baseline peer without -baseline")
	}
	for _, k := range []kind{kindDirect, kindHTTPUtil, kindFastHTTP, kindNginx, kindCaddy, kindPortkey, kindSsegate} {
		if !o.peers[k] {
			t.Errorf("default -peers lack %s", k)
		}
	}
	if o, err := parseFlags([]string{"-peers", "caddy, portkey"}, io.Discard); err != nil || !o.peers[kindCaddy] || !o.peers[kindPortkey] || o.peers[kindNginx] || o.peers[kindSsegate] {
		t.Errorf("-peers caddy,portkey: %v, peers %v; want direct, caddy and portkey", err, o.peers)
	}
	if o, err := parseFlags([]string{"-baseline", "/old/ssegate", "-peers", "ssegate"}, io.Discard); err != nil || !o.peers[kindBaseline] || o.baseline != "/old/ssegate" {
		t.Errorf("-baseline: %v; want the baseline among the peers", err)
	}
	for _, bad := range [][]string{{"-scenarios", "z"}, {"-rounds", "0"}, {"-slow", "10@x"}, {"-peers", "traefik"}, {"-redis-join", "1,2"}, {"-redis-load", "x"}, {"extra"},
		{"-baseline", "/old/ssegate", "-peers", "httputil"}, {"-soak", "-baseline", "/old/ssegate"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) succeeded; want an error", bad)
		}
	}
}

// fakeReport has two rounds of scenario a and a sweep.
func fakeReport() *report {
	mk := func(scn, step string, round int, p path, evs, cpu float64) measurement {
		m := newMeasurement(scn, step, round, p, 8)
		m.EventsPerSec, m.StreamsPerSec, m.TTFEP50us, m.TTFEP99us = num(evs), num(evs/200), 100, 200
		m.Streams, m.OK, m.UpstreamCalls = 10, 10, 10
		if p.kind != kindDirect {
			m.CPUusPerEvent, m.PeakRSS, m.TTFEP50us = num(cpu), 20<<20, 150
		}
		return m
	}
	rep := &report{Date: "2026-01-02T03:04:05Z", Cores: 2, Rounds: 2, Measure: "1s"}
	for round := 1; round <= 2; round++ {
		rep.Measurements = append(rep.Measurements,
			mk("a", "8 streams", round, pathDirect, 1000*float64(round), 0),
			mk("a", "8 streams", round, pathSsegate, 500*float64(round), 2))
		for _, c := range []string{"c=1", "c=8"} {
			rep.Measurements = append(rep.Measurements,
				mk("sweep", c, round, pathDirect, 1000, 0), mk("sweep", c, round, pathNginx, 800, 1))
		}
	}
	failed := newMeasurement("a", "8 streams", 3, pathNginx, 8)
	failed.Error = "nginx did not come up"
	rep.Measurements = append(rep.Measurements, failed)
	return rep
}

// addRounds adds to a fakeReport the two rounds of its step of scenario
// a through p: round N at N×eventsPerSec, cpu µs an event.
func addRounds(rep *report, p path, eventsPerSec, cpu float64) {
	for round := 1; round <= 2; round++ {
		m := newMeasurement("a", "8 streams", round, p, 8)
		m.EventsPerSec, m.CPUusPerEvent = num(eventsPerSec*float64(round)), num(cpu)
		rep.Measurements = append(rep.Measurements, m)
	}
}

func TestMarkdown(t *testing.T) {
	md := fakeReport().markdown()
	for _, want := range []string{
		"### (a) Saturation",
		"| direct | 1500 | 1.00× |",        // median of 1000 and 2000
		"| ssegate | 750 | 0.50× |",        // ratio from the same round
		"| 2.00 | 20.0 | 0 / 20 |",         // CPU, peak RSS, errors over rounds
		"nginx, 8 streams: round 3: nginx", // a failed measurement is said
		"| 8 | nginx | 800 | 0.80× |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

func TestBaselineSummary(t *testing.T) {
	rep := fakeReport()
	if strings.Contains(rep.markdown(), "@baseline") {
		t.Error("a report without baseline rows has a baseline summary")
	}
	addRounds(rep, pathBaseline, 400, 2.5)
	rep.Baseline, rep.BaselineRev = "/old/ssegate", "0123456789abcdef (modified)"
	md := rep.markdown()
	for _, want := range []string{
		"ssegate@baseline is `/old/ssegate` (built from 0123456789ab (modified))",
		"### ssegate against ssegate@baseline",
		"| a | 8 streams | ssegate | events/s | 750 | 600 | 1.25× | 2.00 | 2.50 | 0.80× |", // ratios within each round
		"| ssegate@baseline | 600 | 0.40× |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

func TestSVG(t *testing.T) {
	svg := fakeReport().svg()
	if err := xml.Unmarshal([]byte(svg), new(struct{ XMLName xml.Name })); err != nil {
		t.Fatalf("SVG is not well-formed XML: %v\n%s", err, svg)
	}
	for _, want := range []string{"<polyline", ">direct<", ">nginx<", "log scale"} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if (&report{}).svg() != "" {
		t.Error("SVG of a report without a sweep is not empty")
	}
}

func TestJSONKeepsNaNAsNull(t *testing.T) {
	b, err := json.Marshal(fakeReport())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"proxy_cpu_us_per_event":null`)) {
		t.Error("direct's CPU per event is not null in the JSON")
	}
	var back report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Measurements) != 13 {
		t.Errorf("%d measurements after a round trip; want 13", len(back.Measurements))
	}
}

// TestQuickRun runs a short suite against the real ssegate binary (built
// from ./cmd/ssegate, or $SSEGATE_BIN) and checks that every stream of
// every path arrived whole, that fan-out made one generation per group and
// that replay and resume made none.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and runs load")
	}
	// caddy and portkey have tests of their own (TestCaddyRun,
	// TestPortkeyRun): they are built or installed over the network first.
	rep, md, out := runQuick(t, "-scenarios", "a,b,c,d,e,f,sweep", "-duration", "150ms", "-conc", "8", "-slow", "16@5ms:20",
		"-sweep", "1,4", "-fanout-pace", "3ms", "-events", "40", "-peers", "httputil,fasthttp,nginx,ssegate")
	seen := map[string]bool{}
	peers := map[kind]bool{}
	for _, m := range rep.Measurements {
		name := m.Scenario + " " + m.Path
		seen[m.Scenario] = true
		peers[m.Server] = true
		if m.Error != "" {
			t.Errorf("%s: %s", name, m.Error)
			continue
		}
		if m.Errors > 0 || m.OK == 0 {
			t.Errorf("%s: %d of %d streams failed: %v", name, m.Errors, m.Streams, m.ErrorSamples)
		}
		if m.Server != kindDirect && !(m.CPUSec >= 0) {
			t.Errorf("%s: proxy CPU %v; want a number", name, m.CPUSec)
		}
		switch {
		case m.Scenario == "e" && m.Path == "ssegate+key" && m.UpstreamCalls != m.Groups:
			t.Errorf("%s: %d upstream calls for %d groups; want one a group", name, m.UpstreamCalls, m.Groups)
		case (m.Scenario == "d" || m.Scenario == "f") && m.Server == kindSsegate && m.UpstreamCalls != 0:
			t.Errorf("%s: %d upstream calls; want 0", name, m.UpstreamCalls)
		case m.Scenario == "d" && m.Server == kindSsegate && m.Replayed != m.Streams:
			t.Errorf("%s: %d of %d answers replayed; want all", name, m.Replayed, m.Streams)
		}
	}
	for _, k := range []kind{kindDirect, kindHTTPUtil, kindFastHTTP, kindSsegate} {
		if !peers[k] {
			t.Errorf("peer %s has no measurement", k)
		}
	}
	if peers[kindBaseline] || rep.Baseline != "" || strings.Contains(md, "@baseline") {
		t.Error("a run without -baseline has baseline rows")
	}
	for _, s := range scenarios {
		if !seen[s.id] && s.id != "redis" && s.id != "board" && s.id != "shard" { // TestRedisScenario, TestBoardRun, TestShardScenario
			t.Errorf("scenario %s has no measurement", s.id)
		}
	}
	if md, _ := filepath.Glob(filepath.Join(out, "bench-*.md")); len(md) != 1 {
		t.Errorf("%d Markdown files; want 1", len(md))
	}
	if svg, _ := filepath.Glob(filepath.Join(out, "bench-*.svg")); len(svg) != 1 {
		t.Errorf("%d SVG files; want 1", len(svg))
	}
}

// TestBaselineRun runs a short suite with -baseline (the same ssegate
// binary behind a wrapper that notes how it was started) and checks that
// both baseline paths were measured right after their ssegate counterparts
// in every scenario that measures those, with the same flags and
// environment, every stream whole, and that their rows are in every table,
// the summary, the JSON and the SVG.
func TestBaselineRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and runs load")
	}
	bin := os.Getenv("SSEGATE_BIN")
	dir := t.TempDir()
	if bin == "" {
		bin = filepath.Join(dir, "ssegate")
		cmd := exec.Command("go", "build", "-o", bin, "../cmd/ssegate")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build ssegate: %v\n%s", err, out)
		}
	}
	started := filepath.Join(dir, "started")
	wrapper := filepath.Join(dir, "old-ssegate")
	script := fmt.Sprintf("#!/bin/sh\necho \"$BENCH_MARK $*\" >>'%s'\nexec '%s' \"$@\"\n", started, bin)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	rep, md, out := runQuick(t, "-scenarios", "a,b,c,d,e,sweep", "-peers", "ssegate", "-baseline", wrapper, "-ssegate", bin,
		"-ssegate-args", "-heartbeat 20s", "-ssegate-env", "BENCH_MARK=marked",
		"-duration", "150ms", "-conc", "8", "-slow", "16@5ms:20", "-sweep", "4", "-fanout-pace", "3ms", "-events", "40")
	if rep.Baseline != wrapper {
		t.Errorf("JSON baseline %q; want %q", rep.Baseline, wrapper)
	}
	events := map[string]int64{"a": 40, "b": 10, "c": 20, "e": 40, "sweep": 40}
	order := map[string][]string{} // scenario → paths in the order measured
	baselines := 0
	for _, m := range rep.Measurements {
		name := m.Scenario + " " + m.Path
		order[m.Scenario] = append(order[m.Scenario], m.Path)
		if m.Server != kindBaseline {
			if strings.Contains(m.Path, "@baseline") {
				t.Errorf("%s: server %q", name, m.Server)
			}
			continue
		}
		baselines++
		if m.Error != "" {
			t.Errorf("%s: %s", name, m.Error)
			continue
		}
		if m.Errors > 0 || m.OK == 0 || m.OK != m.Streams || m.Events != m.Streams*events[m.Scenario] {
			t.Errorf("%s: %d of %d streams whole, %d events (%d a stream); errors %v", name, m.OK, m.Streams, m.Events, events[m.Scenario], m.ErrorSamples)
		}
		if !(m.CPUSec >= 0) {
			t.Errorf("%s: proxy CPU %v; want a number", name, m.CPUSec)
		}
		if m.Scenario == "e" && m.Path == pathBaselineKey.name && m.UpstreamCalls != m.Groups {
			t.Errorf("%s: %d upstream calls for %d groups; want one a group", name, m.UpstreamCalls, m.Groups)
		}
	}
	want := "direct ssegate ssegate@baseline ssegate+key ssegate@baseline+key"
	for scn := range events {
		if got := strings.Join(order[scn], " "); got != want {
			t.Errorf("scenario %s measured %q; want %q", scn, got, want)
		}
	}
	if got := strings.Join(order["d"], " "); got != "direct ssegate replay" {
		t.Errorf("scenario d measured %q; want no baseline", got)
	}
	// Every baseline measurement started the wrapper once, with ssegate's
	// flags and environment.
	b, err := os.ReadFile(started)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != baselines || baselines != 2*len(events) {
		t.Errorf("baseline started %d times for %d measurements; want %d", len(lines), baselines, 2*len(events))
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "marked -listen ") || !strings.Contains(l, " -log-level warn ") || !strings.HasSuffix(l, " -heartbeat 20s") {
			t.Errorf("baseline started as %q; want ssegate's environment and flags", l)
		}
	}
	for _, sec := range strings.Split(md, "\n### ")[1:] {
		title, _, _ := strings.Cut(sec, "\n")
		switch {
		case strings.HasPrefix(title, "ssegate against ssegate@baseline"):
			for scn := range events {
				for _, p := range []string{"ssegate", "ssegate+key"} {
					if !summaryHas(sec, scn, p, "") {
						t.Errorf("summary lacks a measured %s row of %s:\n%s", p, scn, sec)
					}
				}
			}
		case strings.HasPrefix(title, "(d)"):
			if strings.Contains(sec, "@baseline") {
				t.Errorf("table %s has baseline rows", title)
			}
		default:
			for _, p := range []string{"ssegate@baseline", "ssegate@baseline+key"} {
				if !strings.Contains(sec, " "+p+" | ") {
					t.Errorf("table %s lacks %s:\n%s", title, p, sec)
				}
			}
		}
	}
	if !strings.Contains(md, "### ssegate against ssegate@baseline") {
		t.Errorf("no baseline summary:\n%s", md)
	}
	svg, _ := filepath.Glob(filepath.Join(out, "bench-*.svg"))
	if len(svg) != 1 {
		t.Fatalf("%d SVG files; want 1", len(svg))
	}
	if b, err := os.ReadFile(svg[0]); err != nil || !bytes.Contains(b, []byte(">ssegate@baseline<")) || !bytes.Contains(b, []byte(">ssegate@baseline+key<")) {
		t.Errorf("SVG lacks the baseline series (%v)", err)
	}
}

// summaryHas reports whether a summary in sec has a row of path p in
// scenario scn with both ratios measured: with against "", a row of the
// baseline summary; otherwise a row of the peer summary against that
// peer.
func summaryHas(sec, scn, p, against string) bool {
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if against != "" {
			// The peer summary's fourth column names the peer; drop it.
			if len(cells) != 11 || cells[3] != against {
				continue
			}
			cells = append(cells[:3:3], cells[4:]...)
		}
		if len(cells) != 10 || cells[0] != scn || cells[2] != p || !strings.HasSuffix(cells[6], "×") {
			continue
		}
		// CPU time comes in 10 ms ticks: a short quick-run measurement
		// on a busy machine may see none, and then has no CPU ratio.
		if strings.HasSuffix(cells[9], "×") || cells[9] == "—" && (strings.HasPrefix(cells[7], "0.00") || strings.HasPrefix(cells[8], "0.00")) {
			return true
		}
	}
	return false
}

// runQuick runs the suite with -quick and args (and the binary in
// $SSEGATE_BIN, when set), and returns the JSON report it wrote, what it
// printed, and the directory of its results.
func runQuick(t *testing.T, args ...string) (rep report, stdout, out string) {
	t.Helper()
	out = t.TempDir()
	args = append(args, "-quick", "-out", out)
	if bin := os.Getenv("SSEGATE_BIN"); bin != "" {
		args = append(args, "-ssegate", bin)
	}
	opt, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var so, se bytes.Buffer
	if err := run(opt, &so, &se); err != nil {
		t.Fatalf("run: %v\n%s", err, se.String())
	}
	files, _ := filepath.Glob(filepath.Join(out, "bench-*.json"))
	if len(files) != 1 {
		t.Fatalf("%d JSON files; want 1", len(files))
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return rep, so.String(), out
}

// TestProfileRun runs a short saturation scenario with -profile and checks
// that every ssegate measurement left a non-empty CPU and heap profile.
func TestProfileRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and runs load")
	}
	dir := t.TempDir()
	rep, _, _ := runQuick(t, "-scenarios", "a", "-duration", "150ms", "-conc", "4", "-events", "40",
		"-peers", "ssegate", "-profile", dir)
	want := map[string]bool{}
	for _, m := range rep.Measurements {
		if m.Error != "" {
			t.Errorf("%s %s: %s", m.Scenario, m.Path, m.Error)
		}
		if m.Server == kindSsegate {
			base := profileBase(m.Scenario, m.Step, m.Round, m.Path)
			want[base+".cpu.pprof"], want[base+".heap.pprof"] = true, true
		}
	}
	if len(want) != 4 { // ssegate and ssegate+key
		t.Fatalf("profiles expected: %v; want those of ssegate and ssegate+key", want)
	}
	for name := range want {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s: %v; want a non-empty profile", name, err)
		} else if fi.Size() == 0 {
			t.Errorf("%s: empty; want a non-empty profile", name)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != len(want) {
		t.Errorf("%d files in -profile; want %d", len(entries), len(want))
	}
}

func TestProfileBase(t *testing.T) {
	for _, c := range []struct {
		scn, step  string
		round      int
		path, want string
	}{
		{"a", "64 streams × 200 events", 1, "ssegate+key", "a-64_streams_200_events-r1-ssegate_key"},
		{"b", "512 streams × 20 events @ 50ms", 3, "ssegate", "b-512_streams_20_events_50ms-r3-ssegate"},
		{"c", "", 2, "ssegate@baseline+key", "c-r2-ssegate_baseline_key"},
	} {
		if got := profileBase(c.scn, c.step, c.round, c.path); got != c.want {
			t.Errorf("profileBase(%q, %q, %d, %q) = %q; want %q", c.scn, c.step, c.round, c.path, got, c.want)
		}
	}
}

func TestCaddyConfig(t *testing.T) {
	b, err := caddyConfig("127.0.0.1:8001", "127.0.0.1:9001")
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Admin   struct{ Disabled bool }
		Logging struct {
			Logs map[string]struct{ Level string }
		}
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Listen         []string
					AutomaticHTTPS struct{ Disable bool } `json:"automatic_https"`
					Logs           json.RawMessage
					Routes         []struct {
						Match  json.RawMessage
						Handle []struct {
							Handler       string
							Upstreams     []struct{ Dial string }
							FlushInterval *int `json:"flush_interval"`
							Transport     struct {
								Protocol  string
								KeepAlive struct {
									Enabled             *bool
									MaxIdleConnsPerHost int `json:"max_idle_conns_per_host"`
								} `json:"keep_alive"`
							}
						}
					}
				}
			}
		}
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if !conf.Admin.Disabled {
		t.Error("admin endpoint not disabled")
	}
	if l := conf.Logging.Logs["default"].Level; l != "ERROR" {
		t.Errorf("default log level %q; want ERROR", l)
	}
	if len(conf.Apps.HTTP.Servers) != 1 {
		t.Fatalf("%d servers; want 1:\n%s", len(conf.Apps.HTTP.Servers), b)
	}
	for name, srv := range conf.Apps.HTTP.Servers {
		if strings.Join(srv.Listen, ",") != "127.0.0.1:8001" {
			t.Errorf("server %s listens on %q; want 127.0.0.1:8001 alone", name, srv.Listen)
		}
		if !srv.AutomaticHTTPS.Disable {
			t.Errorf("server %s: automatic HTTPS not disabled", name)
		}
		if srv.Logs != nil {
			t.Errorf("server %s has access logs: %s", name, srv.Logs)
		}
		if len(srv.Routes) != 1 || srv.Routes[0].Match != nil || len(srv.Routes[0].Handle) != 1 {
			t.Fatalf("server %s: routes %s; want one unmatched route with one handler", name, b)
		}
		h := srv.Routes[0].Handle[0]
		if h.Handler != "reverse_proxy" || len(h.Upstreams) != 1 || h.Upstreams[0].Dial != "127.0.0.1:9001" {
			t.Errorf("handler %q to %+v; want reverse_proxy to 127.0.0.1:9001", h.Handler, h.Upstreams)
		}
		if h.FlushInterval == nil || *h.FlushInterval != -1 {
			t.Errorf("flush_interval %v; want -1", h.FlushInterval)
		}
		if ka := h.Transport.KeepAlive; h.Transport.Protocol != "http" || ka.Enabled == nil || !*ka.Enabled || ka.MaxIdleConnsPerHost < 64 {
			t.Errorf("transport %+v; want http with keep-alive and a pool of idle connections", h.Transport)
		}
	}
	dir := t.TempDir()
	path, err := writeCaddyConf(dir, "127.0.0.1:8001", "127.0.0.1:9001")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(bytes.TrimSpace(got), b) {
		t.Errorf("written configuration differs (%v)", err)
	}
	cmd := caddyCmd("/bin/caddy", path, dir)
	if got := strings.Join(cmd.Args, " "); got != "/bin/caddy run --config "+path {
		t.Errorf("command %q", got)
	}
}

func TestPortkeyRequest(t *testing.T) {
	r := &runner{}
	srv := &server{addr: "127.0.0.1:8002", headers: portkeyHeaders("127.0.0.1:9002")}
	req := string(r.requestTo(srv, reqSpec{tokens: 5, delay: time.Millisecond}))
	head, body, _ := strings.Cut(req, "\r\n\r\n")
	for _, want := range []string{
		"\r\nx-portkey-provider: openai\r\n",
		"\r\nx-portkey-custom-host: http://127.0.0.1:9002/v1\r\n",
		"\r\nx-portkey-forward-headers: x-mock-tokens,x-mock-delay\r\n",
		"\r\nX-Mock-Tokens: 5\r\n",
	} {
		if !strings.Contains(head+"\r\n", want) {
			t.Errorf("request head lacks %q:\n%s", want, head)
		}
	}
	if body != requestBody {
		t.Errorf("body %q; want %q", body, requestBody)
	}
	plain := string(r.requestTo(&server{addr: "127.0.0.1:8003"}, reqSpec{tokens: 5}))
	if strings.Contains(plain, "x-portkey") {
		t.Errorf("a request to another peer has Portkey's headers:\n%s", plain)
	}
	cmd, err := portkeyCmd("/cache/pk", "127.0.0.1:8002")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cmd.Args, " "); got != "node -r /cache/pk/loopback.cjs /cache/pk/"+portkeyMain+" --port=8002 --headless" {
		t.Errorf("command %q", got)
	}
	if _, err := portkeyCmd("/cache/pk", "0.0.0.0:8002"); err == nil {
		t.Error("portkey started off loopback")
	}
}

func TestPeerSummary(t *testing.T) {
	rep := fakeReport()
	if strings.Contains(rep.markdown(), "### ssegate against caddy") {
		t.Error("a report without caddy rows has a caddy summary")
	}
	addRounds(rep, pathCaddy, 250, 4)
	md := rep.markdown()
	for _, want := range []string{
		"### ssegate against caddy and nginx\n",
		"| a | 8 streams | ssegate | caddy | events/s | 750 | 375 | 2.00× | 2.00 | 4.00 | 0.50× |",
		"| a | 8 streams | ssegate | nginx | events/s | 750 | — | — | 2.00 | — | — |", // nginx failed: said, not left out
		"| caddy | 375 | 0.25× |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if !summaryHas(md, "a", "ssegate", "caddy") || summaryHas(md, "a", "ssegate", "nginx") || summaryHas(md, "a", "ssegate", "") {
		t.Error("summaryHas: want the caddy row alone measured")
	}
	if i, j := strings.Index(md, "### ssegate against caddy"), strings.Index(md, "### (a)"); i < 0 || i > j {
		t.Error("the summary is not above the tables")
	}
}

// checkPeerRuns checks that peer k was measured in every scenario of a
// quick run that measures peers, each stream whole.
func checkPeerRuns(t *testing.T, rep report, k kind, events map[string]int64) {
	t.Helper()
	seen := map[string]bool{}
	for _, m := range rep.Measurements {
		if m.Server != k {
			continue
		}
		name := m.Scenario + " " + m.Step + " " + m.Path
		seen[m.Scenario] = true
		if m.Error != "" {
			t.Errorf("%s: %s", name, m.Error)
			continue
		}
		if m.Errors > 0 || m.OK == 0 || m.OK != m.Streams || m.Events != m.Streams*events[m.Scenario] {
			t.Errorf("%s: %d of %d streams whole, %d events (%d a stream); errors %v", name, m.OK, m.Streams, m.Events, events[m.Scenario], m.ErrorSamples)
		}
		if !(m.CPUSec >= 0) || m.PeakRSS <= 0 {
			t.Errorf("%s: proxy CPU %v, peak RSS %d; want numbers", name, m.CPUSec, m.PeakRSS)
		}
	}
	for scn := range events {
		if !seen[scn] {
			t.Errorf("scenario %s has no %s measurement", scn, k)
		}
	}
}

// TestCaddyRun builds Caddy from bench/caddy (the Go module proxy serves
// it on the first build) and runs a short suite with it beside ssegate:
// every stream through caddy whole, its version in the report and its
// rows in the summary.
func TestCaddyRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds caddy, starts processes and runs load")
	}
	rep, md, _ := runQuick(t, "-scenarios", "a,b,c,e,sweep", "-peers", "caddy,ssegate",
		"-duration", "150ms", "-conc", "8", "-slow", "16@5ms:20", "-sweep", "4", "-fanout-pace", "3ms", "-events", "40")
	for _, n := range rep.Notes {
		t.Logf("note: %s", n)
	}
	checkPeerRuns(t, rep, kindCaddy, map[string]int64{"a": 40, "b": 10, "c": 20, "e": 40, "sweep": 40})
	if !strings.HasPrefix(rep.Caddy, "v2.") || !strings.Contains(md, ", caddy "+rep.Caddy) {
		t.Errorf("caddy version %q not in the report's header", rep.Caddy)
	}
	if !strings.Contains(md, "### ssegate against caddy") {
		t.Errorf("no caddy summary:\n%s", md)
	}
	for _, scn := range []string{"a", "b", "c", "e", "sweep"} {
		for _, p := range []string{"ssegate", "ssegate+key"} {
			if !summaryHas(md, scn, p, "caddy") {
				t.Errorf("summary lacks the %s row of %s against caddy", p, scn)
			}
		}
	}
}

// TestPortkeyRun installs the Portkey gateway from bench/portkey (npm ci
// from the npm registry on the first run, then from the cache) and runs a
// short suite through it: its routing headers must bring every stream
// whole from the mock.
func TestPortkeyRun(t *testing.T) {
	if testing.Short() {
		t.Skip("installs the Portkey gateway, starts processes and runs load")
	}
	if err := haveNode(); err != nil {
		t.Skipf("the Portkey gateway needs node and npm: %v", err)
	}
	rep, md, _ := runQuick(t, "-scenarios", "a,b,c,e,sweep", "-peers", "portkey",
		"-duration", "150ms", "-conc", "4", "-slow", "8@10ms:20", "-sweep", "2", "-fanout-pace", "3ms", "-events", "20")
	for _, n := range rep.Notes {
		t.Logf("note: %s", n)
	}
	checkPeerRuns(t, rep, kindPortkey, map[string]int64{"a": 20, "b": 10, "c": 20, "e": 20, "sweep": 20})
	if !strings.HasPrefix(rep.Portkey, "1.15.2") || !strings.Contains(md, ", Portkey gateway "+rep.Portkey) {
		t.Errorf("Portkey version %q not in the report's header", rep.Portkey)
	}
}
