package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Scenario redis: ssegate's Redis store (-redis) beside its in-memory
// store, on a private redis-server started for the scenario (--save '',
// --appendonly no, on a free loopback port; stopped by pid at the end).
//
//   - CPU and round trips: the -redis-load step (as a step of scenario c:
//     N keyed streams opened at once, paced by the upstream) through one
//     ssegate with the in-memory store and one with the Redis store, in
//     turn every round. The Redis store's CPU is ssegate's plus the
//     redis-server's (INFO cpu: user and system time), shown apart and
//     summed, and beside it redis-server's idle CPU (redisIdleRate) over
//     the step's wall time; Redis round trips per event are the commands clients sent
//     (redis-server's INFO commandstats: every script call, XREAD, BLPOP,
//     LPOP, RPUSH) per event the upstream produced.
//   - Joiner latency: the -redis-join step: N streams, each started by a
//     client on replica A with a key; once it has its first event, a second
//     client sends the same request (a joiner) on B, another replica on the
//     same Redis, and a third on A itself (in-memory fan-out). For every
//     event, the joiner's arrival time minus the first client's (all
//     clients in the bench process, one clock): p50/p99 over the events
//     that arrived live, and the joiner's wait from its request to its
//     first event (on B: the claim, the ask to A, A's first mirrored
//     batch). A single ssegate with the in-memory store and a joiner on it
//     is the baseline of the same rounds.

// kindRedis is the redis-server of scenario redis.
const kindRedis kind = "redis"

// redisNumbers are what scenario redis measures beyond a measurement's
// usual fields; NaN (null) where a number does not apply to the row.
type redisNumbers struct {
	// Store is "memory" or "redis".
	Store string `json:"store"`
	// CPU of the step's processes per event delivered: ssegate (every
	// replica), redis-server, and their sum.
	SsegateCPUusPerEvent num `json:"ssegate_cpu_us_per_event"`
	RedisCPUSec          num `json:"redis_cpu_s"`
	RedisCPUusPerEvent   num `json:"redis_cpu_us_per_event"`
	// RedisIdleUsPerEvent is what redis-server spent idle (redisIdleRate)
	// over the step's wall time, per event delivered: the part of
	// RedisCPUusPerEvent that does not grow with the streams.
	RedisIdleUsPerEvent num `json:"redis_idle_cpu_us_per_event"`
	SumCPUusPerEvent    num `json:"cpu_sum_us_per_event"`
	// SumToMemory is the sum over the in-memory store's CPU per event in
	// the same round.
	SumToMemory num `json:"cpu_sum_ratio_to_memory"`

	// The replica's /metrics deltas over the load (the row's replica: the
	// owner, or the joiners' replica B), and events the owner appended to
	// Redis (only journals a follower asked for are).
	Claims         int64 `json:"redis_claims"`
	Batches        int64 `json:"redis_append_batches"`
	Commits        int64 `json:"redis_commits"`
	Reads          int64 `json:"redis_reads"`
	Tails          int64 `json:"redis_tails"`
	EventsAppended int64 `json:"redis_events_appended"`
	// Commands is what every client sent redis-server over the step (INFO
	// commandstats: script calls, XREAD, BLPOP, LPOP, RPUSH); per event
	// the upstream produced, RoundTripsPerEvent. BatchesPerEvent is the
	// row's replica's append batches per event produced;
	// RedisCPUusPerProduced, redis-server's CPU per event produced.
	Commands              int64 `json:"redis_commands"`
	Produced              int64 `json:"events_produced"`
	RoundTripsPerEvent    num   `json:"redis_round_trips_per_event"`
	BatchesPerEvent       num   `json:"redis_append_batches_per_event"`
	RedisCPUusPerProduced num   `json:"redis_cpu_us_per_event_produced"`

	// Joiner rows: the joiner's arrival time of each live event minus the
	// first client's, over Samples events.
	Samples    int64 `json:"latency_samples,omitempty"`
	AddedP50us num   `json:"added_p50_us"`
	AddedP99us num   `json:"added_p99_us"`
	AddedMaxus num   `json:"added_max_us"`
	// Joiner rows: the joiner's wait from its request to its first event.
	JoinWaitP50us num `json:"join_wait_p50_us"`
	JoinWaitP99us num `json:"join_wait_p99_us"`
}

