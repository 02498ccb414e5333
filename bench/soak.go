package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The soak (go run ./bench -soak, make soak) holds -soak-streams paced
// streams open at once for -soak-duration against the built ssegate and its
// embedded mock (-upstream mock), each worker running its streams back to
// back with the load generator's client: a share of them keyed
// (-soak-keyed), and a share of the keyed ones left after a random number
// of events and resumed with Last-Event-ID into the live generation, by
// POST and by GET /streams/{key} in turn (-soak-resume). Every stream is
// checked whole; the event ids of keyed streams (and of both halves of a
// resumed one) must run 1..n without a gap, duplicate or reversal.
//
// It samples ssegate's goroutines (go_goroutines), live generations, Go
// heap in use and RSS every -soak-sample, from /metrics on an admin
// listener of its own, and after the load waits up to -soak-settle,
// collecting garbage before each look (a heap profile with gc=1), for them
// to come back; ssegate runs with -ttl -soak-ttl so that the committed
// streams expire meanwhile. It reports lost events (missing from a stream
// that ended as whole), events out of order, errors, and those figures
// before, during (with the drift from the second to the last quarter of the
// load) and after; it fails unless nothing was lost, reordered or failed,
// and goroutines, live generations and the heap came back near the start.
// RSS is reported, not judged: the runtime returns freed pages gradually.

// soakOptions are the soak's flags.
type soakOptions struct {
	on       bool
	streams  int
	duration time.Duration
	events   int
	pace     time.Duration
	keyed    float64
	resume   float64
	settle   time.Duration
	sample   time.Duration
	ttl      time.Duration
	seed     uint64
}

func (o *soakOptions) register(fs *flag.FlagSet) {
	fs.BoolVar(&o.on, "soak", false, "run the soak instead of the scenarios: -soak-streams paced streams at once for -soak-duration against ssegate -upstream mock")
	fs.IntVar(&o.streams, "soak-streams", 10000, "soak: streams open at once (one worker each, its streams back to back)")
	fs.DurationVar(&o.duration, "soak-duration", 10*time.Minute, "soak: how long workers start new streams")
	fs.IntVar(&o.events, "soak-events", 48, "soak: events per stream")
	fs.DurationVar(&o.pace, "soak-pace", 250*time.Millisecond, "soak: pause before each event of a stream")
	fs.Float64Var(&o.keyed, "soak-keyed", 0.5, "soak: share of streams with an Idempotency-Key (a unique one each)")
	fs.Float64Var(&o.resume, "soak-resume", 0.2, "soak: share of keyed streams left after a random number of events and resumed with Last-Event-ID")
	fs.DurationVar(&o.settle, "soak-settle", 2*time.Minute, "soak: how long to wait after the load for goroutines, live generations and the heap to come back")
	fs.DurationVar(&o.ttl, "soak-ttl", time.Minute, "soak: ssegate's -ttl, so that the committed keyed streams expire within -soak-settle and its memory can come back")
	fs.DurationVar(&o.sample, "soak-sample", 5*time.Second, "soak: how often ssegate's goroutines and RSS are sampled")
	fs.Uint64Var(&o.seed, "soak-seed", 0, "soak: seed of which streams are keyed and resumed (0: from the clock)")
}

func (o *soakOptions) check() error {
	switch {
	case o.streams < 1 || o.streams > 100_000:
		return errors.New("-soak-streams must be in 1..100000")
	case o.duration <= 0 || o.settle < 0 || o.sample <= 0 || o.ttl <= 0:
		return errors.New("-soak-duration, -soak-sample and -soak-ttl must be positive, -soak-settle not negative")
	case o.events < 4 || o.events > 100_000:
		return errors.New("-soak-events must be in 4..100000")
	case o.pace < 0 || o.pace > 10*time.Second:
		return errors.New("-soak-pace must be in 0..10s")
	case o.keyed < 0 || o.keyed > 1 || o.resume < 0 || o.resume > 1:
		return errors.New("-soak-keyed and -soak-resume must be in 0..1")
	}
	return nil
}

