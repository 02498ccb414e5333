package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/redis"
	"github.com/ssegate/ssegate/internal/redistest"
)

// TestShardArithmetic: scenario shard's slots, follower share, driver
// processes, percentiles, per-stream figures and knee.
func TestShardArithmetic(t *testing.T) {
	start := time.Unix(1000, 0)
	if got := slotStart(start, 3, 4, 10*time.Second); got != start.Add(7500*time.Millisecond) {
		t.Errorf("slotStart(3 of 4): got %v; want 7.5s after start", got.Sub(start))
	}
	for _, c := range []struct {
		share float64
		want  int
	}{{0, 0}, {0.05, 50}, {0.25, 250}, {1, 1000}} {
		n := 0
		for i := range 1000 {
			if followed(i, c.share) {
				n++
			}
		}
		if n != c.want {
			t.Errorf("followed at %v: %d of 1000 slots; want %d", c.share, n, c.want)
		}
	}
	o := shardOptions{perProc: 25000}
	for n, want := range map[int]int{1: 1, 25000: 1, 25001: 2, 100000: 4} {
		if got := o.procsFor(n); got != want {
			t.Errorf("procsFor(%d): got %d; want %d", n, got, want)
		}
	}
	o.procs = 3
	if got := o.procsFor(2); got != 2 {
		t.Errorf("procsFor(2) with -shard-procs 3: got %d; want 2", got)
	}
	if p := pctUS([]int64{5, 1, 4, 2, 3}, 50); p != 3 {
		t.Errorf("p50 of 1..5: got %v; want 3", p)
	}
	if p := pctUS(nil, 99); !math.IsNaN(float64(p)) {
		t.Errorf("p99 of nothing: got %v; want NaN", p)
	}

	res := []*shardDriverResult{
		{Claims: 60, Commits: 50, ClaimUS: []int64{100, 200}, CommitUS: []int64{300}, JoinUS: []int64{1000}, CPUns: int64(500 * time.Millisecond),
			Store: redis.Stats{Claims: 61, Commits: 50}},
		{Claims: 40, Commits: 50, ClaimUS: []int64{60000}, CommitUS: []int64{400}, CPUns: int64(time.Second), Errors: 1, ErrorSamples: []string{"e"},
			Store: redis.Stats{Claims: 40, Commits: 50}},
	}
	w := serverWindow{wall: 2 * time.Second, cpu: time.Second, main: 800 * time.Millisecond,
		calls: map[string]cmd{"evalsha": {Calls: 200, USec: 4000}, "hset": {Calls: 300, USec: 300}, "xread": {Calls: 100, USec: 100}},
		reads: 250, inBytes: 100_000, idle: 100 * time.Millisecond}
	row := &shardRow{IOThreads: 1}
	row.fill(res, w)
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"claims", float64(row.Claims), 100}, {"commits", float64(row.Commits), 100}, {"errors", float64(row.Errors), 1},
		{"server CPU share", float64(row.ServerCPU), 0.5}, {"main thread share", float64(row.ServerMainCPU), 0.4},
		{"driver CPU share", float64(row.DriverCPU), 0.75}, {"busiest driver", float64(row.DriverMaxCPU), 0.5},
		{"commands/stream", float64(row.CommandsPerStream), 6}, {"script calls/stream", float64(row.ScriptsPerStream), 2},
		{"µs/script call", float64(row.ScriptUSPerCall), 20}, {"round trips/stream", float64(row.ReadsPerStream), 2.5},
		{"input bytes/stream", float64(row.InBytesPerStream), 1000}, {"server µs/stream", float64(row.ServerUSPerStream), 10000},
		{"idle server share", float64(row.IdleCPU), 0.05}, {"server µs/stream net of idle", float64(row.NetUSPerStream), 9000},
		{"claim p99", float64(row.ClaimP99us), 60000}, {"commit p50", float64(row.CommitP50us), 300},
		{"join p50", float64(row.JoinP50us), 1000}, {"store claims", float64(row.Store.Claims), 101},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v; want %v", c.name, c.got, c.want)
		}
	}
	knee := func(r shardRow) string {
		return r.knee(&shardOptions{kneeCPU: 0.9, kneeP99: 50 * time.Millisecond})
	}
	held := shardRow{IOThreads: 1, Claims: 1, Commits: 1, ServerCPU: 0.5, ServerMainCPU: 0.5, ClaimP99us: 49000, CommitP99us: 1000}
	if k := knee(held); k != "" {
		t.Errorf("a step within the bounds: knee %q; want none", k)
	}
	for name, r := range map[string]shardRow{
		"errors":    {IOThreads: 1, Claims: 1, Commits: 1, Errors: 1},
		"CPU":       {IOThreads: 1, Claims: 1, Commits: 1, ServerCPU: 0.95, ServerMainCPU: 0.95},
		"main CPU":  {IOThreads: 4, Claims: 1, Commits: 1, ServerCPU: 1.6, ServerMainCPU: 0.92},
		"claim p99": {IOThreads: 1, Claims: 1, Commits: 1, ClaimP99us: 51000},
		"idle":      {IOThreads: 1},
	} {
		if knee(r) == "" {
			t.Errorf("%s: no knee; want one", name)
		}
	}
	if b := (&shardRow{DriverMaxCPU: 0.5, LagP99us: 40000, PaceUS: 50000}).driverBound(); b != "" {
		t.Errorf("drivers at half a core, lag within the pace: %q; want none", b)
	}
	for _, r := range []shardRow{{DriverMaxCPU: 0.95, PaceUS: 50000}, {LagP99us: 60000, PaceUS: 50000}} {
		if r.driverBound() == "" {
			t.Errorf("busiest driver %v, lag p99 %v µs at a pace of %v µs: no bound; want one", r.DriverMaxCPU, r.LagP99us, r.PaceUS)
		}
	}
	if k := knee(shardRow{IOThreads: 4, Claims: 1, Commits: 1, ServerCPU: 1.6, ServerMainCPU: 0.5}); k != "" {
		t.Errorf("io-threads past one core, main thread at half: knee %q; want none", k)
	}
}

