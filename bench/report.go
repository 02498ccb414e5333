package main

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"time"
)

// report is the result of a run: where and how it ran, and every
// measurement. It is what the JSON file holds.
type report struct {
	Date         string        `json:"date"`
	DurationSec  float64       `json:"duration_s"`
	Cores        int           `json:"cores"`
	Kernel       string        `json:"kernel"`
	GoVersion    string        `json:"go_version"`
	Nginx        string        `json:"nginx,omitempty"`
	Caddy        string        `json:"caddy,omitempty"`
	Portkey      string        `json:"portkey,omitempty"`
	NoFile       uint64        `json:"rlimit_nofile"`
	Rounds       int           `json:"rounds"`
	Measure      string        `json:"measurement_duration"`
	Command      []string      `json:"command"`
	SsegateFlags string        `json:"ssegate_flags"`
	SsegateEnv   string        `json:"ssegate_env,omitempty"`
	Baseline     string        `json:"baseline,omitempty"`          // -baseline, the binary
	BaselineRev  string        `json:"baseline_revision,omitempty"` // with -baseline: the VCS revision of each binary, when it says
	SsegateRev   string        `json:"ssegate_revision,omitempty"`
	Notes        []string      `json:"notes,omitempty"`
	Measurements []measurement `json:"measurements"`
	// Board is scenario board's table: every path's samples pooled over
	// the rounds (the samples themselves are not kept).
	Board []*boardRow `json:"board,omitempty"`
	// BoardTargets are the keyed path's targets read off Board.
	BoardTargets []boardTarget `json:"board_targets,omitempty"`
	// Shard is scenario shard's steps.
	Shard []*shardRow `json:"shard,omitempty"`
}

// report collects the run's measurements and context.
func (r *runner) report(start time.Time, took time.Duration) *report {
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	rep := &report{
		Date:         start.UTC().Format(time.RFC3339),
		DurationSec:  took.Seconds(),
		Cores:        runtime.NumCPU(),
		Kernel:       strings.TrimSpace(string(kernel)),
		GoVersion:    runtime.Version(),
		Nginx:        nginxVersion(r.env.nginxBin),
		Caddy:        caddyVersion(r.env.caddyBin),
		Portkey:      portkeyVersion(r.env.portkeyDir),
		NoFile:       r.noFile,
		Rounds:       r.opt.rounds,
		Measure:      r.opt.duration.String(),
		Command:      os.Args,
		SsegateFlags: strings.TrimSpace(strings.Join(ssegateFlags, " ") + " " + r.opt.ssegateArg),
		SsegateEnv:   strings.TrimSpace(r.opt.ssegateEnv),
		Notes:        r.notes,
		Measurements: r.ms,
		Board:        boardRows(r.ms),
		Shard:        r.shardRows,
	}
	rep.BoardTargets = boardTargets(rep.Board)
	if b := r.env.baselineBin; b != "" {
		rep.Baseline, rep.BaselineRev, rep.SsegateRev = b, revisionOf(b), revisionOf(r.env.ssegateBin)
	}
	return rep
}

// revisionOf returns the VCS revision the Go binary bin was built from,
// with " (modified)" when its tree had changes; "" when the binary does
// not say.
func revisionOf(bin string) string {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return ""
	}
	rev, modified := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev != "" && modified {
		rev += " (modified)"
	}
	return rev
}

// writeJSON writes v, indented, to path.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// agg is one row of a table: one path in one step, over its rounds.
type agg struct {
	path, step string
	server     kind
	rounds     int      // measurements that ran
	failed     []string // why the others did not
	ms         []*measurement
	ratio      float64 // median over rounds of the ratio to direct's main metric
	addedP50   float64 // median over rounds of TTFE p50 minus direct's, µs
	addedP99   float64
}

// med returns the median over the rounds of f.
func (a *agg) med(f func(m *measurement) float64) float64 {
	xs := make([]float64, 0, len(a.ms))
	for _, m := range a.ms {
		xs = append(xs, f(m))
	}
	return median(xs)
}

// sum returns the sum over the rounds of f.
func (a *agg) sum(f func(m *measurement) int64) int64 {
	var n int64
	for _, m := range a.ms {
		n += f(m)
	}
	return n
}

// calls returns the upstream calls over the rounds; NaN when a count could
// not be read.
func (a *agg) calls() float64 {
	var n int64
	for _, m := range a.ms {
		if m.UpstreamCalls < 0 {
			return math.NaN()
		}
		n += m.UpstreamCalls
	}
	return float64(n)
}

