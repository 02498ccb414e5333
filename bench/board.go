package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Scenario board follows the method of the independent LLM-gateway board
// (GetBusbar's): a mock upstream, requests one at a time and 64 at once,
// and what a gateway adds to the direct path's latency and time to first
// token, as the gateway's percentile minus direct's from the same run. For
// every concurrency of -board-conc it measures three kinds of request, each
// answer of -board-deltas content tokens (deltas):
//
//   - non-streaming: "stream": false, the mock answering at once;
//   - dense stream: the deltas back to back;
//   - paced stream: the deltas -board-pace apart (64 deltas 20 ms apart
//     by default, the board's streams: about 1.3 s a stream).
//
// The paths are direct, nginx, the bare fasthttp relay, caddy, ssegate
// without a key, ssegate+key (a fresh key a request) and ssegate hit (every
// request the key of one answer stored before the load: a replay), with
// -baseline the baseline's two paths too, interleaved in rounds as in every
// scenario. The timed kinds run -duration a round; the paced one makes
// -board-paced streams a path over all rounds, which is what takes the
// time: at concurrency 1 the default 500 are about 11 minutes a path
// (deltas+3 events, each after the pace), and the scenario about an hour
// and a quarter with every peer (boardWall estimates it at the start).
//
// Latency is from writing the request to the end of the answer; time to
// first token (TTFT) to the end of the first event that carries generated
// text: the mock's first chat chunk names the role with "content":"" and is
// not one. A whole answer gives one sample of each; an answer that is not
// whole is an error and gives none. The samples of a path are pooled over
// the rounds and its percentiles taken from the pool, so that the tails
// rest on every sample, and direct's likewise: added p99 = the path's p99
// minus direct's p99, over the same rounds. A percentile is shown only
// when the samples reach it: p99 from 100, p99.9 from 1,000 (nearest rank).
// CPU per request is the peer process's (and its children's) utime+stime
// over the load, divided by the requests made, the median over rounds.

// boardOptions are scenario board's flags.
type boardOptions struct {
	conc   []int
	paced  int // paced streams a path at each concurrency, over all rounds
	deltas int
	pace   time.Duration
}

// pathHit is ssegate answering from its store: every request carries the
// key of one answer stored before the load.
var pathHit = path{name: "ssegate hit", kind: kindSsegate, keyed: true}

// boardKind is one of the board's request kinds.
type boardKind struct {
	name  string
	plain bool          // non-streaming
	pace  time.Duration // the paced stream's
}

// boardKinds returns the kinds in the order they are measured.
func (o *boardOptions) kinds() []boardKind {
	return []boardKind{{name: "non-streaming", plain: true}, {name: "dense stream"}, {name: "paced stream", pace: o.pace}}
}

// step names the step of kind k at concurrency conc.
func (o *boardOptions) step(k boardKind, conc int) string {
	switch {
	case k.plain:
		return fmt.Sprintf("c=%d, non-streaming, %d tokens", conc, o.deltas)
	case k.pace > 0:
		return fmt.Sprintf("c=%d, paced stream, %d deltas @ %s", conc, o.deltas, k.pace)
	}
	return fmt.Sprintf("c=%d, dense stream, %d deltas", conc, o.deltas)
}

// pacedPerRound returns the paced streams a path makes in one of rounds
// rounds at concurrency conc: its share of the total, rounded up to as
// many for every client, so that all conc stay busy to the end.
func (o *boardOptions) pacedPerRound(rounds, conc int) int {
	share := (o.paced + rounds - 1) / rounds
	return (share + conc - 1) / conc * conc
}

// boardPaths returns the scenario's paths that run here.
func (r *runner) boardPaths() []path {
	return r.only(pathDirect, pathNginx, pathFastHTTP, pathCaddy, pathSsegate, pathBaseline, pathSsegateKey, pathBaselineKey, pathHit)
}

