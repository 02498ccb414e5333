package main

import (
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// usSamples returns n samples of v µs each, sorted.
func usSamples(n int, v float64) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = time.Duration(v * float64(time.Microsecond))
	}
	return out
}

// rampSamples returns the samples 1, 2, …, n µs.
func rampSamples(n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = time.Duration(i+1) * time.Microsecond
	}
	return out
}

func TestQuantile(t *testing.T) {
	tests := []struct {
		n, pm int
		want  float64 // NaN: not reached
	}{
		{1000, 500, 500},
		{1000, 990, 990},
		{1000, 999, 999}, // nearest rank: ceil(0.999 × 1000) = 999, not 1000
		{999, 999, math.NaN()},
		{2000, 999, 1998},
		{100, 990, 99},
		{99, 990, math.NaN()},
		{1, 500, math.NaN()},
		{2, 500, 1},
		{3, 500, 2},
		{0, 500, math.NaN()},
	}
	for _, tc := range tests {
		got := float64(quantile(rampSamples(tc.n), tc.pm))
		if got != tc.want && !(math.IsNaN(got) && math.IsNaN(tc.want)) {
			t.Errorf("quantile(1..%d µs, %d‰) = %v; want %v", tc.n, tc.pm, got, tc.want)
		}
	}
}

// boardMeasurement is one round of one path of a board step, with
// latency and TTFT samples.
func boardMeasurement(step string, round int, p path, latency, ttft []time.Duration, cpuSec float64) measurement {
	m := newMeasurement("board", step, round, p, 1)
	m.latency, m.ttft = latency, ttft
	m.Streams, m.OK = int64(len(latency)), int64(len(latency))
	m.UpstreamCalls = m.Streams
	if p.kind != kindDirect {
		m.CPUSec = num(cpuSec)
	}
	return m
}

// TestBoardRows checks the added-latency arithmetic: each path's samples
// pooled over the rounds, its percentiles minus direct's from the same
// step, CPU per request the median over rounds, a failed round said.
func TestBoardRows(t *testing.T) {
	const step, other = "c=1, dense stream, 64 deltas", "c=64, dense stream, 64 deltas"
	ms := []measurement{
		// Direct: 50 µs in both rounds; its TTFT 20 µs.
		boardMeasurement(step, 1, pathDirect, usSamples(100, 50), usSamples(100, 20), 0),
		// The relay: 100 µs in round 1, 300 µs in round 2. Pooled, p50 is
		// 100 and p99 300; the median of the rounds' p99 minus direct's
		// would be 150, which is not what the board reports.
		boardMeasurement(step, 1, pathFastHTTP, usSamples(100, 100), usSamples(100, 30), 0.01), // 100 µs CPU a request
		boardMeasurement(step, 2, pathDirect, usSamples(100, 50), usSamples(100, 20), 0),
		boardMeasurement(step, 2, pathFastHTTP, usSamples(100, 300), usSamples(100, 40), 0.03), // 300
		// A third round of the relay failed; the row says so.
		{Scenario: "board", Step: step, Round: 3, Path: pathFastHTTP.name, Server: kindFastHTTP, Error: "did not start"},
		// Another step has no direct: nothing added.
		boardMeasurement(other, 1, pathSsegate, usSamples(1000, 70), nil, 0.002),
		// Not the board's.
		boardMeasurement(step, 1, pathCaddy, usSamples(10, 1), nil, 1),
	}
	ms[len(ms)-1].Scenario = "b"

	rows := boardRows(ms)
	if len(rows) != 3 {
		t.Fatalf("%d rows; want 3 (direct and fasthttp in one step, ssegate in another)", len(rows))
	}
	d, f, s := rows[0], rows[1], rows[2]
	if d.Path != "direct" || f.Path != "fasthttp" || s.Path != "ssegate" {
		t.Fatalf("rows %s, %s, %s; want direct, fasthttp, ssegate", d.Path, f.Path, s.Path)
	}
	check := func(name string, got num, want float64) {
		t.Helper()
		if g := float64(got); g != want && !(math.IsNaN(g) && math.IsNaN(want)) {
			t.Errorf("%s = %v; want %v", name, g, want)
		}
	}
	check("fasthttp latency p50", f.Latency.P50, 100)
	check("fasthttp latency p99", f.Latency.P99, 300)
	check("fasthttp latency p99.9 (200 samples)", f.Latency.P999, math.NaN())
	check("fasthttp added p50", f.AddedLatency.P50, 50)
	check("fasthttp added p99", f.AddedLatency.P99, 250)
	check("fasthttp added TTFT p50", f.AddedTTFT.P50, 10)
	check("fasthttp added TTFT p99", f.AddedTTFT.P99, 20)
	check("direct added p50", d.AddedLatency.P50, 0)
	check("direct CPU per request", d.CPUusPerRequest, math.NaN())
	check("fasthttp CPU per request (median of 100 and 300)", f.CPUusPerRequest, 200)
	check("ssegate added p50 without direct", s.AddedLatency.P50, math.NaN())
	check("ssegate latency p99.9 (1,000 samples)", s.Latency.P999, 70)
	check("ssegate CPU per request", s.CPUusPerRequest, 2)
	if f.Samples != 200 || f.TTFTSamples != 200 || f.Rounds != 2 || f.Streams != 200 || f.UpstreamCalls != 200 {
		t.Errorf("fasthttp: %d samples, %d TTFT samples, %d rounds, %d requests, %d upstream calls; want 200, 200, 2, 200, 200",
			f.Samples, f.TTFTSamples, f.Rounds, f.Streams, f.UpstreamCalls)
	}
	if len(f.Failed) != 1 || !strings.Contains(f.Failed[0], "round 3: did not start") {
		t.Errorf("fasthttp failed %q; want round 3", f.Failed)
	}
	if s.TTFTSamples != 0 || !math.IsNaN(float64(s.TTFT.P50)) {
		t.Errorf("ssegate: %d TTFT samples, p50 %v; want none", s.TTFTSamples, s.TTFT.P50)
	}
}