func newRedisNumbers(store string) *redisNumbers {
	return &redisNumbers{Store: store,
		SsegateCPUusPerEvent: nan, RedisCPUSec: nan, RedisCPUusPerEvent: nan, RedisIdleUsPerEvent: nan, SumCPUusPerEvent: nan, SumToMemory: nan,
		RoundTripsPerEvent: nan, BatchesPerEvent: nan, RedisCPUusPerProduced: nan, AddedP50us: nan, AddedP99us: nan, AddedMaxus: nan,
		JoinWaitP50us: nan, JoinWaitP99us: nan}
}

// The paths of scenario redis.
var (
	pathMemCPU     = path{name: "ssegate+key, in-memory store", kind: kindSsegate, keyed: true}
	pathRedisCPU   = path{name: "ssegate+key, Redis store", kind: kindSsegate, keyed: true}
	pathJoinMem    = path{name: "joiner, same replica, in-memory store", kind: kindSsegate, keyed: true}
	pathJoinOwner  = path{name: "joiner on A (owner replica), Redis store", kind: kindSsegate, keyed: true}
	pathJoinRemote = path{name: "joiner on B (other replica), Redis store", kind: kindSsegate, keyed: true}
)

// redisTable is how scenario redis is shown.
var redisTable = table{"redis", "(redis) Redis store",
	"ssegate with `-redis` on a private redis-server (`--save '' --appendonly no`, loopback, same machine) beside the in-memory store, in turn every round. " +
		"CPU step: keyed streams opened at once and paced by the upstream (as in c), one replica; ssegate CPU and redis-server CPU (INFO cpu) per event delivered, shown apart and summed; \"of it idle\" is redis-server's CPU per second with the replica connected and nothing to do (3 s watched before the step) times the step's wall time, per event: the part that does not grow with the streams; \"sum to in-memory\" is the median of the per-round ratios to the in-memory store's CPU. " +
		"Redis round trips per event = the commands all clients sent redis-server over the step (INFO commandstats: every script call (claims, key counts, appends, lease renewals, commits, reaps and asks), XREAD, BLPOP, LPOP, RPUSH) per event the upstream produced; Redis CPU per produced event likewise; append batches per event are the row's replica's. " +
		"Joiner step: each stream is started by a client on replica A; after its first event a joiner sends the same request on B (another replica on the same Redis: one cross-replica follower per stream) and one on A itself; added latency = the joiner's arrival time of each event minus the first client's (one clock, the bench process), over the events that arrived live; join wait = from the joiner's request to its first event (on B: its claim, its ask to A and A's first mirrored batch); the baseline is a joiner on a single replica with the in-memory store. On joiner rows the CPU columns are the whole setup's (every replica, and redis-server) per event delivered to any client; the round trips and Redis CPU per produced event are the whole setup's too.",
	cpuEv, []column{colPath,
		{"events/s (nominal)", "---:", func(a *agg) string {
			return fmtNum(a.med(evps), 0) + " (" + fmtNum(a.med(func(m *measurement) float64 { return float64(m.NominalPerSec) }), 0) + ")"
		}},
		{"ssegate CPU µs/event", "---:", func(a *agg) string {
			return fmtNum(a.med(rnum(func(x *redisNumbers) num { return x.SsegateCPUusPerEvent })), 2)
		}},
		{"Redis CPU µs/event", "---:", func(a *agg) string {
			return fmtNum(a.med(rnum(func(x *redisNumbers) num { return x.RedisCPUusPerEvent })), 2)
		}},
		{"of it idle", "---:", func(a *agg) string {
			return fmtNum(a.med(rnum(func(x *redisNumbers) num { return x.RedisIdleUsPerEvent })), 2)
		}},
		{"sum µs/event", "---:", func(a *agg) string {
			return fmtNum(a.med(rnum(func(x *redisNumbers) num { return x.SumCPUusPerEvent })), 2)
		}},
		{"sum to in-memory", "---:", func(a *agg) string { return fmtRatio(a.med(rnum(func(x *redisNumbers) num { return x.SumToMemory }))) }},
		{"Redis CPU µs / produced event", "---:", func(a *agg) string {
			return fmtNum(a.med(rnum(func(x *redisNumbers) num { return x.RedisCPUusPerProduced })), 2)
		}},
		{"Redis round trips / event", "---:", func(a *agg) string {
			return fmtNum(a.med(rnum(func(x *redisNumbers) num { return x.RoundTripsPerEvent })), 3)
		}},
		{"append batches / event", "---:", func(a *agg) string {
			return fmtNum(a.med(rnum(func(x *redisNumbers) num { return x.BatchesPerEvent })), 3)
		}},
		{"added p50 µs", "---:", func(a *agg) string { return fmtSigned(a.med(rnum(func(x *redisNumbers) num { return x.AddedP50us }))) }},
		{"added p99 µs", "---:", func(a *agg) string { return fmtSigned(a.med(rnum(func(x *redisNumbers) num { return x.AddedP99us }))) }},
		{"join wait p50 / p99 ms", "---:", func(a *agg) string {
			p50, p99 := a.med(rnum(func(x *redisNumbers) num { return x.JoinWaitP50us })), a.med(rnum(func(x *redisNumbers) num { return x.JoinWaitP99us }))
			if math.IsNaN(p50) {
				return "—"
			}
			return fmtNum(p50/1000, 1) + " / " + fmtNum(p99/1000, 1)
		}},
		{"samples", "---:", func(a *agg) string {
			n := a.sum(func(m *measurement) int64 {
				if m.Redis == nil {
					return 0
				}
				return m.Redis.Samples
			})
			if n == 0 {
				return "—"
			}
			return strconv.FormatInt(n, 10)
		}},
		colErrors}}