// TestShardDriver drives 24 streams of 8 events, a quarter followed, on a
// private Redis, and counts them there: every stream begun is committed
// once (its record committed, one commit), every follower read its
// stream to the end, and nothing failed.
func TestShardDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs load against a Redis")
	}
	srv := redistest.Start(t)
	start := time.Now().Add(100 * time.Millisecond)
	const streams = 24
	cfg := shardDriverConfig{URL: "redis://" + srv.Addr, Prefix: "smoke", Proc: 0, Procs: 1, Streams: streams, Events: 8,
		StreamDur: 400 * time.Millisecond, Follow: 0.25, EventBytes: 16, Tenants: 4,
		Start: start, WindowStart: start.Add(400 * time.Millisecond), WindowEnd: start.Add(1200 * time.Millisecond)}
	res, err := driveShard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 {
		t.Fatalf("%d errors (%v); want none", res.Errors, res.ErrorSamples)
	}
	if res.Begun < 2*streams || res.Kept != res.Begun {
		t.Fatalf("%d streams begun, %d committed; want at least %d, all", res.Begun, res.Kept, 2*streams)
	}
	if res.Claims == 0 || res.Commits == 0 || len(res.ClaimUS) != int(res.Claims) || len(res.CommitUS) != int(res.Commits) || len(res.JoinUS) == 0 {
		t.Fatalf("window: %d claims (%d samples), %d commits (%d samples), %d joins; want some of each, a sample each",
			res.Claims, len(res.ClaimUS), res.Commits, len(res.CommitUS), len(res.JoinUS))
	}
	// Count in Redis: each slot's streams are keys n0, n1, … of its own.
	r, err := redis.New(redis.Config{URL: cfg.URL, Prefix: cfg.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var committed, followedStreams int64
	for i := range streams {
		for n := 0; ; n++ {
			sc := cache.Scope{Tenant: fmt.Sprint("t", i%cfg.Tenants), Key: fmt.Sprintf("p0-s%d-n%d", i, n)}
			ki, ok := r.Info(sc)
			if !ok {
				break
			}
			if ki.State != cache.StateCommitted || ki.Events != cfg.Events {
				t.Fatalf("%s: %s with %d events; want committed with %d", sc.Key, ki.State, ki.Events, cfg.Events)
			}
			committed++
			if followed(i, cfg.Follow) {
				followedStreams++
			}
		}
	}
	if committed != res.Kept || res.Followers != followedStreams {
		t.Fatalf("Redis holds %d committed streams, %d of them followed; the driver counted %d, and %d followers to the end",
			committed, followedStreams, res.Kept, res.Followers)
	}
}

// TestShardScenario runs scenario shard at two small steps from two
// driver processes: a row per step with its figures, the table in the
// report. It is skipped without redis-server on PATH, unless $CI is set.
func TestShardScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and runs load")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "" {
			t.Skip("redis-server is not on PATH")
		}
		t.Fatal("redis-server is not on PATH, and $CI is set")
	}
	// Scenario shard runs no ssegate: any executable stands in for it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rep, stdout, _ := runQuick(t, "-scenarios", "shard", "-peers", "ssegate", "-ssegate", self, "-shard-steps", "20,40", "-shard-procs", "2",
		"-shard-stream", "500ms", "-shard-window", "1s", "-shard-events", "10", "-shard-follow", "0.2",
		// Only errors may stop the steps: on a shared machine a p99 can
		// pass any bound a CI run could keep.
		"-shard-knee-p99", "1m", "-shard-knee-cpu", "64")
	if len(rep.Shard) != 2 {
		t.Fatalf("%d shard rows; want 2", len(rep.Shard))
	}
	for _, r := range rep.Shard {
		if r.Errors != 0 || r.Knee != "" || r.Procs != 2 || r.Kept != r.Begun || r.Claims == 0 || r.Commits == 0 {
			t.Errorf("%d streams: %d errors (%v), knee %q, %d drivers, %d of %d streams committed, %d claims and %d commits in the window; want none, none, 2, all, some",
				r.Streams, r.Errors, r.ErrorSamples, r.Knee, r.Procs, r.Kept, r.Begun, r.Claims, r.Commits)
		}
		if !(r.IdleCPU >= 0) || r.Calls["evalsha"].Calls == 0 {
			t.Errorf("%d streams: idle server CPU %v, evalsha %+v; want a number, calls", r.Streams, r.IdleCPU, r.Calls["evalsha"])
		}
		if !(r.ServerCPU >= 0) || !(r.ReadsPerStream > 0) || !(r.CommandsPerStream > 0) || !(r.ClaimP99us > 0) || !(r.DriverCPU >= 0) || r.JoinSamples == 0 {
			t.Errorf("%d streams: CPU %v, %v round trips and %v commands per stream, claim p99 %v, driver CPU %v, %d joins; want numbers",
				r.Streams, r.ServerCPU, r.ReadsPerStream, r.CommandsPerStream, r.ClaimP99us, r.DriverCPU, r.JoinSamples)
		}
	}
	if !strings.Contains(stdout, "### (shard) Concurrent streams one Redis shard holds") {
		t.Error("the report has no shard table")
	}
	if !strings.Contains(stdout, "#### (shard) Where the server's time goes, per stream") || !strings.Contains(stdout, "| evalsha |") {
		t.Error("the report has no table of the server's time by command")
	}
}

