package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// options are the suite's flags.
type options struct {
	scenarios  []string
	rounds     int
	duration   time.Duration
	quick      bool
	out        string
	conc       int
	events     int
	slow       []slowStep
	slowEvents int
	slowPace   time.Duration
	fanoutPace time.Duration
	redisLoad  slowStep // scenario redis, CPU step
	redisJoin  slowStep // scenario redis, joiner step
	sweep      []int
	board      boardOptions
	ssegateBin string
	ssegateArg string
	ssegateEnv string
	baseline   string        // a second ssegate binary, measured beside ssegate
	profile    string        // -profile: where ssegate's CPU and heap profiles go; "" for none
	traces     bool          // -traces: the measured ssegate exports spans (ssegate@baseline does not)
	peers      map[kind]bool // the peers to measure; direct always is
	soak       soakOptions
	shard      shardOptions
}

// parseFlags parses the command line into options; quick mode changes the
// defaults of the flags not given.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	scn := fs.String("scenarios", "a,b,c,d,e,f,sweep,redis,shard,board", "comma-separated scenarios to run: a saturation, b latency, c many slow streams, d replay, e fan-out, f resume, sweep (events/s against concurrency, for the chart), redis (the Redis store beside the in-memory one; needs redis-server on PATH), shard (the concurrent streams one Redis shard holds: the Redis store driven without HTTP; needs redis-server, or valkey-server with -shard-server valkey), board (the gateway board's method: added latency, time to first content token and CPU per request; its paced streams at concurrency 1 take most of an hour and a quarter at the defaults)")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds of every measurement (the tables show medians)")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "length of one timed measurement (a, b, d, e, f, sweep)")
	fs.BoolVar(&o.quick, "quick", false, "a short smoke run: 1 round, 300ms measurements, small steps (unless those flags are given)")
	fs.StringVar(&o.out, "out", "", "directory for the JSON, Markdown and SVG results (default bench/results under the module)")
	fs.IntVar(&o.conc, "conc", 64, "concurrent streams of scenarios a, d, e and f")
	fs.IntVar(&o.events, "events", 200, "events per stream of scenarios a, d, e, f and sweep")
	slow := fs.String("slow", "512,2000@50ms,10000@250ms:48", "steps of scenario c, comma-separated, each N[@PACE][:EVENTS]: N streams of EVENTS events (default -slow-events) paced at PACE (default -slow-pace)")
	fs.IntVar(&o.slowEvents, "slow-events", 200, "events per stream of scenario c, unless a step says")
	fs.DurationVar(&o.slowPace, "slow-pace", 10*time.Millisecond, "pause before each event of scenario c, unless a step says")
	fs.DurationVar(&o.fanoutPace, "fanout-pace", 5*time.Millisecond, "pause before each event of scenario e, so that the clients join a live generation")
	redisLoad := fs.String("redis-load", "256@10ms:200", "CPU step of scenario redis, N[@PACE][:EVENTS] as a step of -slow")
	redisJoin := fs.String("redis-join", "16@20ms:200", "joiner step of scenario redis, N[@PACE][:EVENTS]: N streams, each joined on its own replica and on another")
	sweep := fs.String("sweep", "1,8,64,256", "comma-separated concurrencies of the sweep")
	boardConc := fs.String("board-conc", "1,64", "comma-separated concurrencies of scenario board")
	fs.IntVar(&o.board.paced, "board-paced", 500, "paced streams a path makes at each concurrency of scenario board, over all rounds (each round makes its share, rounded up to as many for every client): enough for a p99; at concurrency 1 each takes about (deltas+3) × -board-pace")
	fs.IntVar(&o.board.deltas, "board-deltas", 64, "content tokens (deltas) of every answer of scenario board")
	fs.DurationVar(&o.board.pace, "board-pace", 20*time.Millisecond, "pause before each event of scenario board's paced streams")
	fs.StringVar(&o.ssegateBin, "ssegate", "", "ssegate binary to measure (default: built from ./cmd/ssegate at the start)")
	fs.StringVar(&o.ssegateArg, "ssegate-args", "", "extra flags for ssegate, space-separated")
	fs.StringVar(&o.ssegateEnv, "ssegate-env", "", "extra environment for ssegate, space-separated NAME=VALUE (e.g. GOMAXPROCS=1)")
	fs.StringVar(&o.baseline, "baseline", "", "a second ssegate binary to measure beside ssegate, e.g. one built from the commit before a change: paths ssegate@baseline and ssegate@baseline+key, started with the same flags and environment (-ssegate-args, -ssegate-env), each measured right after its ssegate counterpart in every round of a, b, c, e and sweep; in every table, the JSON, the SVG, and a summary of ssegate against it at the top of the report. Needs ssegate in -peers")
	fs.StringVar(&o.profile, "profile", "", "a directory for ssegate's CPU and heap profiles: every ssegate (and -baseline) measurement starts ssegate with -pprof on an admin listener of its own, fetches a CPU profile over the first -duration of the load (at least 1s) and a heap profile after it, and writes SCENARIO-STEP-rROUND-PATH.cpu.pprof and .heap.pprof there (go tool pprof reads them)")
	fs.BoolVar(&o.traces, "traces", false, "the measured ssegate exports its spans (-traces otlp) to an OTLP/HTTP sink in the bench process; ssegate@baseline does not, so -baseline with the same binary measures what tracing costs: e.g. -baseline \"$(go env GOPATH)/bin/ssegate\" -ssegate \"$(go env GOPATH)/bin/ssegate\" -traces")
	peers := fs.String("peers", "httputil,fasthttp,nginx,caddy,portkey,ssegate", "comma-separated peers to measure beside direct: httputil, fasthttp (a minimal relay on ssegate's own libraries), nginx (when on PATH), caddy (built from the bench/caddy module with go build at the start; the Go module proxy serves it on the first build), portkey (the Portkey gateway, installed with npm ci from bench/portkey into the user's cache directory on first use; only when node and npm are on PATH, skipped with a note otherwise), ssegate")
	o.soak.register(fs)
	shardSteps := o.shard.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.soak.on {
		if o.baseline != "" {
			return nil, errors.New("-baseline is for the suite, not -soak")
		}
		return o, o.soak.check()
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.quick {
		// A smoke run's sizes, for every flag the command line left alone.
		for name, v := range map[string]string{
			"rounds": "1", "duration": "300ms", "slow": "64", "slow-events": "50", "sweep": "1,64",
			"events": "100", "fanout-pace": "2ms", "redis-load": "64@10ms:50", "redis-join": "4@10ms:50",
			"board-paced": "4", "board-pace": "5ms",
			"shard-steps": "200,500", "shard-stream": "2s", "shard-events": "40", "shard-window": "2s",
		} {
			if !set[name] {
				if err := fs.Set(name, v); err != nil {
					return nil, err
				}
			}
		}
	}
	var err error
	if o.slow, err = parseSlow(*slow, o.slowPace, o.slowEvents); err != nil {
		return nil, fmt.Errorf("-slow: %w", err)
	}
	for _, f := range []struct {
		name string
		s    string
		dst  *slowStep
	}{{"redis-load", *redisLoad, &o.redisLoad}, {"redis-join", *redisJoin, &o.redisJoin}} {
		st, err := parseSlow(f.s, o.slowPace, o.slowEvents)
		if err == nil && len(st) != 1 {
			err = errors.New("one step only")
		}
		if err != nil {
			return nil, fmt.Errorf("-%s: %w", f.name, err)
		}
		*f.dst = st[0]
	}
	if err := o.shard.parse(*shardSteps); err != nil {
		return nil, err
	}
	if o.sweep, err = intList(*sweep); err != nil {
		return nil, fmt.Errorf("-sweep: %w", err)
	}
	if o.board.conc, err = intList(*boardConc); err != nil {
		return nil, fmt.Errorf("-board-conc: %w", err)
	}
	o.peers = map[kind]bool{kindDirect: true}
	for _, p := range strings.Split(*peers, ",") {
		switch k := kind(strings.TrimSpace(p)); k {
		case kindHTTPUtil, kindFastHTTP, kindNginx, kindCaddy, kindPortkey, kindSsegate:
			o.peers[k] = true
		case "":
		default:
			return nil, fmt.Errorf("-peers: unknown peer %q", p)
		}
	}
	if o.baseline != "" {
		if !o.peers[kindSsegate] {
			return nil, errors.New("-baseline is measured beside ssegate: add ssegate to -peers")
		}
		o.peers[kindBaseline] = true
	}
	known := map[string]bool{}
	for _, s := range scenarios {
		known[s.id] = true
	}
	for _, s := range strings.Split(*scn, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !known[s] {
			return nil, fmt.Errorf("-scenarios: unknown scenario %q", s)
		}
		o.scenarios = append(o.scenarios, s)
	}
	switch {
	case o.rounds < 1:
		return nil, errors.New("-rounds must be at least 1")
	case o.duration <= 0:
		return nil, errors.New("-duration must be positive")
	case o.conc < 1 || o.conc > 100_000:
		return nil, errors.New("-conc must be in 1..100000")
	case o.events < 8 || o.events > 100_000 || o.slowEvents < 4 || o.slowEvents > 100_000:
		return nil, errors.New("-events must be in 8..100000 and -slow-events in 4..100000")
	case o.board.paced < 1 || o.board.paced > 1_000_000:
		return nil, errors.New("-board-paced must be in 1..1000000")
	case o.board.deltas < 1 || o.board.deltas > 100_000:
		return nil, errors.New("-board-deltas must be in 1..100000")
	case o.board.pace <= 0 || o.board.pace > 10*time.Second:
		return nil, errors.New("-board-pace must be in (0, 10s]")
	}
	return o, nil
}