// rnum turns a field of redisNumbers into a metric for agg.med.
func rnum(f func(x *redisNumbers) num) func(m *measurement) float64 {
	return func(m *measurement) float64 {
		if m.Redis == nil {
			return math.NaN()
		}
		return float64(f(m.Redis))
	}
}

// redisScenario runs scenario redis.
func (r *runner) redisScenario() {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		r.notes = append(r.notes, "redis-server is not on PATH: scenario redis was skipped (install it, e.g. apt-get install redis-server, to include it)")
		r.logf("  redis-server is not on PATH: skipped")
		return
	}
	rs, err := r.env.startRedis(bin)
	if err != nil {
		r.notes = append(r.notes, "scenario redis: "+err.Error())
		r.logf("  %v", err)
		return
	}
	defer rs.stop()
	if v := redisVersion(bin); v != "" {
		r.notes = append(r.notes, "scenario redis: redis-server "+v+", --save '' --appendonly no")
	}
	url := "redis://" + rs.addr + "/0"

	ld := r.opt.redisLoad
	step := fmt.Sprintf("CPU: %d streams × %d events @ %s, one replica", ld.streams, ld.events, ld.pace)
	for round := 1; round <= r.opt.rounds; round++ {
		mem := r.redisCPU(nil, "", ld, step, round, pathMemCPU)
		red := r.redisCPU(rs, url, ld, step, round, pathRedisCPU)
		if mem.Redis != nil && red.Redis != nil {
			mem.Redis.SumToMemory = 1
			red.Redis.SumToMemory = num(ratio(float64(red.Redis.SumCPUusPerEvent), float64(mem.Redis.SumCPUusPerEvent)))
		}
		r.ms = append(r.ms, mem, red)
	}

	jn := r.opt.redisJoin
	step = fmt.Sprintf("joiners: %d streams × %d events @ %s", jn.streams, jn.events, jn.pace)
	for round := 1; round <= r.opt.rounds; round++ {
		r.ms = append(r.ms, r.redisJoiners(nil, "", jn, step, round)...)
		r.ms = append(r.ms, r.redisJoiners(rs, url, jn, step, round)...)
	}
}

// redisVersion returns the version redis-server reports, or "".
func redisVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return ""
	}
	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			return v
		}
	}
	return ""
}