// TestShardFailover runs scenario shard's failover at a small step: the
// primary is killed mid-window and its replica promoted; every key the
// drivers saw committed replays afterwards (none would be paid twice),
// and the report says so. It is skipped without redis-server on PATH,
// unless $CI is set.
func TestShardFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and runs load")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "" {
			t.Skip("redis-server is not on PATH")
		}
		t.Fatal("redis-server is not on PATH, and $CI is set")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rep, stdout, _ := runQuick(t, "-scenarios", "shard", "-peers", "ssegate", "-ssegate", self, "-shard-steps", "40",
		"-shard-stream", "500ms", "-shard-window", "1s", "-shard-events", "10", "-shard-follow", "0.2", "-shard-failover",
		"-shard-knee-p99", "1m", "-shard-knee-cpu", "64")
	if len(rep.Shard) != 1 {
		t.Fatalf("%d shard rows; want 1", len(rep.Shard))
	}
	r := rep.Shard[0]
	rc := r.Recheck
	if !r.Failover || rc.Committed == 0 || rc.Replayed != rc.Committed || rc.Lost != 0 {
		t.Errorf("failover %v: %d keys committed, %d replayed, %d lost; want a failover, every committed key replayed, none lost", r.Failover, rc.Committed, rc.Replayed, rc.Lost)
	}
	if !strings.Contains(stdout, "failover (the primary SIGKILLed mid-window") {
		t.Error("the report does not say what the failover did")
	}
}