// boardWall estimates the wall time of the scenario with npaths paths:
// the paced streams' waves (a hit does not wait for the pace), the timed
// measurements, and about a second a measurement to start its peer.
func boardWall(opt *options, npaths int) time.Duration {
	b := &opt.board
	stream := time.Duration(eventsFor(b.deltas)) * b.pace
	var d time.Duration
	for _, c := range b.conc {
		waves := (b.pacedPerRound(opt.rounds, c) + c - 1) / c
		d += time.Duration(opt.rounds*(npaths-1)*waves) * stream
		d += time.Duration(2*opt.rounds*npaths) * opt.duration
	}
	return d + time.Duration(3*len(b.conc)*opt.rounds*npaths)*time.Second
}

// board runs scenario board.
func (r *runner) board() {
	o := &r.opt.board
	paths := r.boardPaths()
	r.logf("  board: %d paths, about %s at these sizes (-board-paced %d, -board-conc %v)",
		len(paths), boardWall(r.opt, len(paths)).Round(time.Minute), o.paced, o.conc)
	for _, conc := range o.conc {
		for _, k := range o.kinds() {
			step := o.step(k, conc)
			r.interleave("board", step, conc, paths, func(p path, round int) prepareFunc {
				return r.boardJob(p, k, conc, round)
			})
			for i := range r.ms {
				if m := &r.ms[i]; m.Scenario == "board" && m.Step == step && m.Board == nil {
					m.Board = newBoardNumbers(k, m)
				}
			}
		}
	}
}

// boardJob returns the load of kind k on path p in one round: a unique key
// a request on the keyed path, the key of a stored answer on the hit path.
func (r *runner) boardJob(p path, k boardKind, conc, round int) prepareFunc {
	o := &r.opt.board
	return func(srv *server) (*job, error) {
		spec := reqSpec{tokens: o.deltas, delay: k.pace, plain: k.plain}
		expect := eventsFor(o.deltas)
		if k.plain {
			expect = wholeBody
		}
		j := &job{conc: conc, mode: modeLoop, duration: r.opt.duration, timed: true, maxStreams: 1_000_000}
		if k.pace > 0 {
			// A count of streams, not a time: the loop ends when the
			// round's share is made.
			j.duration, j.maxStreams = 24*time.Hour, int64(o.pacedPerRound(r.opt.rounds, conc))
		}
		prefix := fmt.Sprintf("board-%d-%s-r%d", r.nonce, profileName(o.step(k, conc)), round)
		switch {
		case p == pathHit:
			spec.key = prefix + "-hit"
			req := r.requestTo(srv, spec)
			c := newClientConn(srv.addr)
			res := c.roundTrip(req, time.Now().Add(2*time.Minute), false, nil, nil)
			c.close()
			if !res.ok(expect) {
				return nil, fmt.Errorf("storing the answer to replay: %s", res.problem(expect))
			}
			j.build = func(int, int) ([]byte, int) { return req, expect }
		case p.keyed:
			j.build = func(w, i int) ([]byte, int) {
				s := spec
				s.key = fmt.Sprintf("%s-%d-%d", prefix, w, i)
				return r.requestTo(srv, s), expect
			}
		default:
			req := r.requestTo(srv, spec)
			j.build = func(int, int) ([]byte, int) { return req, expect }
		}
		return j, nil
	}
}

// quantiles are the board's percentiles of one set of samples, in µs.
type quantiles struct {
	P50  num `json:"p50"`
	P99  num `json:"p99"`
	P999 num `json:"p99_9"`
}

// boardPerMille are the board's percentiles, in thousandths.
var boardPerMille = [3]int{500, 990, 999}

// at returns q's percentile of per-mille pm.
func (q *quantiles) at(pm int) *num {
	switch pm {
	case 500:
		return &q.P50
	case 990:
		return &q.P99
	}
	return &q.P999
}