// rows groups the measurements of scenario scn into rows, in the order the
// steps and paths were measured; main is the metric the ratio compares.
func (rep *report) rows(scn string, main func(m *measurement) float64) []*agg {
	var out []*agg
	byKey := map[[2]string]*agg{}
	direct := map[[2]string]*measurement{} // (step, round) → direct's
	for i := range rep.Measurements {
		m := &rep.Measurements[i]
		if m.Scenario != scn {
			continue
		}
		k := [2]string{m.Step, m.Path}
		a := byKey[k]
		if a == nil {
			a = &agg{path: m.Path, step: m.Step, server: m.Server}
			byKey[k] = a
			out = append(out, a)
		}
		if m.Error != "" {
			a.failed = append(a.failed, fmt.Sprintf("round %d: %s", m.Round, m.Error))
			continue
		}
		a.rounds++
		a.ms = append(a.ms, m)
		if m.Server == kindDirect {
			direct[[2]string{m.Step, fmt.Sprint(m.Round)}] = m
		}
	}
	for _, a := range out {
		var rs, p50, p99 []float64
		for _, m := range a.ms {
			d := direct[[2]string{m.Step, fmt.Sprint(m.Round)}]
			if d == nil {
				continue
			}
			rs = append(rs, ratio(main(m), main(d)))
			p50 = append(p50, float64(m.TTFEP50us-d.TTFEP50us))
			p99 = append(p99, float64(m.TTFEP99us-d.TTFEP99us))
		}
		a.ratio, a.addedP50, a.addedP99 = median(rs), median(p50), median(p99)
	}
	return out
}

// column is one column of a table.
type column struct {
	head  string
	align string // "---:" or "---"
	cell  func(a *agg) string
}

// Cell formatting; "—" marks what was not measured or does not apply.
func fmtNum(x float64, prec int) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "—"
	}
	if math.Abs(x) >= 10_000 {
		return groupThousands(fmt.Sprintf("%.0f", x))
	}
	return fmt.Sprintf("%.*f", prec, x)
}

