// Command firstevent reads a Go execution trace of ssegate serving
// streamed requests and shows where each request's time to its first
// event went, phase by phase, as medians and 90th percentiles over the
// requests the trace holds.
//
// It is a module of its own, so that ssegate's go.mod does not carry the
// trace parser. To take a trace, run ssegate with its profiler on the admin
// listener, send it requests one at a time, and fetch a second of trace
// while they run:
//
//	ssegate -listen 127.0.0.1:8080 -admin-listen 127.0.0.1:9090 -pprof -upstream mock &
//	while :; do curl -s -N -H 'Idempotency-Key: k'$RANDOM$RANDOM -H 'Authorization: Bearer sk-test' -H 'X-Mock-Tokens: 20' -H 'X-Mock-Delay: 0s' \
//	  -d '{"model":"gpt-4o-mini","stream":true,"messages":[]}' http://127.0.0.1:8080/v1/chat/completions >/dev/null; done &
//	curl -s -o trace.out 'http://127.0.0.1:9090/debug/pprof/trace?seconds=1'
//	go -C bench/firstevent run . ../../trace.out
//
// A request is followed through the goroutine its miss or relay starts
// for the generation (gen.run): from the moment the request's goroutine
// was woken to read it, through the decision, the generation's start, the
// upstream call and its answer, to the first write to the client. With
// the mock embedded (-upstream mock) the upstream's phase includes the
// mock's own scheduling; a separate upstream process gives cleaner figures.
package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

// request is what the trace tells of one generation goroutine, as times
// since the trace began.
type request struct {
	woken   time.Duration // the request's goroutine was woken (its read could go on)
	running time.Duration // it last began running before it started the generation
	created time.Duration // the generation's goroutine was created
	started time.Duration // it first ran
	blocked time.Duration // it first blocked (waiting for the upstream's answer)
	wakes   time.Duration // it was woken by the answer
	runs    time.Duration // it ran again
	written time.Duration // its first write to the client (writev)
	phase   int
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: firstevent TRACE")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fail(err)
	}
	defer f.Close()
	reqs, err := read(f)
	if err != nil {
		fail(err)
	}
	report(os.Stdout, reqs)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "firstevent:", err)
	os.Exit(1)
}

// read follows every generation goroutine in the trace.
func read(r io.Reader) ([]*request, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return nil, err
	}
	var t0 trace.Time
	gens := map[trace.GoID]*request{}
	woken := map[trace.GoID]time.Duration{}
	running := map[trace.GoID]time.Duration{}
	for {
		ev, err := tr.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if t0 == 0 {
			t0 = ev.Time()
		}
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		at := time.Duration(ev.Time() - t0)
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		id := st.Resource.Goroutine()
		from, to := st.Goroutine()
		if from == trace.GoNotExist && to == trace.GoRunnable {
			if onStack(ev.Stack(), "(*gen).launch") {
				p := ev.Goroutine()
				gens[id] = &request{woken: woken[p], running: running[p], created: at}
			}
			continue
		}
		if from == trace.GoWaiting && to == trace.GoRunnable {
			woken[id] = at
		}
		if to == trace.GoRunning {
			running[id] = at
		}
		g := gens[id]
		if g == nil {
			continue
		}
		switch {
		case g.phase == 0 && to == trace.GoRunning:
			g.started, g.phase = at, 1
		case g.phase == 1 && to == trace.GoWaiting:
			g.blocked, g.phase = at, 2
		case g.phase == 2 && to == trace.GoRunnable:
			g.wakes, g.phase = at, 3
		case g.phase == 3 && to == trace.GoRunning:
			g.runs, g.phase = at, 4
		case g.phase == 4 && to == trace.GoSyscall && onStack(st.Stack, "(*client).writeFD"):
			g.written, g.phase = at, 5
		}
	}
	var done []*request
	for _, g := range gens {
		if g.phase == 5 && g.woken != 0 {
			done = append(done, g)
		}
	}
	return done, nil
}

// onStack reports whether a frame of s is in a function whose name ends
// in fn: "(*gen).launch" where a miss or a relay starts its generation,
// "(*client).writeFD" for a write to the client.
func onStack(s trace.Stack, fn string) bool {
	for fr := range s.Frames() {
		if strings.HasSuffix(fr.Func, fn) {
			return true
		}
	}
	return false
}

// report writes the phases' medians and 90th percentiles.
func report(w io.Writer, reqs []*request) {
	fmt.Fprintf(w, "%d requests followed to their first write\n\n", len(reqs))
	if len(reqs) == 0 {
		return
	}
	phases := []struct {
		name string
		d    func(*request) time.Duration
	}{
		{"request read: woken → running", func(r *request) time.Duration { return r.running - r.woken }},
		{"decision: running → generation created", func(r *request) time.Duration { return r.created - r.running }},
		{"generation created → running", func(r *request) time.Duration { return r.started - r.created }},
		{"upstream call built and sent → waiting", func(r *request) time.Duration { return r.blocked - r.started }},
		{"upstream answers: waiting → woken", func(r *request) time.Duration { return r.wakes - r.blocked }},
		{"woken → running", func(r *request) time.Duration { return r.runs - r.wakes }},
		{"head, first event, journal → first write", func(r *request) time.Duration { return r.written - r.runs }},
		{"total: request woken → first write", func(r *request) time.Duration { return r.written - r.woken }},
	}
	fmt.Fprintf(w, "| phase | p50 | p90 |\n|---|---:|---:|\n")
	for _, p := range phases {
		ds := make([]time.Duration, len(reqs))
		for i, r := range reqs {
			ds[i] = p.d(r)
		}
		slices.Sort(ds)
		fmt.Fprintf(w, "| %s | %v | %v |\n", p.name, ds[len(ds)/2].Round(100*time.Nanosecond), ds[len(ds)*9/10].Round(100*time.Nanosecond))
	}
}