// quantile returns the per-mille pm percentile of sorted by the nearest
// rank, in µs; NaN when the samples do not reach it (p99 needs 100, p99.9
// 1,000): a p99.9 of 500 samples would be their maximum.
func quantile(sorted []time.Duration, pm int) num {
	n := len(sorted)
	if n == 0 || n*(1000-pm) < 1000 {
		return nan
	}
	rank := (pm*n + 999) / 1000 // ceil(pm/1000 × n), in integers
	rank = min(max(rank, 1), n)
	return num(us(sorted[rank-1]))
}

// quantilesOf returns the board's percentiles of sorted.
func quantilesOf(sorted []time.Duration) quantiles {
	var q quantiles
	for _, pm := range boardPerMille {
		*q.at(pm) = quantile(sorted, pm)
	}
	return q
}

// minus returns q − d, percentile by percentile: what a path adds to
// direct's. NaN where either is missing.
func (q quantiles) minus(d quantiles) quantiles {
	var out quantiles
	for _, pm := range boardPerMille {
		*out.at(pm) = num(float64(*q.at(pm)) - float64(*d.at(pm)))
	}
	return out
}

// boardNumbers is what scenario board measures of one round of one path,
// besides the common fields; the report's figures pool the rounds'
// samples (boardRow).
type boardNumbers struct {
	Kind            string    `json:"kind"`
	Samples         int       `json:"latency_samples"`
	TTFTSamples     int       `json:"ttft_samples"`
	Latency         quantiles `json:"latency_us"`
	TTFT            quantiles `json:"ttft_us"`
	CPUusPerRequest num       `json:"proxy_cpu_us_per_request"`
}

// newBoardNumbers returns the board's figures of m, a measurement of kind
// k.
func newBoardNumbers(k boardKind, m *measurement) *boardNumbers {
	return &boardNumbers{
		Kind: k.name, Samples: len(m.latency), TTFTSamples: len(m.ttft),
		Latency: quantilesOf(m.latency), TTFT: quantilesOf(m.ttft),
		CPUusPerRequest: perRequest(m),
	}
}

// perRequest returns m's proxy CPU per request made, in µs.
func perRequest(m *measurement) num {
	if m.Streams == 0 {
		return nan
	}
	return num(float64(m.CPUSec) * 1e6 / float64(m.Streams))
}

// boardRow is one row of the board's table: one path in one step, its
// samples pooled over the rounds.
type boardRow struct {
	Step    string   `json:"step"`
	Path    string   `json:"path"`
	Server  kind     `json:"server"`
	Conc    int      `json:"concurrency"`
	Rounds  int      `json:"rounds"`
	Failed  []string `json:"failed,omitempty"`
	Streams int64    `json:"requests"`
	Errors  int64    `json:"errors"`
	// ErrorSamples are some of the errors' reasons, from every round.
	ErrorSamples []string  `json:"error_samples,omitempty"`
	Samples      int       `json:"latency_samples"`
	TTFTSamples  int       `json:"ttft_samples"`
	Latency      quantiles `json:"latency_us"`
	// AddedLatency is Latency minus direct's, its samples pooled over the
	// same rounds; likewise AddedTTFT.
	AddedLatency quantiles `json:"added_latency_us"`
	TTFT         quantiles `json:"ttft_us"`
	AddedTTFT    quantiles `json:"added_ttft_us"`
	// CPUusPerRequest is the median over rounds of the peer's CPU per
	// request; null for direct.
	CPUusPerRequest num   `json:"proxy_cpu_us_per_request"`
	UpstreamCalls   int64 `json:"upstream_calls"` // -1 when a count could not be read
	Replayed        int64 `json:"replayed"`
}

