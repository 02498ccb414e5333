package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// num is a float64 that encodes NaN (not measured) as JSON null.
type num float64

// MarshalJSON writes n, or null for NaN and infinities.
func (n num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, f, 'g', 6, 64), nil
}

// UnmarshalJSON reads a number, or null as NaN.
func (n *num) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*n = num(math.NaN())
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	*n = num(f)
	return err
}

// measurement is one round of one path in one step of a scenario: what the
// clients saw and what the peer process cost. Every one is kept in the JSON
// output; the tables show medians over rounds.
type measurement struct {
	Scenario string `json:"scenario"`
	Step     string `json:"step"`
	Round    int    `json:"round"`
	Path     string `json:"path"`
	Server   kind   `json:"server"`
	Conc     int    `json:"concurrency"`
	// Error says why the measurement could not run at all (the peer did
	// not start, the warm-up stream failed); the numbers are then empty.
	Error string `json:"error,omitempty"`

	WallSec       num   `json:"wall_s"`
	Streams       int64 `json:"streams"`
	OK            int64 `json:"streams_ok"`
	Errors        int64 `json:"errors"`
	Events        int64 `json:"events"`
	Bytes         int64 `json:"body_bytes"`
	Replayed      int64 `json:"replayed"`
	Groups        int64 `json:"groups,omitempty"`
	UpstreamCalls int64 `json:"upstream_calls"`

	EventsPerSec  num `json:"events_per_s"`
	StreamsPerSec num `json:"streams_per_s"`
	NominalPerSec num `json:"nominal_events_per_s,omitempty"`
	TTFEP50us     num `json:"ttfe_p50_us"`
	TTFEP99us     num `json:"ttfe_p99_us"`

	// Proxy process (and descendants), from /proc; null for direct.
	CPUSec        num   `json:"proxy_cpu_s"`
	CPUusPerEvent num   `json:"proxy_cpu_us_per_event"`
	IdleRSS       int64 `json:"idle_rss_bytes,omitempty"`
	PeakRSS       int64 `json:"peak_rss_bytes,omitempty"` // VmHWM at the end
	// At the sample with the most live streams (a stream is live from its
	// first event to its end): RSS, the count, and the events per live
	// stream received so far (the journal length, for the keyed path).
	LiveRSS          int64 `json:"live_rss_bytes,omitempty"`
	MaxLive          int64 `json:"max_live_streams"`
	RSSPerLive       num   `json:"rss_per_live_stream_bytes"`
	EventsPerLiveAtS num   `json:"events_per_stream_at_sample"`

	ErrorSamples []string `json:"error_samples,omitempty"`

	// Redis holds what scenario redis measures besides (bench/redis.go).
	Redis *redisNumbers `json:"redis,omitempty"`
	// Board holds what scenario board measures besides (bench/board.go).
	Board *boardNumbers `json:"board,omitempty"`

	// latency and ttft are the load's samples, sorted, when its job was
	// timed (scenario board pools them over rounds); not in the JSON,
	// whose report carries the pooled figures instead.
	latency, ttft []time.Duration
}

// nan is the value of a number not measured.
var nan = num(math.NaN())

// newMeasurement returns a measurement with every number unset.
func newMeasurement(scn, step string, round int, p path, conc int) measurement {
	return measurement{
		Scenario: scn, Step: step, Round: round, Path: p.name, Server: p.kind, Conc: conc,
		WallSec: nan, EventsPerSec: nan, StreamsPerSec: nan, NominalPerSec: nan,
		TTFEP50us: nan, TTFEP99us: nan, CPUSec: nan, CPUusPerEvent: nan,
		RSSPerLive: nan, EventsPerLiveAtS: nan,
	}
}

// prepareFunc readies a started server for a measurement (stores a stream
// to replay, say) and returns the load to run against it.
type prepareFunc func(srv *server) (*job, error)