// slowStep is one step of scenario c.
type slowStep struct {
	streams int
	pace    time.Duration
	events  int
}

// parseSlow parses the steps of scenario c: "512,2000@50ms,10000@250ms:48".
func parseSlow(s string, pace time.Duration, events int) ([]slowStep, error) {
	var out []slowStep
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		st := slowStep{pace: pace, events: events}
		if rest, ev, ok := strings.Cut(f, ":"); ok {
			n, err := strconv.Atoi(ev)
			if err != nil || n < 4 || n > 100_000 {
				return nil, fmt.Errorf("%q: events %q is not in 4..100000", f, ev)
			}
			st.events, f = n, rest
		}
		if rest, p, ok := strings.Cut(f, "@"); ok {
			d, err := time.ParseDuration(p)
			if err != nil || d < 0 || d > 10*time.Second {
				return nil, fmt.Errorf("%q: pace %q is not a duration in 0..10s", f, p)
			}
			st.pace, f = d, rest
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 100_000 {
			return nil, fmt.Errorf("%q is not a count in 1..100000", f)
		}
		st.streams = n
		out = append(out, st)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

// intList parses "1,8,64".
func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 100_000 {
			return nil, fmt.Errorf("%q is not a count in 1..100000", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

// env is what every measurement of a run shares: the mock upstream, the
// binaries and the directories.
type env struct {
	mockURL     string
	mockAddr    string
	ssegateBin  string
	ssegateArgs []string
	ssegateEnv  []string
	baselineBin string    // -baseline, absolute; "" without
	profile     bool      // -profile: ssegate serves its profiler on an admin listener
	otlp        *otlpSink // -traces: where the measured ssegate exports its spans
	self        string    // this binary, for its peer children (httputil, fasthttp, the mock)
	nginxBin    string
	caddyBin    string       // built at the start when caddy is in -peers; "" otherwise or when the build failed
	dirs        map[kind]int // measurements of each peer that has a directory of its own (peerDir)
	portkeyDir  string       // the Portkey installation when portkey is in -peers; "" otherwise or when it failed
	tmp         string
	logDir      string

	mu      sync.Mutex // guards running
	running map[*server]struct{}
}

// runner runs the scenarios and keeps their measurements.
type runner struct {
	env   *env
	opt   *options
	ms    []measurement
	notes []string
	nonce int64 // makes keys unique across runs
	// shardRows are scenario shard's steps.
	shardRows []*shardRow
	noFile    uint64
	stderr    io.Writer
}

// logf prints a progress line to stderr.
func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func main() {
	if child(os.Args[1:]) {
		return
	}
	opt, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if opt.soak.on {
		err = runSoak(&opt.soak, opt.ssegateBin, strings.Fields(opt.ssegateArg), strings.Fields(opt.ssegateEnv), os.Stdout, os.Stderr)
	} else {
		err = run(opt, os.Stdout, os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// child runs the hidden subcommands that make the bench binary a peer
// process: the httputil or fasthttp baseline, or the mock upstream. It
// reports whether args named one.
func child(args []string) bool {
	var err error
	switch {
	case len(args) == 3 && args[0] == httputilCommand:
		err = serveHTTPUtil(args[1], args[2])
	case len(args) == 3 && args[0] == fasthttpCommand:
		err = serveFastHTTP(args[1], args[2])
	case len(args) == 2 && args[0] == mockCommand:
		err = serveMock(args[1])
	case len(args) == 2 && args[0] == shardCommand:
		err = serveShardDriver(args[1])
	default:
		return false
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", args[0], err)
		os.Exit(1)
	}
	return true
}

// moduleRoot returns the directory of the main module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the ssegate module: run from the repository")
	}
	return filepath.Dir(mod), nil
}

// checkBinary returns the absolute path of bin, an executable file.
func checkBinary(bin string) (string, error) {
	abs, err := filepath.Abs(bin)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%s is not an executable file", abs)
	}
	return abs, nil
}

// run runs the suite with opt, writes the results and prints the report.
func run(opt *options, stdout, stderr io.Writer) error {
	start := time.Now()
	r := &runner{opt: opt, nonce: start.UnixNano(), stderr: stderr}
	// Descriptors: each stream of scenario c holds a client and a server
	// socket in the bench (direct) or a client, a proxy and an upstream
	// socket across the processes; raise the limit for this process and
	// the peers it starts.
	need := uint64(4096)
	for _, st := range opt.slow {
		need = max(need, uint64(4*st.streams+4096))
	}
	noFile, err := raiseNoFile(need)
	r.noFile = noFile
	if err != nil {
		r.notes = append(r.notes, fmt.Sprintf("could not raise RLIMIT_NOFILE to %d (%v); it is %d", need, err, noFile))
	}

	tmp, err := os.MkdirTemp("", "ssegate-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	e := &env{tmp: tmp, logDir: tmp}
	r.env = e
	if e.self, err = os.Executable(); err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}
	if opt.baseline != "" {
		if e.baselineBin, err = checkBinary(opt.baseline); err != nil {
			return fmt.Errorf("-baseline: %w", err)
		}
	}
	root := ""
	if opt.out == "" || opt.ssegateBin == "" || opt.peers[kindCaddy] || opt.peers[kindPortkey] {
		if root, err = moduleRoot(); err != nil {
			return err
		}
	}
	if opt.out == "" {
		opt.out = filepath.Join(root, "bench", "results")
	}
	if err := os.MkdirAll(opt.out, 0o755); err != nil {
		return err
	}
	stamp := start.UTC().Format("20060102-150405")
	e.logDir = filepath.Join(opt.out, "logs-"+stamp)
	if err := os.MkdirAll(e.logDir, 0o755); err != nil {
		return err
	}
	e.ssegateBin = opt.ssegateBin
	if e.ssegateBin == "" {
		e.ssegateBin = filepath.Join(tmp, "ssegate")
		r.logf("building ssegate from %s/cmd/ssegate", root)
		cmd := exec.Command("go", "build", "-o", e.ssegateBin, "./cmd/ssegate")
		cmd.Dir, cmd.Stdout, cmd.Stderr = root, stderr, stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build ssegate: %w", err)
		}
	}
	e.ssegateArgs = strings.Fields(opt.ssegateArg)
	if opt.profile != "" {
		if err := os.MkdirAll(opt.profile, 0o755); err != nil {
			return err
		}
		e.profile = true
	}
	e.ssegateEnv = strings.Fields(opt.ssegateEnv)
	if opt.traces {
		if e.otlp, err = startOTLPSink(); err != nil {
			return fmt.Errorf("-traces: %w", err)
		}
		defer e.otlp.close()
	}
	if opt.peers[kindNginx] {
		if p, err := exec.LookPath("nginx"); err == nil {
			e.nginxBin = p
		} else {
			r.notes = append(r.notes, "nginx is not on PATH: its baseline was skipped (install nginx, e.g. apt-get install nginx-light, to include it)")
		}
	}
	if opt.peers[kindCaddy] {
		bin := filepath.Join(tmp, "caddy")
		r.logf("building caddy from %s/%s", root, caddyModuleDir)
		if err := buildCaddy(root, bin, stderr); err != nil {
			r.notes = append(r.notes, fmt.Sprintf("caddy could not be built (%v): its rows were skipped", err))
		} else {
			e.caddyBin = bin
		}
	}
	if opt.peers[kindPortkey] {
		if err := haveNode(); err != nil {
			r.notes = append(r.notes, fmt.Sprintf("%v: the Portkey gateway was skipped (it needs node and npm)", err))
		} else if e.portkeyDir, err = installPortkey(root, r.logf, stderr); err != nil {
			r.notes = append(r.notes, fmt.Sprintf("the Portkey gateway could not be installed (%v): its rows were skipped", err))
		}
	}

	// The peers run in process groups of their own, out of reach of the
	// terminal's Ctrl-C: take them down with the run.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	go func() {
		if _, ok := <-sig; ok {
			r.logf("interrupted: stopping the peers")
			e.killAll()
			os.RemoveAll(tmp)
			os.Exit(130)
		}
	}()

	mock, err := e.startMock()
	if err != nil {
		return err
	}
	defer mock.stop()

	r.logf("ssegate bench: %d cores, scenarios %s, %d rounds of %s, results in %s",
		runtime.NumCPU(), strings.Join(opt.scenarios, ","), opt.rounds, opt.duration, opt.out)
	for _, id := range opt.scenarios {
		for _, s := range scenarios {
			if s.id == id {
				r.logf("scenario %s: %s", s.id, s.title)
				s.run(r)
			}
		}
	}

	if e.otlp != nil {
		r.notes = append(r.notes, e.otlp.note())
	}
	rep := r.report(start, time.Since(start))
	base := filepath.Join(opt.out, "bench-"+stamp)
	if err := writeJSON(base+".json", rep); err != nil {
		return err
	}
	md := rep.markdown()
	if err := os.WriteFile(base+".md", []byte(md), 0o644); err != nil {
		return err
	}
	files := []string{base + ".json", base + ".md"}
	if svg := rep.svg(); svg != "" {
		if err := os.WriteFile(base+".svg", []byte(svg), 0o644); err != nil {
			return err
		}
		files = append(files, base+".svg")
	}
	fmt.Fprint(stdout, md)
	r.logf("done in %s; wrote %s (peer logs in %s)", time.Since(start).Round(time.Second), strings.Join(files, ", "), e.logDir)
	return nil
}