// boardRows pools the board's measurements of ms into rows, in the order
// the steps and paths were measured, and computes what each path adds to
// direct's percentiles in its step.
func boardRows(ms []measurement) []*boardRow {
	type pool struct {
		row           *boardRow
		latency, ttft []time.Duration
		cpu           []float64
		upstreamKnown bool
	}
	var (
		order []*pool
		byKey = map[[2]string]*pool{}
	)
	for i := range ms {
		m := &ms[i]
		if m.Scenario != "board" {
			continue
		}
		k := [2]string{m.Step, m.Path}
		p := byKey[k]
		if p == nil {
			p = &pool{row: &boardRow{Step: m.Step, Path: m.Path, Server: m.Server, Conc: m.Conc}, upstreamKnown: true}
			byKey[k] = p
			order = append(order, p)
		}
		if m.Error != "" {
			p.row.Failed = append(p.row.Failed, fmt.Sprintf("round %d: %s", m.Round, m.Error))
			continue
		}
		p.row.Rounds++
		p.row.Streams += m.Streams
		p.row.Errors += m.Errors
		p.row.Replayed += m.Replayed
		for _, e := range m.ErrorSamples {
			if len(p.row.ErrorSamples) < 3 {
				p.row.ErrorSamples = addDistinct(p.row.ErrorSamples, e)
			}
		}
		if m.UpstreamCalls < 0 {
			p.upstreamKnown = false
		}
		p.row.UpstreamCalls += m.UpstreamCalls
		p.latency = append(p.latency, m.latency...)
		p.ttft = append(p.ttft, m.ttft...)
		p.cpu = append(p.cpu, float64(perRequest(m)))
	}
	direct := map[string]*boardRow{}
	out := make([]*boardRow, len(order))
	for i, p := range order {
		slices.Sort(p.latency)
		slices.Sort(p.ttft)
		r := p.row
		r.Samples, r.TTFTSamples = len(p.latency), len(p.ttft)
		r.Latency, r.TTFT = quantilesOf(p.latency), quantilesOf(p.ttft)
		r.CPUusPerRequest = nan
		if r.Server != kindDirect {
			r.CPUusPerRequest = num(median(p.cpu))
		}
		if !p.upstreamKnown {
			r.UpstreamCalls = -1
		}
		if r.Server == kindDirect {
			direct[r.Step] = r
		}
		out[i] = r
	}
	for _, r := range out {
		d := direct[r.Step]
		if d == nil {
			r.AddedLatency, r.AddedTTFT = quantiles{nan, nan, nan}, quantiles{nan, nan, nan}
			continue
		}
		r.AddedLatency, r.AddedTTFT = r.Latency.minus(d.Latency), r.TTFT.minus(d.TTFT)
	}
	return out
}

// boardTarget is one of the keyed path's targets (issue 41, point 2),
// read off one step of the board: value against reference, with the
// bound the target sets.
type boardTarget struct {
	Target    string `json:"target"`
	Step      string `json:"step"`
	Value     num    `json:"value"`     // ssegate's figure
	Reference num    `json:"reference"` // what it is held against
	Ratio     num    `json:"ratio"`     // Value / Reference
	Diff      num    `json:"difference"`
	Met       *bool  `json:"met"` // null when a figure is missing
}