func groupThousands(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func fmtRatio(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return fmt.Sprintf("%.2f×", x)
}

func fmtSigned(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return fmt.Sprintf("%+.0f", x)
}

func fmtMiB(b float64) string {
	if math.IsNaN(b) || b <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", b/(1<<20))
}

// The metrics of a measurement, as functions for agg.med.
func evps(m *measurement) float64    { return float64(m.EventsPerSec) }
func stps(m *measurement) float64    { return float64(m.StreamsPerSec) }
func p50(m *measurement) float64     { return float64(m.TTFEP50us) }
func p99(m *measurement) float64     { return float64(m.TTFEP99us) }
func cpuEv(m *measurement) float64   { return float64(m.CPUusPerEvent) }
func hwm(m *measurement) float64     { return nonzero(float64(m.PeakRSS)) }
func perLive(m *measurement) float64 { return float64(m.RSSPerLive) }
func errs(m *measurement) int64      { return m.Errors }
func nstreams(m *measurement) int64  { return m.Streams }

func nonzero(x float64) float64 {
	if x == 0 {
		return math.NaN()
	}
	return x
}

// Columns used by several tables.
var (
	colPath   = column{"path", "---", func(a *agg) string { return a.path }}
	colEvps   = column{"events/s", "---:", func(a *agg) string { return fmtNum(a.med(evps), 0) }}
	colRatio  = column{"ratio to direct", "---:", func(a *agg) string { return fmtRatio(a.ratio) }}
	colStps   = column{"streams/s", "---:", func(a *agg) string { return fmtNum(a.med(stps), 0) }}
	colP50    = column{"TTFE p50 µs", "---:", func(a *agg) string { return fmtNum(a.med(p50), 0) }}
	colP99    = column{"TTFE p99 µs", "---:", func(a *agg) string { return fmtNum(a.med(p99), 0) }}
	colCPU    = column{"proxy CPU µs/event", "---:", func(a *agg) string { return fmtNum(a.med(cpuEv), 2) }}
	colHWM    = column{"peak RSS MiB", "---:", func(a *agg) string { return fmtMiB(a.med(hwm)) }}
	colErrors = column{"errors / streams", "---:", func(a *agg) string {
		s := fmt.Sprintf("%d / %d", a.sum(errs), a.sum(nstreams))
		if len(a.failed) > 0 {
			s += fmt.Sprintf(" (%d rounds failed)", len(a.failed))
		}
		return s
	}}
	colCalls = column{"upstream calls / stream", "---:", func(a *agg) string {
		return fmtNum(ratio(a.calls(), float64(a.sum(nstreams))), 3)
	}}
	colReplayed = column{"replayed", "---:", func(a *agg) string {
		return fmtNum(100*ratio(float64(a.sum(func(m *measurement) int64 { return m.Replayed })), float64(a.sum(nstreams))), 0) + "%"
	}}
)

// table is how one scenario is shown.
type table struct {
	scn, title, about string
	main              func(m *measurement) float64 // what "ratio to direct" compares
	cols              []column
}

var tables = []table{
	{"a", "(a) Saturation", "Each client runs streams back to back, as fast as the upstream makes them. On 2 cores the client, the mock upstream and the proxy share the CPU, so events/s is a noisy yardstick; CPU per event is the steadier one.",
		evps, []column{colPath, colEvps, colRatio, colStps, colP50, colP99, colCPU, colHWM, colErrors}},
	{"b", "(b) Latency", "One stream at a time; time from writing the request to the end of the first event. Added = the path's p50 (p99) minus direct's in the same round. Ratio = p50 to direct's p50.",
		p50, []column{colPath, colP50,
			{"added p50 µs", "---:", func(a *agg) string { return fmtSigned(a.addedP50) }},
			colP99,
			{"added p99 µs", "---:", func(a *agg) string { return fmtSigned(a.addedP99) }},
			colRatio, colStps, colCPU, colErrors}},
	{"c", "(c) Many slow streams", "All streams opened at once, each paced by the upstream. RSS per live stream = (RSS at the sample with the most live streams − idle RSS before the load) / live streams; a stream is live from its first event to its end. \"events/stream at sample\" is how far the streams (and the keyed path's journals) were then. Nominal = streams × events/s each at the pace; below it the machine could not keep the pace.",
		evps, []column{colPath,
			{"live streams (max)", "---:", func(a *agg) string {
				return fmtNum(a.med(func(m *measurement) float64 { return float64(m.MaxLive) }), 0)
			}},
			{"events/s (nominal)", "---:", func(a *agg) string {
				return fmtNum(a.med(evps), 0) + " (" + fmtNum(a.med(func(m *measurement) float64 { return float64(m.NominalPerSec) }), 0) + ")"
			}},
			colRatio, colCPU,
			{"RSS KiB / live stream", "---:", func(a *agg) string { return fmtNum(a.med(perLive)/1024, 1) }},
			{"events/stream at sample", "---:", func(a *agg) string {
				return fmtNum(a.med(func(m *measurement) float64 { return float64(m.EventsPerLiveAtS) }), 0)
			}},
			colHWM, colP50, colP99, colErrors}},
	{"d", "(d) Replay", "Clients repeat the keyed request of one stored stream (cache hits, no upstream call) against direct, which generates every stream.",
		evps, []column{colPath, colEvps, colRatio, colStps, colP50, colP99, colCPU, colCalls, colReplayed, colErrors}},
	{"e", "(e) Fan-out", "Groups of clients send the same request at once. ssegate+key: one key per group, so one generation joined by the whole group; the other paths make one generation per client. Events/s counts events delivered to clients.",
		evps, []column{colPath, colEvps, colRatio, colP50, colP99, colCPU,
			{"upstream calls / group", "---:", func(a *agg) string {
				return fmtNum(ratio(a.calls(), float64(a.sum(func(m *measurement) int64 { return m.Groups }))), 2)
			}},
			colReplayed, colErrors}},
	{"f", "(f) Resume", "Clients reconnect to a stored stream with Last-Event-ID at varying positions and read the rest; direct makes fresh streams of the same remaining lengths. Ratio = reconnects/s to direct's streams/s.",
		stps, []column{colPath,
			{"reconnects/s", "---:", func(a *agg) string { return fmtNum(a.med(stps), 0) }},
			colRatio, colEvps, colP50, colP99, colCPU, colCalls, colErrors}},
	{"sweep", "Sweep: events/s against concurrency", "Saturation (as in a) at each concurrency; the SVG chart plots the events/s column.",
		evps, []column{{"concurrency", "---:", func(a *agg) string { return strings.TrimPrefix(a.step, "c=") }},
			colPath, colEvps, colRatio, colP50, colCPU, colErrors}},
	redisTable,
}

// markdown renders the report: context, then one table per scenario that
// ran.
func (rep *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## Benchmark results — %s\n\n", rep.Date)
	fmt.Fprintf(&b, "%d cores, Linux %s, %s", rep.Cores, rep.Kernel, rep.GoVersion)
	if rep.Nginx != "" {
		fmt.Fprintf(&b, ", nginx %s", rep.Nginx)
	}
	if rep.Caddy != "" {
		fmt.Fprintf(&b, ", caddy %s", rep.Caddy)
	}
	if rep.Portkey != "" {
		fmt.Fprintf(&b, ", Portkey gateway %s", rep.Portkey)
	}
	fmt.Fprintf(&b, ". Medians of %d interleaved rounds (every path once per round, in turn) of %s measurements; ratios are medians of the per-round ratios to direct from the same round; errors are summed over rounds. ", rep.Rounds, rep.Measure)
	fmt.Fprintf(&b, "Each measurement starts a fresh peer process; proxy CPU (utime+stime) and RSS come from /proc of that process and its children. The mock upstream and the load generator share the machine with the proxy. ")
	env := ""
	if rep.SsegateEnv != "" {
		env = " and the environment `" + rep.SsegateEnv + "`"
	}
	fmt.Fprintf(&b, "ssegate ran with `%s`%s; nginx with `proxy_buffering off`, upstream keep-alive, no access log; httputil.ReverseProxy with `FlushInterval: -1`, reading the request body first; fasthttp is a minimal relay on ssegate's libraries (HostClient with StreamResponseBody, SetBodyStreamWriter, a flush per upstream read), parsing and recording nothing; caddy (built from its module) with `reverse_proxy` and `flush_interval -1`, upstream keep-alive, no admin endpoint, no access log; portkey is the Portkey gateway on Node, each request carrying its routing headers (`x-portkey-provider: openai`, `x-portkey-custom-host` to the mock).\n\n", rep.SsegateFlags, env)
	if rep.Baseline != "" {
		fmt.Fprintf(&b, "ssegate@baseline is `%s`%s, run with the same flags and environment as ssegate%s.\n\n", rep.Baseline, built(rep.BaselineRev), built(rep.SsegateRev))
	}
	fmt.Fprintf(&b, "Command: `%s`\n\n", strings.Join(rep.Command, " "))
	for _, n := range rep.Notes {
		fmt.Fprintf(&b, "- Note: %s\n", n)
	}
	if len(rep.Notes) > 0 {
		b.WriteString("\n")
	}
	rep.peerSummary(&b)
	rep.baselineSummary(&b)
	rep.writeBoardTargets(&b)
	for _, t := range tables {
		rows := rep.rows(t.scn, t.main)
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(&b, "### %s\n\n%s\n\n", t.title, t.about)
		step := ""
		for i, a := range rows {
			if a.step != step && t.scn != "sweep" {
				if i > 0 {
					b.WriteString("\n")
				}
				fmt.Fprintf(&b, "**%s**\n\n", a.step)
				writeHead(&b, t.cols)
			} else if i == 0 {
				writeHead(&b, t.cols)
			}
			step = a.step
			cells := make([]string, len(t.cols))
			for k, c := range t.cols {
				cells[k] = c.cell(a)
			}
			fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | "))
		}
		b.WriteString("\n")
		for _, a := range rows {
			for _, f := range a.failed {
				fmt.Fprintf(&b, "- %s, %s: %s\n", a.path, a.step, f)
			}
			if n := a.sum(errs); n > 0 {
				var samples []string
				for _, m := range a.ms {
					for _, e := range m.ErrorSamples {
						samples = addDistinct(samples, e)
					}
				}
				fmt.Fprintf(&b, "- %s, %s: %d errors, e.g. %s\n", a.path, a.step, n, strings.Join(samples[:min(len(samples), 3)], "; "))
			}
		}
		b.WriteString("\n")
	}
	rep.writeBoard(&b)
	rep.writeShard(&b)
	return b.String()
}

// built describes a build revision for the Markdown; "" when unknown.
func built(rev string) string {
	if rev == "" {
		return ""
	}
	short, rest, _ := strings.Cut(rev, " ")
	if len(short) > 12 {
		short = short[:12]
	}
	if rest != "" {
		short += " " + rest
	}
	return " (built from " + short + ")"
}

// pairRows returns, for every table, one row of cells for each of
// ssegate's rows that has a counterpart in the same step, the paths of the
// counterparts being others(path): scenario, step, path, counterpart,
// metric, the table's main metric of both and the median of their
// per-round ratios, the proxy CPU per event of both and the median of its
// ratios.
func (rep *report) pairRows(others func(path string) []string) [][]string {
	var out [][]string
	for _, t := range tables {
		rows := rep.rows(t.scn, t.main)
		byKey := map[[2]string]*agg{}
		for _, a := range rows {
			byKey[[2]string{a.step, a.path}] = a
		}
		metric := "events/s"
		if t.scn == "b" {
			metric = "TTFE p50 µs"
		}
		for _, a := range rows {
			if a.server != kindSsegate {
				continue
			}
			for _, name := range others(a.path) {
				o := byKey[[2]string{a.step, name}]
				if o == nil {
					continue
				}
				out = append(out, []string{t.scn, a.step, a.path, name, metric,
					fmtNum(a.med(t.main), 0), fmtNum(o.med(t.main), 0), fmtRatio(pairRatio(a, o, t.main)),
					fmtNum(a.med(cpuEv), 2), fmtNum(o.med(cpuEv), 2), fmtRatio(pairRatio(a, o, cpuEv))})
			}
		}
	}
	return out
}

// writeSummary writes a summary table: its heading, what it says, the
// header row and the rows.
func writeSummary(b *strings.Builder, heading, about string, head []string, rows [][]string) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "### %s\n\n%s\n\n", heading, about)
	aligns := make([]string, len(head))
	for i := range head {
		aligns[i] = "---:"
		if i < len(head)-6 {
			aligns[i] = "---"
		}
	}
	fmt.Fprintf(b, "| %s |\n| %s |\n", strings.Join(head, " | "), strings.Join(aligns, " | "))
	for _, r := range rows {
		fmt.Fprintf(b, "| %s |\n", strings.Join(r, " | "))
	}
	b.WriteString("\n")
}