// startRedis starts a private redis-server (or valkey-server) on a free
// loopback port, with no persistence and the extra flags given, and waits
// until it answers PING.
func (e *env) startRedis(bin string, extra ...string) (*server, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	dir := filepath.Join(e.tmp, "redis-"+port)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--daemonize", "no", "--loglevel", "warning"}
	cmd := exec.Command(bin, append(args, extra...)...)
	s, err := e.launch(kindRedis, addr, cmd)
	if err != nil {
		return nil, err
	}
	s.dir = dir
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err = redisCommand(s.addr, "PING"); err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("redis-server on %s does not answer PING: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisCommand sends one command without arguments (PING, FLUSHALL) and
// expects a simple-string answer.
func redisCommand(addr, name string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "*1\r\n$%d\r\n%s\r\n", len(name), name); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+") {
		return fmt.Errorf("%s: %s", name, strings.TrimSpace(line))
	}
	return nil
}

// clientCommands are the commands only clients send (never a script):
// what ssegate's round trips to Redis are counted by.
var clientCommands = []string{"evalsha", "eval", "xread", "blpop", "lpop", "rpush"}

// redisInfo returns the lines of one INFO section of redis-server.
func redisInfo(addr, section string) ([]string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "*2\r\n$4\r\nINFO\r\n$%d\r\n%s\r\n", len(section), section); err != nil {
		return nil, err
	}
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
	if err != nil || !strings.HasPrefix(line, "$") {
		return nil, fmt.Errorf("INFO %s: %q", section, line)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(br, b); err != nil {
		return nil, err
	}
	return strings.Split(string(b), "\n"), nil
}

// redisCommands returns the calls of clientCommands redis-server counted
// (INFO commandstats), summed.
func redisCommands(addr string) (int64, error) {
	lines, err := redisInfo(addr, "commandstats")
	if err != nil {
		return 0, err
	}
	var total int64
	for _, l := range lines {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		cmd, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd || !slices.Contains(clientCommands, cmd) {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO commandstats: %q", l)
		}
		total += v
	}
	return total, nil
}

// redisServerCPU returns the CPU time redis-server reports for its main
// process (INFO cpu: used_cpu_user + used_cpu_sys, µs precision, where
// /proc's ticks are 10 ms).
func redisServerCPU(addr string) (time.Duration, error) {
	lines, err := redisInfo(addr, "cpu")
	if err != nil {
		return 0, err
	}
	var sec float64
	found := 0
	for _, l := range lines {
		name, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || (name != "used_cpu_user" && name != "used_cpu_sys") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %q", l)
		}
		sec += f
		found++
	}
	if found != 2 {
		return 0, errors.New("INFO cpu: no used_cpu_user and used_cpu_sys")
	}
	return time.Duration(sec * float64(time.Second)), nil
}

// redisIdleWindow is how long scenario redis watches redis-server with its
// replicas connected and nothing to do, before each CPU step: what
// redis-server spends whatever the load (its cron, the replicas' pings and
// blocking reads), shown beside the step's figure.
const redisIdleWindow = 3 * time.Second

// redisIdleRate returns redis-server's CPU per second over
// redisIdleWindow.
func redisIdleRate(addr string) (time.Duration, error) {
	c0, err := redisServerCPU(addr)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	time.Sleep(redisIdleWindow)
	c1, err := redisServerCPU(addr)
	if err != nil {
		return 0, err
	}
	return time.Duration(float64(c1-c0) / time.Since(t0).Seconds()), nil
}

// startSsegate starts ssegate as env.start does, with extra flags.
func (e *env) startSsegate(extra ...string) (*server, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return e.launch(kindSsegate, addr, e.ssegateCmd(e.ssegateBin, addr, extra...))
}

// startReplicas flushes Redis (when rs is set) and starts n ssegate
// replicas on it (on the in-memory store without rs), each checked with an
// unkeyed warm-up stream.
func (r *runner) startReplicas(rs *server, url string, n int) ([]*server, error) {
	var extra []string
	if rs != nil {
		if err := redisCommand(rs.addr, "FLUSHALL"); err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		extra = []string{"-redis", url}
	}
	var srvs []*server
	for i := 0; i < n; i++ {
		srv, err := r.env.startSsegate(extra...)
		if err != nil {
			stopAll(srvs)
			return nil, err
		}
		srvs = append(srvs, srv)
		warm := newClientConn(srv.addr)
		res := warm.roundTrip(r.request(srv.addr, reqSpec{tokens: 2}), time.Now().Add(10*time.Second), false, nil, nil)
		warm.close()
		if !res.ok(5) {
			stopAll(srvs)
			return nil, fmt.Errorf("warm-up stream failed: %s", res.problem(5))
		}
	}
	time.Sleep(100 * time.Millisecond) // let the warm-ups' goroutines settle
	return srvs, nil
}