// boardTargets reads the keyed path's targets off the rows of every step:
// a fresh key's added latency p50 and added TTFT p50 within 10 µs of the
// path without a key; its added p99 (latency and TTFT) no worse than the
// bare relay's; the path without a key adding no more at p50 than the bare
// relay; CPU per keyed request at most 1.2× the bare relay's.
func boardTargets(rows []*boardRow) []boardTarget {
	byKey := map[[2]string]*boardRow{}
	var steps []string
	for _, r := range rows {
		if len(steps) == 0 || steps[len(steps)-1] != r.Step {
			steps = append(steps, r.Step)
		}
		byKey[[2]string{r.Step, r.Path}] = r
	}
	var out []boardTarget
	for _, step := range steps {
		key, plain, relay := byKey[[2]string{step, pathSsegateKey.name}], byKey[[2]string{step, pathSsegate.name}], byKey[[2]string{step, pathFastHTTP.name}]
		stream := !strings.Contains(step, "non-streaming")
		add := func(target string, a, b *boardRow, f func(r *boardRow) num, slack, bound float64) {
			if a == nil || b == nil {
				return
			}
			t := boardTarget{Target: target, Step: step, Value: f(a), Reference: f(b)}
			v, ref := float64(t.Value), float64(t.Reference)
			t.Ratio, t.Diff = num(ratio(v, ref)), num(v-ref)
			if !math.IsNaN(v) && !math.IsNaN(ref) {
				met := v <= ref+slack
				if bound > 0 {
					met = ref > 0 && v <= bound*ref
				}
				t.Met = &met
			}
			out = append(out, t)
		}
		addedP50 := func(r *boardRow) num { return r.AddedLatency.P50 }
		addedP99 := func(r *boardRow) num { return r.AddedLatency.P99 }
		ttftP50 := func(r *boardRow) num { return r.AddedTTFT.P50 }
		ttftP99 := func(r *boardRow) num { return r.AddedTTFT.P99 }
		cpu := func(r *boardRow) num { return r.CPUusPerRequest }
		add("fresh key: added latency p50 ≤ no key's + 10 µs", key, plain, addedP50, 10, 0)
		if stream {
			add("fresh key: added TTFT p50 ≤ no key's + 10 µs", key, plain, ttftP50, 10, 0)
		}
		add("fresh key: added latency p99 ≤ the bare relay's", key, relay, addedP99, 0, 0)
		if stream {
			add("fresh key: added TTFT p99 ≤ the bare relay's", key, relay, ttftP99, 0, 0)
		}
		add("no key: added latency p50 ≤ the bare relay's", plain, relay, addedP50, 0, 0)
		add("fresh key: CPU per request ≤ 1.2× the bare relay's", key, relay, cpu, 0, 1.2)
	}
	return out
}

// boardCited are the published board's own figures, another rig's: cited
// beside this run's rows, never compared with them as equals.
const boardCited = "Another rig's figures, cited for orientation and not comparable as equals: on the published GetBusbar LLM-gateway board (the same method: a mock upstream, concurrency 1, 64 deltas 20 ms apart), measured on a 4-core machine, its leaders (LiteLLM's Rust gateway and Busbar) add 107–116 µs of latency at p99. There nginx would add less than here; set beside this run only as ratios to a relay measured in the same run (nginx, the bare relay)."

// boardAbout explains the board's table.
const boardAbout = "The method of the independent LLM-gateway board (GetBusbar's): the mock upstream; non-streaming requests, dense streams and streams paced by the upstream, one request at a time (c=1) and many at once (c=64 by default); " +
	"ssegate+key sends a fresh Idempotency-Key a request (each a generation, recorded), ssegate hit the key of one answer stored before the load (a replay: its negative figures are the generation it did not wait for). " +
	"Latency = from writing the request to the end of the answer; TTFT = to the end of the first event that carries generated text (the role-only first chunk does not). " +
	"Each path's samples (one per whole answer) are pooled over the rounds, and added = the path's percentile minus direct's from the same rounds; a percentile needs 100 samples for p99 and 1,000 for p99.9 (nearest rank), else —. " +
	"CPU per request = the peer's utime+stime over the load per request made, median over rounds; /proc counts it in clock ticks (10 ms), so a round that costs the peer less than about 100 ms (a few paced streams) gives a coarse figure. Upstream calls per request: 0 for a replay."