// summaryPeers are the peers the summary at the top of the report puts
// ssegate's paths beside, in its order.
var summaryPeers = []string{pathCaddy.name, pathNginx.name}

// peerSummary writes, when the run measured caddy or nginx beside ssegate,
// one row for each of ssegate's two paths and each of those peers in every
// step where both ran: the table's main metric and the proxy CPU per event
// of both, and the medians of their per-round ratios.
func (rep *report) peerSummary(b *strings.Builder) {
	rows := rep.pairRows(func(p string) []string {
		if p != pathSsegate.name && p != pathSsegateKey.name {
			return nil
		}
		return summaryPeers
	})
	var against []string
	for _, name := range summaryPeers {
		for _, r := range rows {
			if r[3] == name {
				against = append(against, name)
				break
			}
		}
	}
	writeSummary(b, "ssegate against "+strings.Join(against, " and "),
		"Each of ssegate's two paths (ssegate+key records every stream) beside the general-purpose proxies in the same step: the median over rounds of the scenario's main metric and of proxy CPU per event, and the median of the per-round ratios ssegate / peer (above 1.00× ssegate has more events/s, a longer TTFE or more CPU than the peer). Errors are in the scenarios' tables.",
		[]string{"scenario", "step", "path", "against", "metric", "ssegate", "peer", "ratio", "CPU µs/event", "peer", "CPU ratio"}, rows)
}