// soakSample is one look at the ssegate process.
type soakSample struct {
	at         time.Duration // since the load began; negative before it
	live       int64         // streams the clients had open (first event seen, end not yet)
	gens       int64         // ssegate_live_generations
	goroutines int64         // go_goroutines
	heap       int64         // go_memstats_heap_inuse_bytes
	rss        int64
}

func (s soakSample) String() string {
	return fmt.Sprintf("%7s  %6d live streams  %6d live generations  %7d goroutines  %7.1f MiB heap  %7.1f MiB RSS",
		s.at.Round(time.Second), s.live, s.gens, s.goroutines, mib(s.heap), mib(s.rss))
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// soakTally is what the workers counted; merged at the end.
type soakTally struct {
	streams, whole, errs                       int64
	keyed, resumed, resumedOK                  int64
	events, lost, reordered                    int64
	errSamples, lostSamples, reorderSamples    []string
	statusErrors, transportErrors, errorEvents int64
}

func (t *soakTally) add(o *soakTally) {
	t.streams += o.streams
	t.whole += o.whole
	t.errs += o.errs
	t.keyed += o.keyed
	t.resumed += o.resumed
	t.resumedOK += o.resumedOK
	t.events += o.events
	t.lost += o.lost
	t.reordered += o.reordered
	t.statusErrors += o.statusErrors
	t.transportErrors += o.transportErrors
	t.errorEvents += o.errorEvents
	for _, s := range o.errSamples {
		if len(t.errSamples) < 5 {
			t.errSamples = addDistinct(t.errSamples, s)
		}
	}
	for _, s := range o.lostSamples {
		if len(t.lostSamples) < 5 {
			t.lostSamples = addDistinct(t.lostSamples, s)
		}
	}
	for _, s := range o.reorderSamples {
		if len(t.reorderSamples) < 5 {
			t.reorderSamples = addDistinct(t.reorderSamples, s)
		}
	}
}

// fail counts a stream that did not arrive whole.
func (t *soakTally) fail(res *streamResult, expect int, what string) {
	t.errs++
	switch {
	case res.err != nil:
		t.transportErrors++
	case res.status != 200:
		t.statusErrors++
	case res.errEvent:
		t.errorEvents++
	}
	if len(t.errSamples) < 3 {
		t.errSamples = addDistinct(t.errSamples, what+": "+res.problem(expect))
	}
}

// checkIDs counts the events missing from and out of order in ids, which
// should be gen-from..gen-to of one generation, and returns the generation.
func (t *soakTally) checkIDs(ids []string, from, to int, what string) (gen string) {
	prev := from - 1
	for i, id := range ids {
		g, s, ok := strings.Cut(id, "-")
		seq, err := strconv.Atoi(s)
		if !ok || err != nil {
			t.reordered++
			t.note(&t.reorderSamples, fmt.Sprintf("%s: event %d has id %q", what, i+1, id))
			continue
		}
		if i == 0 {
			gen = g
		} else if g != gen {
			t.reordered++
			t.note(&t.reorderSamples, fmt.Sprintf("%s: event %d is of generation %s, the first of %s", what, i+1, g, gen))
		}
		switch {
		case seq <= prev:
			t.reordered++
			t.note(&t.reorderSamples, fmt.Sprintf("%s: event %d has sequence %d after %d", what, i+1, seq, prev))
		case seq > prev+1:
			t.lost += int64(seq - prev - 1)
			t.note(&t.lostSamples, fmt.Sprintf("%s: events %d..%d missing", what, prev+1, seq-1))
		}
		prev = max(prev, seq)
	}
	if prev < to {
		t.lost += int64(to - prev)
		t.note(&t.lostSamples, fmt.Sprintf("%s: ended as whole after event %d of %d", what, prev, to))
	}
	return gen
}

func (t *soakTally) note(samples *[]string, s string) {
	if len(*samples) < 3 {
		*samples = append(*samples, s)
	}
}

// runSoak runs the soak and writes its report to stdout.
func runSoak(o *soakOptions, ssegateBin string, extraArgs, extraEnv []string, stdout, stderr io.Writer) error {
	logf := func(format string, args ...any) {
		fmt.Fprintf(stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	// Each stream holds a client socket here and three in ssegate: its
	// client's, its upstream call's and the embedded mock's end of it.
	need := uint64(3*o.streams + 4096)
	noFile, err := raiseNoFile(need)
	var notes []string
	if err != nil {
		notes = append(notes, fmt.Sprintf("RLIMIT_NOFILE could not be raised to %d (%v): it is %d, which holds about %d streams (three descriptors each in ssegate with its embedded mock), not %d: expect connect errors; raising the hard limit needs CAP_SYS_RESOURCE",
			need, err, noFile, (noFile-64)/3, o.streams))
	}
	tmp, err := os.MkdirTemp("", "ssegate-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if ssegateBin == "" {
		root, err := moduleRoot()
		if err != nil {
			return err
		}
		ssegateBin = filepath.Join(tmp, "ssegate")
		logf("building ssegate from %s/cmd/ssegate", root)
		cmd := exec.Command("go", "build", "-o", ssegateBin, "./cmd/ssegate")
		cmd.Dir, cmd.Stdout, cmd.Stderr = root, stderr, stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build ssegate: %w", err)
		}
	}
	e := &env{tmp: tmp, logDir: tmp}
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	// /metrics and the profiler on an admin listener of their own: the
	// samples do not queue behind the load, and a heap profile with gc=1
	// collects garbage before the after-load samples.
	admin, err := freeAddr()
	if err != nil {
		return err
	}
	args := append([]string{"-listen", addr, "-admin-listen", admin, "-pprof", "-upstream", "mock", "-ttl", o.ttl.String(),
		"-mock-tokens", strconv.Itoa(tokensFor(o.events)), "-mock-delay", o.pace.String()}, ssegateFlags...)
	cmd := exec.Command(ssegateBin, append(args, extraArgs...)...)
	if len(extraEnv) > 0 {
		cmd.Env = append(os.Environ(), extraEnv...)
	}
	srv, err := e.launch(kindSsegate, addr, cmd)
	if err != nil {
		return err
	}
	defer srv.stop()
	logf("soak: ssegate pid %d on %s, -upstream mock; %d streams of %d events @ %s for %s (keyed %.0f%%, of them resumed %.0f%%); RLIMIT_NOFILE %d",
		cmd.Process.Pid, addr, o.streams, o.events, o.pace, o.duration, 100*o.keyed, 100*o.resume, noFile)

	r := &runner{nonce: time.Now().UnixNano()}
	warm := newClientConn(addr)
	res := warm.roundTrip(r.request(addr, reqSpec{tokens: 2}), time.Now().Add(10*time.Second), false, nil, nil)
	warm.close()
	if !res.ok(5) {
		return fmt.Errorf("warm-up stream failed: %s", res.problem(5))
	}
	var live atomic.Int64
	look := func(since time.Time) soakSample {
		s := soakSample{at: time.Since(since), live: live.Load(), gens: -1, goroutines: -1, heap: -1}
		s.rss, _, _ = memory(srv.pids)
		if m, err := scrape(admin, "go_goroutines", "ssegate_live_generations", "go_memstats_heap_inuse_bytes"); err == nil {
			s.goroutines, s.gens, s.heap = m["go_goroutines"], m["ssegate_live_generations"], m["go_memstats_heap_inuse_bytes"]
		}
		return s
	}
	time.Sleep(time.Second) // the warm-up's goroutines end
	collect(admin)
	idle := look(time.Now())
	logf("before the load: %s", idle)

	seed := o.seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	begin := time.Now()
	deadline := begin.Add(o.duration)
	tallies := make([]soakTally, o.streams)
	dials := make(chan struct{}, 256) // bounded parallel dials: 10,000 SYNs at once overflow the backlog
	var wg sync.WaitGroup
	for w := range o.streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			soakWorker(o, r, addr, w, seed, deadline, dials, &live, &tallies[w])
		}()
	}
	var samples []soakSample
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(o.sample)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				s := look(begin)
				samples = append(samples, s)
				logf("  %s", s)
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-sampled
	loadTime := time.Since(begin)
	end := look(begin)
	logf("load over after %s: %s", loadTime.Round(time.Second), end)

	peak := idle
	for _, s := range samples {
		peak.live = max(peak.live, s.live)
		peak.gens = max(peak.gens, s.gens)
		peak.goroutines = max(peak.goroutines, s.goroutines)
		peak.heap = max(peak.heap, s.heap)
		peak.rss = max(peak.rss, s.rss)
	}

	// After: the clients are gone; wait for what they left to end (idle
	// connections and workers expire within seconds, committed streams
	// after -soak-ttl and the store's next sweep), collecting garbage
	// before each look, until goroutines and heap are nearly back or
	// -soak-settle is over.
	after := end
	var settled []soakSample
	slack := max(int64(20), idle.goroutines/10)
	heapSlack := max(int64(16<<20), (peak.heap-idle.heap)/4)
	settleBegin := time.Now()
	for time.Since(settleBegin) < o.settle {
		time.Sleep(min(o.sample, o.settle))
		collect(admin)
		after = look(begin)
		settled = append(settled, after)
		if after.gens == 0 && after.goroutines >= 0 && after.goroutines <= idle.goroutines+5 &&
			after.heap >= 0 && after.heap <= idle.heap+max(int64(4<<20), (peak.heap-idle.heap)/10) {
			break
		}
	}
	logf("after the load: %s", after)

	var t soakTally
	for i := range tallies {
		t.add(&tallies[i])
	}
	// Drift under steady load: the second quarter's samples (past the
	// ramp) against the last quarter's. A leak grows with time; a load
	// that holds steady does not.
	q := len(samples) / 4
	var early, late soakSample
	if q > 0 {
		early, late = meanSample(samples[q:2*q]), meanSample(samples[len(samples)-q:])
	}

	var b strings.Builder
	fmt.Fprintf(&b, "## Soak: %d streams × %d events @ %s for %s\n\n", o.streams, o.events, o.pace, o.duration)
	fmt.Fprintf(&b, "ssegate -upstream mock (embedded mock) -ttl %s, one worker per stream, streams back to back; keyed %.0f%%, of the keyed resumed %.0f%%; seed %d; RLIMIT_NOFILE %d.\n\n", o.ttl, 100*o.keyed, 100*o.resume, seed, noFile)
	fmt.Fprintf(&b, "| | count |\n| --- | ---: |\n")
	fmt.Fprintf(&b, "| streams | %d |\n| whole | %d |\n| errors | %d (status %d, error event %d, transport %d) |\n", t.streams, t.whole, t.errs, t.statusErrors, t.errorEvents, t.transportErrors)
	fmt.Fprintf(&b, "| keyed | %d |\n| resumed (left, then Last-Event-ID) | %d, %d whole |\n", t.keyed, t.resumed, t.resumedOK)
	fmt.Fprintf(&b, "| events received | %d (%.0f/s) |\n| **lost events** | **%d** |\n| **events out of order** | **%d** |\n\n", t.events, float64(t.events)/loadTime.Seconds(), t.lost, t.reordered)
	fmt.Fprintf(&b, "| ssegate | goroutines | live generations | Go heap MiB | RSS MiB |\n| --- | ---: | ---: | ---: | ---: |\n")
	row := func(name string, s soakSample) {
		fmt.Fprintf(&b, "| %s | %d | %d | %.1f | %.1f |\n", name, s.goroutines, s.gens, mib(s.heap), mib(s.rss))
	}
	row("before the load (garbage collected)", idle)
	row("peak during the load", peak)
	if q > 0 {
		row("mean, 2nd quarter of the load", early)
		row("mean, last quarter of the load", late)
	}
	row("end of the load", end)
	row(fmt.Sprintf("after (+%s, garbage collected)", (after.at-end.at).Round(time.Second)), after)
	fmt.Fprintf(&b, "\nSamples during the load (every %s):\n\n```\n", o.sample)
	for _, s := range samples {
		fmt.Fprintln(&b, s)
	}
	fmt.Fprintf(&b, "```\n\nAfter the load:\n\n```\n")
	for _, s := range settled {
		fmt.Fprintln(&b, s)
	}
	fmt.Fprintf(&b, "```\n")
	for _, list := range []struct {
		name    string
		samples []string
	}{{"errors", t.errSamples}, {"lost", t.lostSamples}, {"out of order", t.reorderSamples}} {
		for _, s := range list.samples {
			fmt.Fprintf(&b, "- %s, e.g.: %s\n", list.name, s)
		}
	}
	var failures []string
	if t.lost > 0 || t.reordered > 0 {
		failures = append(failures, fmt.Sprintf("%d events lost, %d out of order; want 0", t.lost, t.reordered))
	}
	if t.errs > 0 {
		failures = append(failures, fmt.Sprintf("%d of %d streams failed", t.errs, t.streams))
	}
	if after.goroutines < 0 || after.goroutines > idle.goroutines+slack {
		failures = append(failures, fmt.Sprintf("goroutines %d after the load; %d before (allowed %d)", after.goroutines, idle.goroutines, idle.goroutines+slack))
	}
	if after.gens != 0 {
		failures = append(failures, fmt.Sprintf("ssegate_live_generations %d after the load; want 0", after.gens))
	}
	if after.heap < 0 || after.heap > idle.heap+heapSlack {
		failures = append(failures, fmt.Sprintf("Go heap in use %.1f MiB after the load (garbage collected); %.1f MiB before (allowed %.1f)", mib(after.heap), mib(idle.heap), mib(idle.heap+heapSlack)))
	}
	if grown := after.rss - idle.rss; peak.rss > idle.rss && grown > (peak.rss-idle.rss)/2 {
		notes = append(notes, fmt.Sprintf("RSS after the load is %.1f MiB over its start, more than half of the load's %.1f MiB peak growth; the Go heap in use is %.1f MiB over its start (the runtime returns freed pages to the system gradually, so RSS lags the heap)",
			mib(grown), mib(peak.rss-idle.rss), mib(after.heap-idle.heap)))
	}
	for _, n := range notes {
		fmt.Fprintf(&b, "\nNote: %s\n", n)
	}
	if len(failures) == 0 {
		fmt.Fprintf(&b, "\nResult: PASS\n")
	} else {
		fmt.Fprintf(&b, "\nResult: FAIL: %s\n", strings.Join(failures, "; "))
	}
	fmt.Fprint(stdout, b.String())
	if len(failures) > 0 {
		return errors.New("soak failed: " + strings.Join(failures, "; "))
	}
	return nil
}