// targetRow is a board row of the given added latency p50 and p99, added
// TTFT p50 and p99, and CPU per request.
func targetRow(step string, p path, p50, p99, ttft50, ttft99, cpu float64) *boardRow {
	return &boardRow{Step: step, Path: p.name, Server: p.kind,
		AddedLatency: quantiles{num(p50), num(p99), nan}, AddedTTFT: quantiles{num(ttft50), num(ttft99), nan}, CPUusPerRequest: num(cpu)}
}

func TestBoardTargets(t *testing.T) {
	const st, ns = "c=1, dense stream, 64 deltas", "c=1, non-streaming, 64 tokens"
	rows := []*boardRow{
		targetRow(ns, pathDirect, 0, 0, math.NaN(), math.NaN(), math.NaN()),
		targetRow(ns, pathFastHTTP, 200, 540, math.NaN(), math.NaN(), 100),
		targetRow(ns, pathSsegate, 190, 370, math.NaN(), math.NaN(), 160),
		targetRow(ns, pathSsegateKey, 201, 540, math.NaN(), math.NaN(), 120),
		targetRow(st, pathDirect, 0, 0, 0, 0, math.NaN()),
		targetRow(st, pathFastHTTP, 200, 500, 186, 400, 100),
		targetRow(st, pathSsegate, 227, 374, 216, 300, 163),
		targetRow(st, pathSsegateKey, 252, 743, 226, math.NaN(), 121),
	}
	want := map[string]string{ // target and step → value, against, met
		"fresh key: added latency p50 ≤ no key's + 10 µs | " + ns:    "201 190 false",
		"fresh key: added latency p99 ≤ the bare relay's | " + ns:    "540 540 true",
		"no key: added latency p50 ≤ the bare relay's | " + ns:       "190 200 true",
		"fresh key: CPU per request ≤ 1.2× the bare relay's | " + ns: "120 100 true",
		"fresh key: added latency p50 ≤ no key's + 10 µs | " + st:    "252 227 false",
		"fresh key: added TTFT p50 ≤ no key's + 10 µs | " + st:       "226 216 true",
		"fresh key: added latency p99 ≤ the bare relay's | " + st:    "743 500 false",
		"fresh key: added TTFT p99 ≤ the bare relay's | " + st:       "NaN 400 missing",
		"no key: added latency p50 ≤ the bare relay's | " + st:       "227 200 false",
		"fresh key: CPU per request ≤ 1.2× the bare relay's | " + st: "121 100 false",
	}
	got := boardTargets(rows)
	if len(got) != len(want) {
		t.Errorf("%d targets; want %d (no TTFT targets without a stream)", len(got), len(want))
	}
	for _, tg := range got {
		met := "missing"
		if tg.Met != nil {
			met = strconv.FormatBool(*tg.Met)
		}
		g := strconv.FormatFloat(float64(tg.Value), 'g', -1, 64) + " " + strconv.FormatFloat(float64(tg.Reference), 'g', -1, 64) + " " + met
		k := tg.Target + " | " + tg.Step
		if w, ok := want[k]; !ok {
			t.Errorf("unexpected target %q", k)
		} else if g != w {
			t.Errorf("%s: %s; want %s", k, g, w)
		}
	}
	rep := &report{Board: rows}
	md := rep.markdown()
	for _, s := range []string{
		"### Targets of the keyed path (board)",
		"| fresh key: CPU per request ≤ 1.2× the bare relay's | " + st + " | 121.0 | 100.0 | 1.21× | +21.0 | no |",
		"| fresh key: added latency p50 ≤ no key's + 10 µs | " + ns + " | 201.0 | 190.0 | 1.06× | +11.0 | no |",
		"| no key: added latency p50 ≤ the bare relay's | " + ns + " | 190.0 | 200.0 | 0.95× | -10.0 | **yes** |",
		"### (board) Added latency and time to first token",
		"GetBusbar",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
}

func TestHasContent(t *testing.T) {
	for data, want := range map[string]bool{
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null}}]}`: false,
		`{"choices":[{"index":0,"delta":{"content":"Once"},"finish_reason":null}]}`:          true,
		`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`:                        false,
		`{"a":{"content":""},"b":{"content":"x"}}`:                                           true,
		`[DONE]`: false,
	} {
		if got := hasContent([]byte(data)); got != want {
			t.Errorf("hasContent(%s) = %v; want %v", data, got, want)
		}
	}
}

// chatBody is a chat stream as the mock sends it: the role chunk, two
// content chunks, the finish chunk and [DONE].
const chatBody = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
	"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Once\"}}]}\n\n" +
	"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" upon\"}}]}\n\n" +
	"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n" +
	"data: [DONE]\n\n"

func TestParserContentEvents(t *testing.T) {
	for cut := 0; cut <= len(chatBody); cut++ {
		var p sseParser
		p.reset(false, true)
		p.feed([]byte(chatBody[:cut]))
		p.feed([]byte(chatBody[cut:]))
		if p.events != 5 || p.contentEvents != 2 {
			t.Fatalf("cut %d: %d events, %d with content; want 5, 2", cut, p.events, p.contentEvents)
		}
	}
	var p sseParser
	p.reset(false, false)
	p.feed([]byte(chatBody))
	if p.contentEvents != 0 {
		t.Errorf("%d content events counted without asking; want 0", p.contentEvents)
	}
}

// TestRoundTripTimed checks the times of a board sample: the first
// content event's (after the role chunk's, which is not one), the whole
// answer's, and a non-streaming answer taken whole.
func TestRoundTripTimed(t *testing.T) {
	head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	// Pieces of 40 bytes, a quarter of a millisecond apart: the role chunk
	// has arrived well before the first content chunk.
	addr := serveCanned(t, head+chunk(chatBody, 1000), 40, false)
	c := newClientConn(addr)
	defer c.close()
	c.firstContent = true
	res := c.roundTrip([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), time.Now().Add(5*time.Second), false, nil, nil)
	if !res.ok(5) {
		t.Fatalf("stream: %s", res.problem(5))
	}
	if !(res.ttfe > 0 && res.ttft > res.ttfe && res.total >= res.ttft) {
		t.Errorf("ttfe %v, ttft %v, total %v; want 0 < ttfe < ttft ≤ total", res.ttfe, res.ttft, res.total)
	}
	if res.ok(wholeBody) {
		t.Error("an event stream passed as a non-streaming answer")
	}

	json := `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"message":{"content":"Once upon"}}]}`
	addr = serveCanned(t, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(json))+"\r\n\r\n"+json, 16, false)
	c = newClientConn(addr)
	defer c.close()
	c.firstContent = true
	res = c.roundTrip([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), time.Now().Add(5*time.Second), false, nil, nil)
	if !res.ok(wholeBody) || res.ttft != 0 || res.total <= 0 {
		t.Errorf("non-streaming: ok %v (%s), ttft %v, total %v; want ok, 0, > 0", res.ok(wholeBody), res.problem(wholeBody), res.ttft, res.total)
	}
	if res.ok(5) {
		t.Error("a non-streaming answer passed as a stream")
	}
}

// TestBoardRun runs scenario board at its smallest against the bare relay
// and ssegate: every path of every step measured with every answer whole,
// a generation a fresh key, none for a hit, the samples counted, and the
// table and targets in the report.
func TestBoardRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and runs load")
	}
	rep, md, _ := runQuick(t, "-scenarios", "board", "-duration", "150ms", "-board-conc", "1,4", "-board-paced", "4", "-board-pace", "2ms",
		"-board-deltas", "8", "-peers", "fasthttp,ssegate")
	steps := map[string]bool{}
	for _, m := range rep.Measurements {
		name := m.Step + " " + m.Path
		steps[m.Step] = true
		if m.Error != "" {
			t.Errorf("%s: %s", name, m.Error)
			continue
		}
		if m.Errors > 0 || m.OK == 0 || m.Board == nil || m.Board.Samples != int(m.OK) {
			t.Errorf("%s: %d of %d requests failed (%v), board %+v", name, m.Errors, m.Streams, m.ErrorSamples, m.Board)
			continue
		}
		stream := !strings.Contains(m.Step, "non-streaming")
		if stream != (m.Board.TTFTSamples == m.Board.Samples) || (!stream && m.Board.TTFTSamples != 0) {
			t.Errorf("%s: %d TTFT samples of %d; want all for a stream, none otherwise", name, m.Board.TTFTSamples, m.Board.Samples)
		}
		// A few requests may cost less than the one clock tick /proc counts in.
		if m.Server != kindDirect && !(m.Board.CPUusPerRequest >= 0) {
			t.Errorf("%s: CPU per request %v; want a number", name, m.Board.CPUusPerRequest)
		}
		if strings.Contains(m.Step, "paced") && m.Streams != 4 {
			t.Errorf("%s: %d paced streams; want 4 (-board-paced over 1 round, at least the concurrency)", name, m.Streams)
		}
		switch m.Path {
		case pathHit.name:
			if m.UpstreamCalls != 0 || m.Replayed != m.Streams {
				t.Errorf("%s: %d upstream calls, %d of %d replayed; want 0 and all", name, m.UpstreamCalls, m.Replayed, m.Streams)
			}
		case pathSsegateKey.name, pathSsegate.name, pathDirect.name, pathFastHTTP.name:
			if m.UpstreamCalls != m.Streams || m.Replayed != 0 {
				t.Errorf("%s: %d upstream calls, %d replayed for %d requests; want one each, none replayed", name, m.UpstreamCalls, m.Replayed, m.Streams)
			}
		}
	}
	if len(steps) != 6 {
		t.Errorf("steps %v; want 3 kinds × 2 concurrencies", steps)
	}
	if len(rep.BoardTargets) != 6*4+4*2 {
		t.Errorf("%d targets in the JSON; want 32 (4 a step, 2 more in each of the 4 streamed steps)", len(rep.BoardTargets))
	}
	if len(rep.Board) != 6*5 {
		t.Errorf("%d board rows; want 30 (6 steps × direct, fasthttp, ssegate, ssegate+key, ssegate hit)", len(rep.Board))
	}
	for _, want := range []string{"### (board) Added latency and time to first token", "**c=4, paced stream, 8 deltas @ 2ms**",
		"| ssegate hit |", "### Targets of the keyed path (board)", "| fresh key: CPU per request ≤ 1.2× the bare relay's | c=1, non-streaming, 8 tokens |"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// TestBoardWall checks the wall time the documentation gives for the
// scenario with every peer (seven paths) at the defaults and at
// -board-paced 100.
func TestBoardWall(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		min, max time.Duration
	}{
		{nil, 70 * time.Minute, 90 * time.Minute},
		{[]string{"-board-paced", "100"}, 15 * time.Minute, 30 * time.Minute},
	} {
		o, err := parseFlags(tc.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := boardWall(o, 7); got < tc.min || got > tc.max {
			t.Errorf("%q: %v; want %v..%v", tc.args, got, tc.min, tc.max)
		}
	}
}

func TestBoardFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if b := o.board; len(b.conc) != 2 || b.conc[0] != 1 || b.conc[1] != 64 || b.paced != 500 || b.deltas != 64 || b.pace != 20*time.Millisecond {
		t.Errorf("defaults %+v; want conc 1,64, 500 paced streams, 64 deltas, 20ms", b)
	}
	if !strings.Contains(strings.Join(o.scenarios, ","), "board") {
		t.Errorf("default scenarios %v lack board", o.scenarios)
	}
	if o, err = parseFlags([]string{"-quick"}, io.Discard); err != nil || o.board.paced != 4 || o.board.pace != 5*time.Millisecond {
		t.Errorf("-quick: %v, board %+v; want 4 streams paced 5ms", err, o.board)
	}
	if got := o.board.pacedPerRound(3, 64); got != 64 {
		t.Errorf("pacedPerRound(3 rounds, c=64) of 4 = %d; want 64, one a client", got)
	}
	o, _ = parseFlags(nil, io.Discard)
	if got := o.board.pacedPerRound(3, 1); got != 167 {
		t.Errorf("pacedPerRound(3 rounds, c=1) of 500 = %d; want 167", got)
	}
	if got := o.board.pacedPerRound(3, 64); got != 192 {
		t.Errorf("pacedPerRound(3 rounds, c=64) of 500 = %d; want 192, three for every client", got)
	}
	for _, bad := range [][]string{{"-board-pace", "0"}, {"-board-pace", "11s"}, {"-board-paced", "0"}, {"-board-deltas", "0"}, {"-board-conc", "x"}, {"-board-conc", "0"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) succeeded; want an error", bad)
		}
	}
}