// baselineSummary writes, when the run measured a -baseline, one row for
// each of ssegate's paths in every step where its baseline path ran too:
// the table's main metric and the proxy CPU per event of both, and the
// medians of their per-round ratios.
func (rep *report) baselineSummary(b *strings.Builder) {
	rows := rep.pairRows(func(p string) []string {
		if name, ok := baselineOf[p]; ok {
			return []string{name}
		}
		return nil
	})
	for i, r := range rows {
		rows[i] = append(r[:3:3], r[4:]...) // the counterpart is always the path's baseline
	}
	writeSummary(b, "ssegate against ssegate@baseline",
		"Each of ssegate's paths beside the same path through the baseline binary, measured right after it in every round: the median over rounds of the scenario's main metric and of proxy CPU per event, and the median of the per-round ratios ssegate / ssegate@baseline (1.00× is no change; above it ssegate has more events/s, a longer TTFE or more CPU than its baseline). Errors are in the scenarios' tables.",
		[]string{"scenario", "step", "path", "metric", "ssegate", "@baseline", "ratio", "CPU µs/event", "@baseline", "CPU ratio"}, rows)
}

// pairRatio returns the median, over the rounds that measured both a and
// base, of f of a's measurement over f of base's.
func pairRatio(a, base *agg, f func(m *measurement) float64) float64 {
	byRound := map[int]*measurement{}
	for _, m := range base.ms {
		byRound[m.Round] = m
	}
	var rs []float64
	for _, m := range a.ms {
		if d := byRound[m.Round]; d != nil {
			rs = append(rs, ratio(f(m), f(d)))
		}
	}
	return median(rs)
}

func writeHead(b *strings.Builder, cols []column) {
	heads := make([]string, len(cols))
	aligns := make([]string, len(cols))
	for i, c := range cols {
		heads[i], aligns[i] = c.head, c.align
	}
	fmt.Fprintf(b, "| %s |\n| %s |\n", strings.Join(heads, " | "), strings.Join(aligns, " | "))
}