func stopAll(srvs []*server) {
	for _, s := range srvs {
		s.stop()
	}
}

// redisCounters are the ssegate_redis_* counters of one replica's /metrics.
type redisCounters map[string]int64

// scrapeRedis reads the ssegate_redis_* counters of the replica at addr.
func scrapeRedis(addr string) (redisCounters, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET /metrics: status %d", resp.StatusCode)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := redisCounters{}
	for _, line := range strings.Split(string(b), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(name, "ssegate_redis_") {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		out[strings.TrimSuffix(strings.TrimPrefix(name, "ssegate_redis_"), "_total")] = int64(f)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("/metrics on %s has no ssegate_redis_* counters", addr)
	}
	return out, nil
}

// fill sets x's counters to after − before of the replica, and the
// commands Redis took and its CPU over the step per event produced.
func (x *redisNumbers) fill(before, after redisCounters, commands int64, rcpu time.Duration, produced int64) {
	d := func(k string) int64 { return after[k] - before[k] }
	x.Claims, x.Batches, x.Commits, x.Reads, x.Tails = d("claims"), d("append_batches"), d("commits"), d("reads"), d("tails")
	x.EventsAppended = d("events_appended")
	x.Commands, x.Produced = commands, produced
	if produced > 0 {
		x.RoundTripsPerEvent = num(float64(commands) / float64(produced))
		x.BatchesPerEvent = num(float64(x.Batches) / float64(produced))
		x.RedisCPUusPerProduced = num(us(rcpu) / float64(produced))
	}
}

// cpuOf returns the CPU time of the servers' processes, summed.
func cpuOf(srvs ...*server) (time.Duration, error) {
	var t time.Duration
	for _, s := range srvs {
		c, err := cpuTime(s.pids)
		if err != nil {
			return 0, err
		}
		t += c
	}
	return t, nil
}

// redisCPU measures one round of the CPU step on path p: one replica, on
// Redis when rs is set.
func (r *runner) redisCPU(rs *server, url string, st slowStep, step string, round int, p path) measurement {
	m := newMeasurement("redis", step, round, p, st.streams)
	if st.pace > 0 {
		m.NominalPerSec = num(float64(st.streams) / st.pace.Seconds())
	}
	store := "memory"
	if rs != nil {
		store = "redis"
	}
	x := newRedisNumbers(store)
	m.Redis = x
	srvs, err := r.startReplicas(rs, url, 1)
	if err != nil {
		m.Error = err.Error()
		return m
	}
	defer stopAll(srvs)
	srv := srvs[0]
	j, err := r.streamJob(p, st.streams, modeOnce, st.events, st.pace, fmt.Sprintf("redis-%s-%d", store, round))(srv)
	if err != nil {
		m.Error = err.Error()
		return m
	}
	j.addr = srv.addr
	j.streamTimeout = 10 * time.Minute
	label := fmt.Sprintf("redis %s r%d %s", step, round, p.name)
	j.progress = func(live, events int64) {
		r.logf("  %s: %d live streams, %d events so far", label, live, events)
	}

	var m0 redisCounters
	var rcpu0, idle time.Duration
	var cmds0 int64
	if rs != nil {
		if idle, err = redisIdleRate(rs.addr); err != nil {
			m.Error = err.Error()
			return m
		}
		if m0, err = scrapeRedis(srv.addr); err != nil {
			m.Error = err.Error()
			return m
		}
		if cmds0, err = redisCommands(rs.addr); err != nil {
			m.Error = err.Error()
			return m
		}
		if rcpu0, err = redisServerCPU(rs.addr); err != nil {
			m.Error = err.Error()
			return m
		}
	}
	cpu0, err := cpuOf(srv)
	if err != nil {
		m.Error = err.Error()
		return m
	}
	m.IdleRSS, _, _ = memory(srv.pids)

	lr := j.run()

	cpu1, err := cpuOf(srv)
	if err != nil {
		m.Error = err.Error()
		return m
	}
	var rcpu1 time.Duration
	if rs != nil {
		if rcpu1, err = redisServerCPU(rs.addr); err != nil {
			m.Error = err.Error()
			return m
		}
		m1, err := scrapeRedis(srv.addr)
		if err != nil {
			m.Error = err.Error()
			return m
		}
		cmds1, err := redisCommands(rs.addr)
		if err != nil {
			m.Error = err.Error()
			return m
		}
		x.fill(m0, m1, cmds1-cmds0, rcpu1-rcpu0, lr.events)
	}
	_, m.PeakRSS, _ = memory(srv.pids)

	m.fillLoad(lr)
	setCPU(&m, x, cpu1-cpu0, rcpu1-rcpu0, rs != nil, float64(lr.events))
	if rs != nil && lr.events > 0 {
		x.RedisIdleUsPerEvent = num(us(time.Duration(float64(idle)*lr.wall.Seconds())) / float64(lr.events))
	}
	r.logf("%-40s %s, redis cpu %.2fµs/ev (idle %.2f), %.3f round trips/ev (%d commands)", label, m.summary(), float64(x.RedisCPUusPerEvent), float64(x.RedisIdleUsPerEvent), float64(x.RoundTripsPerEvent), x.Commands)
	return m
}

// timedStream is one stream read with the arrival time of every event.
type timedStream struct {
	sent     time.Time // when the request went out
	status   int
	times    []time.Time
	ids      []string
	done     bool // the last event's data was [DONE]
	errEvent bool
	errBody  string
	err      error
}

// ok reports whether the stream arrived whole with expect events.
func (t *timedStream) ok(expect int) bool {
	return t.err == nil && t.status == 200 && !t.errEvent && t.done && len(t.times) == expect
}

// problem describes why a stream is not ok.
func (t *timedStream) problem(expect int) string {
	switch {
	case t.err != nil:
		return fmt.Sprintf("%v (after %d events)", t.err, len(t.times))
	case t.status != 200:
		return fmt.Sprintf("status %d: %s", t.status, t.errBody)
	case t.errEvent:
		return fmt.Sprintf("error event after %d events", len(t.times))
	case !t.done:
		return fmt.Sprintf("no [DONE] (%d events)", len(t.times))
	case len(t.times) != expect:
		return fmt.Sprintf("%d events; want %d", len(t.times), expect)
	}
	return ""
}

// readTimed sends req (a whole HTTP/1.1 request) to addr and reads the SSE
// answer, noting when each event arrived; onFirst runs at the first event.
func readTimed(addr string, req []byte, deadline time.Time, onFirst func()) (t timedStream) {
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.err = fmt.Errorf("dial: %w", err)
		return t
	}
	defer nc.Close()
	_ = nc.SetDeadline(deadline)
	t.sent = time.Now()
	if _, err := nc.Write(req); err != nil {
		t.err = fmt.Errorf("write: %w", err)
		return t
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(nc, 16<<10), nil)
	if err != nil {
		t.err = fmt.Errorf("read response: %w", err)
		return t
	}
	defer resp.Body.Close()
	t.status = resp.StatusCode
	if t.status != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		t.errBody = string(b)
		return t
	}
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	var (
		hasData, lastDone bool
		id                string
	)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if err != io.EOF {
				t.err = fmt.Errorf("read body: %w", err)
			}
			return t
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			if hasData {
				t.times = append(t.times, time.Now())
				t.ids = append(t.ids, id)
				t.done = lastDone
				if len(t.times) == 1 && onFirst != nil {
					onFirst()
				}
			}
			hasData, lastDone, id = false, false, ""
			continue
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(name) {
		case "data":
			hasData = true
			lastDone = string(value) == "[DONE]"
			if bytes.HasPrefix(value, []byte(`{"error"`)) {
				t.errEvent = true
			}
		case "id":
			id = string(value)
		case "event":
			if string(value) == "error" {
				t.errEvent = true
			}
		}
	}
}