// writeBoard writes the board's table, step by step, the published
// board's figures cited beside, and what failed.
func (rep *report) writeBoard(b *strings.Builder) {
	if len(rep.Board) == 0 {
		return
	}
	fmt.Fprintf(b, "### (board) Added latency and time to first token\n\n%s\n\n", boardAbout)
	cols := []column{colPath}
	head := []string{"requests (errors)", "latency samples", "latency p50 µs", "added p50 µs", "added p99 µs", "added p99.9 µs",
		"TTFT samples", "TTFT p50 µs", "added TTFT p50 µs", "added TTFT p99 µs", "added TTFT p99.9 µs", "proxy CPU µs/request", "upstream calls / request"}
	for _, h := range head {
		cols = append(cols, column{head: h, align: "---:"})
	}
	step := ""
	for _, r := range rep.Board {
		if r.Step != step {
			if step != "" {
				b.WriteString("\n")
			}
			fmt.Fprintf(b, "**%s**\n\n", r.Step)
			writeHead(b, cols)
			step = r.Step
		}
		calls := math.NaN()
		if r.UpstreamCalls >= 0 {
			calls = ratio(float64(r.UpstreamCalls), float64(r.Streams))
		}
		cells := []string{r.Path, fmt.Sprintf("%d (%d)", r.Streams, r.Errors), fmt.Sprint(r.Samples),
			fmtNum(float64(r.Latency.P50), 0), fmtAdded(float64(r.AddedLatency.P50)), fmtAdded(float64(r.AddedLatency.P99)), fmtAdded(float64(r.AddedLatency.P999)),
			fmt.Sprint(r.TTFTSamples), fmtNum(float64(r.TTFT.P50), 0), fmtAdded(float64(r.AddedTTFT.P50)), fmtAdded(float64(r.AddedTTFT.P99)), fmtAdded(float64(r.AddedTTFT.P999)),
			fmtNum(float64(r.CPUusPerRequest), 1), fmtNum(calls, 3)}
		fmt.Fprintf(b, "| %s |\n", strings.Join(cells, " | "))
	}
	fmt.Fprintf(b, "\n%s\n\n", boardCited)
	for _, r := range rep.Board {
		for _, f := range r.Failed {
			fmt.Fprintf(b, "- %s, %s: %s\n", r.Path, r.Step, f)
		}
		if r.Errors > 0 {
			fmt.Fprintf(b, "- %s, %s: %d errors, e.g. %s\n", r.Path, r.Step, r.Errors, strings.Join(r.ErrorSamples, "; "))
		}
	}
	b.WriteString("\n")
}

// writeBoardTargets writes the keyed path's targets read off the board,
// one row a target and step.
func (rep *report) writeBoardTargets(b *strings.Builder) {
	ts := boardTargets(rep.Board)
	if len(ts) == 0 {
		return
	}
	fmt.Fprintf(b, "### Targets of the keyed path (board)\n\n%s\n\n", "Read off the board's rows of this run (added figures are µs over direct's, CPU µs per request): ssegate's figure, what the target holds it against, their ratio and difference, and whether the target is met (a fresh key within 10 µs of no key; no worse than the bare relay; CPU at most 1.2× the bare relay's). — where a figure is missing (a percentile the samples do not reach, a path not run).")
	fmt.Fprintf(b, "| target | step | ssegate | against | ratio | difference | met |\n| --- | --- | ---: | ---: | ---: | ---: | --- |\n")
	for _, t := range ts {
		met := "—"
		if t.Met != nil {
			met = "no"
			if *t.Met {
				met = "**yes**"
			}
		}
		diff := "—"
		if d := float64(t.Diff); !math.IsNaN(d) {
			diff = fmt.Sprintf("%+.1f", d)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s |\n", t.Target, t.Step,
			fmtNum(float64(t.Value), 1), fmtNum(float64(t.Reference), 1), fmtRatio(float64(t.Ratio)), diff, met)
	}
	b.WriteString("\n")
}

// fmtAdded formats an added figure in µs with its sign, thousands grouped;
// "—" when it is missing.
func fmtAdded(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "—"
	}
	if x < 0 {
		return "-" + fmtNum(-x, 0)
	}
	return "+" + fmtNum(x, 0)
}