// measure starts a fresh server for path p, checks it with a warm-up
// stream, runs the job prepare returns, and reads the server's CPU and
// memory around it.
func (r *runner) measure(scn, step string, round int, p path, conc int, prepare prepareFunc) measurement {
	m := newMeasurement(scn, step, round, p, conc)
	srv, err := r.env.start(p.kind)
	if err != nil {
		m.Error = err.Error()
		return m
	}
	defer srv.stop()

	warm := newClientConn(srv.addr)
	res := warm.roundTrip(r.requestTo(srv, reqSpec{tokens: 2}), time.Now().Add(10*time.Second), false, nil, nil)
	warm.close()
	if !res.ok(5) {
		m.Error = "warm-up stream failed: " + res.problem(5)
		return m
	}
	j, err := prepare(srv)
	if err != nil {
		m.Error = err.Error()
		return m
	}
	j.addr = srv.addr
	time.Sleep(100 * time.Millisecond) // let the warm-up's goroutines settle

	var cpu0 time.Duration
	if len(srv.pids) > 0 {
		if m.IdleRSS, _, err = memory(srv.pids); err != nil {
			m.Error = err.Error()
			return m
		}
		if cpu0, err = cpuTime(srv.pids); err != nil {
			m.Error = err.Error()
			return m
		}
	}
	var (
		mu                        sync.Mutex // guards the sample fields below
		maxLive, liveRSS, liveEvs int64
	)
	j.sample = func(live, events int64) {
		if live < maxLive || live == 0 {
			return
		}
		var rss int64
		if len(srv.pids) > 0 {
			rss, _, _ = memory(srv.pids)
		}
		mu.Lock()
		defer mu.Unlock()
		if live > maxLive || rss > liveRSS {
			maxLive, liveRSS, liveEvs = live, rss, events
		}
	}
	label := fmt.Sprintf("%s %s r%d %s", scn, step, round, p.name)
	j.progress = func(live, events int64) {
		r.logf("  %s: %d live streams, %d events so far", label, live, events)
	}
	calls0 := r.env.upstreamCalls()
	var cpuProfile <-chan profileResult
	if srv.admin != "" { // only with -profile
		cpuProfile = fetchCPUProfile(srv.admin, r.opt.duration)
	}
	lr := j.run()
	calls := r.env.upstreamCalls() - calls0
	if calls0 < 0 {
		calls = -1
	}

	m.fillLoad(lr)
	m.Replayed, m.Groups, m.UpstreamCalls = lr.replayed, lr.rounds, calls
	mu.Lock()
	m.MaxLive = maxLive
	if maxLive > 0 {
		m.EventsPerLiveAtS = num(float64(liveEvs) / float64(maxLive))
	}
	if len(srv.pids) > 0 {
		m.LiveRSS = liveRSS
		if maxLive > 0 {
			m.RSSPerLive = num(float64(liveRSS-m.IdleRSS) / float64(maxLive))
		}
	}
	mu.Unlock()
	if len(srv.pids) > 0 {
		cpu1, err := cpuTime(srv.pids)
		if err == nil {
			m.CPUSec = num((cpu1 - cpu0).Seconds())
			if lr.events > 0 {
				m.CPUusPerEvent = num(us(cpu1-cpu0) / float64(lr.events))
			}
		}
		if _, hwm, err := memory(srv.pids); err == nil {
			m.PeakRSS = hwm
		}
	}
	if cpuProfile != nil {
		r.writeProfiles(scn, step, round, p, srv.admin, cpuProfile)
	}
	r.logf("%-40s %s", label, m.summary())
	return m
}

// fillLoad records what the load generator counted and timed.
func (m *measurement) fillLoad(lr loadResult) {
	m.WallSec = num(lr.wall.Seconds())
	m.Streams, m.OK, m.Errors, m.Events, m.Bytes = lr.streams, lr.ok, lr.errors, lr.events, lr.bytes
	m.EventsPerSec = num(perSecond(lr.events, lr.wall))
	m.StreamsPerSec = num(perSecond(lr.ok, lr.wall))
	if len(lr.ttfe) > 0 {
		m.TTFEP50us = num(us(percentile(lr.ttfe, 50)))
		m.TTFEP99us = num(us(percentile(lr.ttfe, 99)))
	}
	m.ErrorSamples = lr.errSamples
	m.latency, m.ttft = lr.latency, lr.ttft
}