// joinTrial is one stream of the joiner step: the first client's and each
// joiner's reading of it.
type joinTrial struct {
	origin  timedStream
	joiners []timedStream
}

// redisJoiners measures one round of the joiner step: two replicas on
// Redis (a joiner on each) when rs is set, else one replica on the
// in-memory store. It returns a measurement per joiner.
func (r *runner) redisJoiners(rs *server, url string, st slowStep, step string, round int) []measurement {
	paths, n, store := []path{pathJoinMem}, 1, "memory"
	if rs != nil {
		paths, n, store = []path{pathJoinOwner, pathJoinRemote}, 2, "redis"
	}
	ms := make([]measurement, len(paths))
	for i, p := range paths {
		ms[i] = newMeasurement("redis", step, round, p, st.streams)
		ms[i].Redis = newRedisNumbers(store)
		if st.pace > 0 {
			ms[i].NominalPerSec = num(float64(st.streams) / st.pace.Seconds())
		}
	}
	fail := func(err error) []measurement {
		for i := range ms {
			ms[i].Error = err.Error()
		}
		return ms
	}
	srvs, err := r.startReplicas(rs, url, n)
	if err != nil {
		return fail(err)
	}
	defer stopAll(srvs)
	// The joiners' replicas: A (the owner) and, on Redis, B.
	joinAt := srvs
	var before []redisCounters
	if rs != nil {
		for _, s := range srvs {
			c, err := scrapeRedis(s.addr)
			if err != nil {
				return fail(err)
			}
			before = append(before, c)
		}
	}
	cpu0, err := cpuOf(srvs...)
	if err != nil {
		return fail(err)
	}
	var rcpu0 time.Duration
	var cmds0 int64
	if rs != nil {
		if rcpu0, err = redisServerCPU(rs.addr); err != nil {
			return fail(err)
		}
		if cmds0, err = redisCommands(rs.addr); err != nil {
			return fail(err)
		}
	}

	owner := srvs[0]
	spec := reqSpec{tokens: tokensFor(st.events), delay: st.pace}
	trials := make([]joinTrial, st.streams)
	deadline := time.Now().Add(10 * time.Minute)
	begin := time.Now()
	var wg sync.WaitGroup
	for i := range trials {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := spec
			s.key = fmt.Sprintf("redis-join-%s-%d-%d-%d", store, r.nonce, round, i)
			tr := &trials[i]
			tr.joiners = make([]timedStream, len(joinAt))
			// first says whether the first client got an event: the
			// generation is claimed, and the joiners join it.
			first := make(chan bool, 1)
			var jwg sync.WaitGroup
			jwg.Add(1)
			go func() {
				defer jwg.Done()
				got := false
				o := readTimed(owner.addr, r.request(owner.addr, s), deadline, func() { got = true; first <- true })
				if !got {
					first <- false
				}
				tr.origin = o
			}()
			if !<-first {
				jwg.Wait()
				return
			}
			for k, js := range joinAt {
				jwg.Add(1)
				go func() {
					defer jwg.Done()
					tr.joiners[k] = readTimed(js.addr, r.request(js.addr, s), deadline, nil)
				}()
			}
			jwg.Wait()
		}()
	}
	wg.Wait()
	wall := time.Since(begin)

	cpu1, err := cpuOf(srvs...)
	if err != nil {
		return fail(err)
	}
	var rcpu1 time.Duration
	var after []redisCounters
	var cmds1 int64
	if rs != nil {
		if rcpu1, err = redisServerCPU(rs.addr); err != nil {
			return fail(err)
		}
		if cmds1, err = redisCommands(rs.addr); err != nil {
			return fail(err)
		}
		for _, s := range srvs {
			c, err := scrapeRedis(s.addr)
			if err != nil {
				return fail(err)
			}
			after = append(after, c)
		}
	}

	expect := st.events
	var delivered, origins int64
	for i := range trials {
		origins += int64(len(trials[i].origin.times))
	}
	for k := range ms {
		m, x := &ms[k], ms[k].Redis
		var deltas, waits []time.Duration
		for i := range trials {
			tr := &trials[i]
			m.Streams++
			var j *timedStream
			if k < len(tr.joiners) {
				j = &tr.joiners[k]
			}
			switch {
			case !tr.origin.ok(expect):
				m.Errors++
				m.ErrorSamples = addDistinct(m.ErrorSamples, "first client: "+tr.origin.problem(expect))
				continue
			case j == nil || !j.ok(expect):
				m.Errors++
				if j != nil {
					m.ErrorSamples = addDistinct(m.ErrorSamples, j.problem(expect))
				}
				continue
			case strings.Join(j.ids, ",") != strings.Join(tr.origin.ids, ","):
				m.Errors++
				m.ErrorSamples = addDistinct(m.ErrorSamples, "event ids differ from the first client's")
				continue
			}
			m.OK++
			m.Events += int64(len(j.times))
			waits = append(waits, j.times[0].Sub(j.sent))
			// Live events: those the first client received after the
			// joiner had its first event (its catch-up), less two more
			// for margin.
			skip := 2
			for e := range j.times {
				if !tr.origin.times[e].After(j.times[0]) {
					continue
				}
				if skip > 0 {
					skip--
					continue
				}
				deltas = append(deltas, j.times[e].Sub(tr.origin.times[e]))
			}
		}
		if len(m.ErrorSamples) > 3 {
			m.ErrorSamples = m.ErrorSamples[:3]
		}
		delivered += m.Events
		m.WallSec = num(wall.Seconds())
		m.EventsPerSec = num(perSecond(m.Events, wall))
		m.StreamsPerSec = num(perSecond(m.OK, wall))
		sort.Slice(deltas, func(a, b int) bool { return deltas[a] < deltas[b] })
		if x.Samples = int64(len(deltas)); x.Samples > 0 {
			x.AddedP50us = num(us(percentile(deltas, 50)))
			x.AddedP99us = num(us(percentile(deltas, 99)))
			x.AddedMaxus = num(us(deltas[len(deltas)-1]))
		}
		sort.Slice(waits, func(a, b int) bool { return waits[a] < waits[b] })
		if len(waits) > 0 {
			x.JoinWaitP50us = num(us(percentile(waits, 50)))
			x.JoinWaitP99us = num(us(percentile(waits, 99)))
		}
		if rs != nil {
			x.fill(before[k], after[k], cmds1-cmds0, rcpu1-rcpu0, origins)
		}
	}
	// CPU of the whole setup (every replica, Redis) per event delivered to
	// every client, the first ones included; the same on each row.
	for k := range ms {
		setCPU(&ms[k], ms[k].Redis, cpu1-cpu0, rcpu1-rcpu0, rs != nil, float64(delivered+origins))
	}
	for k := range ms {
		m := &ms[k]
		r.logf("redis %s r%d %-40s %d/%d streams ok, added p50 %.0fµs p99 %.0fµs over %d events, join wait p50 %.1fms p99 %.1fms, %.3f round trips/ev, redis cpu %.2fµs/ev produced%s",
			step, round, m.Path, m.OK, m.Streams, float64(m.Redis.AddedP50us), float64(m.Redis.AddedP99us), m.Redis.Samples,
			float64(m.Redis.JoinWaitP50us)/1000, float64(m.Redis.JoinWaitP99us)/1000,
			float64(m.Redis.RoundTripsPerEvent), float64(m.Redis.RedisCPUusPerProduced), errSuffix(m))
	}
	return ms
}

// errSuffix is ", N ERRORS: …" for a measurement with errors.
func errSuffix(m *measurement) string {
	if m.Errors == 0 {
		return ""
	}
	return fmt.Sprintf(", %d ERRORS: %s", m.Errors, strings.Join(m.ErrorSamples, "; "))
}

// setCPU records the CPU that ssegate (and redis-server, withRedis) spent
// over a measurement of events events.
func setCPU(m *measurement, x *redisNumbers, ssegate, redis time.Duration, withRedis bool, events float64) {
	m.CPUSec = num(ssegate.Seconds())
	if events <= 0 {
		return
	}
	m.CPUusPerEvent = num(us(ssegate) / events)
	x.SsegateCPUusPerEvent = m.CPUusPerEvent
	x.SumCPUusPerEvent = m.CPUusPerEvent
	if withRedis {
		x.RedisCPUSec = num(redis.Seconds())
		x.RedisCPUusPerEvent = num(us(redis) / events)
		x.SumCPUusPerEvent = num(us(ssegate+redis) / events)
	}
}
