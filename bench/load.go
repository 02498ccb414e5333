package main

import (
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// mode is how the load generator paces its streams.
type mode int

const (
	// modeLoop: each of conc workers runs streams back to back until the
	// duration is over (a closed loop).
	modeLoop mode = iota
	// modeOnce: conc streams, all opened at once, each run once; the
	// measurement ends when the last one does.
	modeOnce
	// modeLockstep: rounds of conc streams started together; the next round
	// starts when all of the last one ended, until the duration is over.
	// A round is one "group" (fan-out: conc clients of one key).
	modeLockstep
)

// job is one measurement's load.
type job struct {
	addr     string
	conc     int
	mode     mode
	duration time.Duration // modeLoop, modeLockstep: start no stream after this
	// build returns the request of worker w's i-th stream (in lockstep, of
	// round i) and the number of events a whole answer has.
	build         func(w, i int) (req []byte, expect int)
	streamTimeout time.Duration
	maxStreams    int64 // a bound on the count of streams, besides the time
	sample        func(live int64, events int64)
	sampleEvery   time.Duration
	progress      func(live, events int64)
	// timed keeps every whole answer's latency (request written to
	// response ended) and time to its first content event: the samples
	// of scenario board.
	timed bool
}

// loadResult is what a job measured on the client side.
type loadResult struct {
	wall       time.Duration
	streams    int64 // started
	ok         int64 // arrived whole
	errors     int64 // did not
	events     int64 // received, whole streams or not
	replayed   int64
	bytes      int64
	rounds     int64 // lockstep rounds (groups)
	ttfe       []time.Duration
	errSamples []string
	// With job.timed, sorted: the latency of every whole answer, and the
	// time to the first content event of every whole stream.
	latency, ttft []time.Duration
}

// workerStats is one worker's share of a loadResult, merged at the end so
// that the hot loop shares nothing but two atomic counters.
type workerStats struct {
	streams, ok, errors, replayed, bytes int64
	ttfe                                 []time.Duration
	errSamples                           []string
	timed                                bool // keep latency and ttft
	latency, ttft                        []time.Duration
}

func (s *workerStats) record(res *streamResult, expect int) {
	s.streams++
	s.bytes += res.bytes
	if res.replayed {
		s.replayed++
	}
	if res.ok(expect) {
		s.ok++
		if s.timed {
			s.latency = append(s.latency, res.total)
			if res.ttft > 0 {
				s.ttft = append(s.ttft, res.ttft)
			}
		}
	} else {
		s.errors++
		if len(s.errSamples) < 3 {
			s.errSamples = addDistinct(s.errSamples, res.problem(expect))
		}
	}
	if res.events > 0 {
		s.ttfe = append(s.ttfe, res.ttfe)
	}
}

// addDistinct appends e to samples unless it is there already.
func addDistinct(samples []string, e string) []string {
	for _, s := range samples {
		if s == e {
			return samples
		}
	}
	return append(samples, e)
}

// run executes the job and returns what the clients saw.
func (j *job) run() loadResult {
	var (
		live, events atomic.Int64
		started      atomic.Int64
		stats        = make([]workerStats, j.conc)
		conns        = make([]*clientConn, j.conc)
		stopSampler  = make(chan struct{})
		samplerDone  = make(chan struct{})
	)
	for w := range conns {
		conns[w] = newClientConn(j.addr)
		conns[w].firstContent = j.timed
		stats[w].timed = j.timed
	}
	if j.streamTimeout <= 0 {
		j.streamTimeout = 2 * time.Minute
	}
	every := j.sampleEvery
	if every <= 0 {
		every = 100 * time.Millisecond
	}
	go func() {
		defer close(samplerDone)
		t := time.NewTicker(every)
		defer t.Stop()
		lastProgress := time.Now()
		for {
			select {
			case <-stopSampler:
				return
			case <-t.C:
				if j.sample != nil {
					j.sample(live.Load(), events.Load())
				}
				if j.progress != nil && time.Since(lastProgress) >= 5*time.Second {
					lastProgress = time.Now()
					j.progress(live.Load(), events.Load())
				}
			}
		}
	}()

	one := func(w, i int) {
		req, expect := j.build(w, i)
		first := false
		onFirst := func() { first = true; live.Add(1) }
		res := conns[w].roundTrip(req, time.Now().Add(j.streamTimeout), false, onFirst, &events)
		if first {
			live.Add(-1)
		}
		stats[w].record(&res, expect)
	}
	begin := time.Now()
	deadline := begin.Add(j.duration)
	var rounds int64
	var wg sync.WaitGroup
	switch j.mode {
	case modeLoop:
		for w := 0; w < j.conc; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Now().Before(deadline); i++ {
					if j.maxStreams > 0 && started.Add(1) > j.maxStreams {
						return
					}
					one(w, i)
				}
			}()
		}
		wg.Wait()
	case modeOnce:
		// Dial with bounded parallelism, so that 10,000 SYNs do not
		// overflow the listen backlog and wait out a retransmit.
		dials := make(chan struct{}, 256)
		for w := 0; w < j.conc; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				dials <- struct{}{}
				nc, err := net.DialTimeout("tcp", j.addr, 30*time.Second)
				<-dials
				if err != nil {
					stats[w].record(&streamResult{err: fmt.Errorf("dial: %w", err)}, 0)
					return
				}
				conns[w].attach(nc)
				one(w, 0)
				conns[w].close()
			}()
		}
		wg.Wait()
	case modeLockstep:
		for i := 0; time.Now().Before(deadline); i++ {
			rounds++
			for w := 0; w < j.conc; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					one(w, i)
				}()
			}
			wg.Wait()
		}
	}
	wall := time.Since(begin)
	close(stopSampler)
	<-samplerDone
	for _, c := range conns {
		c.close()
	}

	r := loadResult{wall: wall, events: events.Load(), rounds: rounds}
	for i := range stats {
		s := &stats[i]
		r.streams += s.streams
		r.ok += s.ok
		r.errors += s.errors
		r.replayed += s.replayed
		r.bytes += s.bytes
		r.ttfe = append(r.ttfe, s.ttfe...)
		r.latency = append(r.latency, s.latency...)
		r.ttft = append(r.ttft, s.ttft...)
		for _, e := range s.errSamples {
			if len(r.errSamples) < 5 {
				r.errSamples = addDistinct(r.errSamples, e)
			}
		}
	}
	for _, xs := range [][]time.Duration{r.ttfe, r.latency, r.ttft} {
		slices.Sort(xs)
	}
	return r
}