// summary is the one-line progress report of a measurement.
func (m *measurement) summary() string {
	if m.Error != "" {
		return "FAILED: " + m.Error
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%.0f ev/s, %d/%d streams ok", float64(m.EventsPerSec), m.OK, m.Streams)
	if !math.IsNaN(float64(m.TTFEP50us)) {
		fmt.Fprintf(&b, ", ttfe p50 %.0fµs", float64(m.TTFEP50us))
	}
	if len(m.latency) > 0 {
		fmt.Fprintf(&b, ", latency p50 %.0fµs", us(percentile(m.latency, 50)))
	}
	if !math.IsNaN(float64(m.CPUusPerEvent)) {
		fmt.Fprintf(&b, ", cpu %.2fµs/ev", float64(m.CPUusPerEvent))
	}
	if m.Scenario == "c" && !math.IsNaN(float64(m.RSSPerLive)) {
		fmt.Fprintf(&b, ", %.1f KiB/live stream (%d live)", float64(m.RSSPerLive)/1024, m.MaxLive)
	}
	if m.Errors > 0 {
		fmt.Fprintf(&b, ", %d ERRORS: %s", m.Errors, strings.Join(m.ErrorSamples, "; "))
	}
	return b.String()
}

// profileResult is a profile fetched from ssegate's /debug/pprof.
type profileResult struct {
	data []byte
	err  error
}

// fetchCPUProfile starts fetching a CPU profile of d (whole seconds, at
// least 1) from the profiler on admin, and returns where it arrives.
func fetchCPUProfile(admin string, d time.Duration) <-chan profileResult {
	secs := max(1, int(math.Ceil(d.Seconds())))
	ch := make(chan profileResult, 1)
	go func() {
		b, err := fetchProfile(admin, "profile?seconds="+strconv.Itoa(secs), time.Duration(secs)*time.Second+30*time.Second)
		ch <- profileResult{b, err}
	}()
	return ch
}

// fetchProfile GETs /debug/pprof/NAME from admin.
func fetchProfile(admin, name string, timeout time.Duration) ([]byte, error) {
	c := http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + admin + "/debug/pprof/" + name)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET /debug/pprof/%s: status %d: %.200s", name, resp.StatusCode, b)
	}
	if err == nil && len(b) == 0 {
		err = fmt.Errorf("GET /debug/pprof/%s: empty profile", name)
	}
	return b, err
}

// writeProfiles waits for the CPU profile of one measurement, fetches a
// heap profile after the load, and writes both into -profile as
// SCENARIO-STEP-rROUND-PATH.cpu.pprof and .heap.pprof. A profile that
// could not be had is noted on stderr; the measurement stands.
func (r *runner) writeProfiles(scn, step string, round int, p path, admin string, cpu <-chan profileResult) {
	base := filepath.Join(r.opt.profile, profileBase(scn, step, round, p.name))
	res := <-cpu
	heap, herr := fetchProfile(admin, "heap", 30*time.Second)
	for _, f := range []struct {
		ext  string
		data []byte
		err  error
	}{{".cpu.pprof", res.data, res.err}, {".heap.pprof", heap, herr}} {
		err := f.err
		if err == nil {
			err = os.WriteFile(base+f.ext, f.data, 0o644)
		}
		if err != nil {
			r.logf("  profile %s%s: %v", base, f.ext, err)
		}
	}
}

// profileBase is the file name of a measurement's profiles, less the
// extension.
func profileBase(scn, step string, round int, path string) string {
	parts := []string{scn}
	if step != "" {
		parts = append(parts, step)
	}
	parts = append(parts, "r"+strconv.Itoa(round), path)
	return profileName(strings.Join(parts, "-"))
}

// profileName makes s a file name: each run of characters other than
// letters, digits, '.', '-' and '_' becomes one '_' (ssegate+key,
// ssegate@baseline, steps like "64 streams × 200 events").
func profileName(s string) string {
	return notInFileName.ReplaceAllString(s, "_")
}

// notInFileName matches a run of the characters profileName replaces.
var notInFileName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)