// soakWorker runs one worker's streams until the deadline.
func soakWorker(o *soakOptions, r *runner, addr string, w int, seed uint64, deadline time.Time,
	dials chan struct{}, live *atomic.Int64, t *soakTally) {
	rng := rand.New(rand.NewPCG(seed, uint64(w)))
	c := newClientConn(addr)
	defer c.close()
	dials <- struct{}{}
	nc, err := net.DialTimeout("tcp", addr, 30*time.Second)
	<-dials
	if err != nil {
		t.streams++
		t.fail(&streamResult{err: fmt.Errorf("dial: %w", err)}, 0, "dial")
		return
	}
	c.attach(nc)
	// A stream's whole time, with room for a machine that cannot keep
	// the pace.
	limit := 2*time.Duration(o.events)*o.pace + 2*time.Minute
	spec := reqSpec{tokens: tokensFor(o.events), delay: o.pace}
	for i := 0; time.Now().Before(deadline); i++ {
		t.streams++
		keyed := rng.Float64() < o.keyed
		s := spec
		if keyed {
			s.key = fmt.Sprintf("soak-%d-%d-%d", r.nonce, w, i)
			t.keyed++
		}
		var res streamResult
		counted := false
		onFirst := func() { counted = true; live.Add(1) }
		resume := keyed && rng.Float64() < o.resume
		if resume {
			c.leaveAfter = 1 + rng.IntN(o.events-2)
		}
		res = c.roundTrip(r.request(addr, s), time.Now().Add(limit), keyed, onFirst, nil)
		c.leaveAfter = 0
		if errors.Is(res.err, errLeft) && res.done {
			res.err = nil // the whole stream came before the client could leave
		}
		t.events += int64(res.events)
		what := fmt.Sprintf("stream %d of worker %d", i, w)
		if resume && errors.Is(res.err, errLeft) && !res.done {
			if counted {
				live.Add(-1)
				counted = false
			}
			t.checkIDs(res.ids, 1, 0, what+" (before leaving)")
			t.resumed++
			last := res.ids[len(res.ids)-1]
			rs := reqSpec{lastID: last}
			if i%2 == 0 {
				rs.key, rs.tokens, rs.delay = s.key, s.tokens, s.delay
			} else {
				rs.method, rs.path = "GET", "/streams/"+s.key
			}
			first := len(res.ids) + 1
			res = c.roundTrip(r.request(addr, rs), time.Now().Add(limit), true, onFirst, nil)
			t.events += int64(res.events)
			what += fmt.Sprintf(" (resumed by %s after %s)", map[bool]string{true: "POST", false: "GET"}[i%2 == 0], last)
			if res.ok(o.events - first + 1) {
				t.resumedOK++
				t.whole++
				t.checkIDs(res.ids, first, o.events, what)
			} else {
				t.fail(&res, o.events-first+1, what)
			}
		} else if res.ok(o.events) {
			t.whole++
			if keyed {
				t.checkIDs(res.ids, 1, o.events, what)
			}
		} else {
			if !res.done || res.err != nil || res.status != 200 || res.errEvent {
				t.fail(&res, o.events, what)
			} else {
				// Whole as far as the stream could tell, but short.
				t.whole++
				t.lost += int64(max(0, o.events-res.events))
				t.note(&t.lostSamples, fmt.Sprintf("%s: %d events of %d", what, res.events, o.events))
			}
		}
		if counted {
			live.Add(-1)
		}
	}
}

// collect makes ssegate collect its garbage: a heap profile with gc=1
// runs a collection first.
func collect(admin string) {
	_, _ = fetchProfile(admin, "heap?gc=1", 30*time.Second)
}

// meanSample averages the gauges of samples.
func meanSample(samples []soakSample) soakSample {
	var m soakSample
	for _, s := range samples {
		m.live += s.live
		m.gens += s.gens
		m.goroutines += s.goroutines
		m.heap += s.heap
		m.rss += s.rss
	}
	n := int64(len(samples))
	m.live, m.gens, m.goroutines, m.heap, m.rss = m.live/n, m.gens/n, m.goroutines/n, m.heap/n, m.rss/n
	return m
}

// scrape reads the named series of ssegate's GET /metrics.
func scrape(addr string, names ...string) (map[string]int64, error) {
	c := http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		for _, n := range names {
			if v, ok := strings.CutPrefix(sc.Text(), n+" "); ok {
				f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err == nil {
					out[n] = int64(f)
				}
			}
		}
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return out, fmt.Errorf("/metrics has no %s (status %d)", n, resp.StatusCode)
		}
	}
	return out, sc.Err()
}
