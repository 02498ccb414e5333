package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestRedisScenario runs a short scenario redis against the real ssegate
// binary and a private redis-server: every stream whole, Redis round trips
// and CPU counted on the Redis rows, joiner latencies sampled on every
// joiner row. It is skipped without redis-server on PATH, unless $CI is
// set (CI installs it).
func TestRedisScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and runs load")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "" {
			t.Skip("redis-server is not on PATH")
		}
		t.Fatal("redis-server is not on PATH, and $CI is set")
	}
	// Enough events that each process's CPU is some clock ticks (10 ms) at
	// least: /proc counts no less, and a smaller run can read as 0.
	rep, stdout, _ := runQuick(t, "-scenarios", "redis", "-redis-load", "16@5ms:80", "-redis-join", "3@10ms:80")
	paths := map[string]bool{}
	for _, m := range rep.Measurements {
		name := m.Step + " / " + m.Path
		paths[m.Path] = true
		if m.Scenario != "redis" || m.Redis == nil {
			t.Errorf("%s: scenario %q, redis numbers %v; want redis and some", name, m.Scenario, m.Redis)
			continue
		}
		if m.Error != "" {
			t.Errorf("%s: %s", name, m.Error)
			continue
		}
		x := m.Redis
		if m.Errors > 0 || m.OK == 0 {
			t.Errorf("%s: %d of %d streams failed: %v", name, m.Errors, m.Streams, m.ErrorSamples)
		}
		if !(x.SsegateCPUusPerEvent > 0) || !(x.SumCPUusPerEvent >= x.SsegateCPUusPerEvent) {
			t.Errorf("%s: CPU %v µs/event, sum %v; want numbers", name, x.SsegateCPUusPerEvent, x.SumCPUusPerEvent)
		}
		if x.Store == "redis" {
			if !(x.RedisCPUusPerEvent >= 0) || !(x.RoundTripsPerEvent > 0) {
				t.Errorf("%s: Redis CPU %v µs/event, %v round trips/event; want numbers", name, x.RedisCPUusPerEvent, x.RoundTripsPerEvent)
			}
			if m.Path == pathRedisCPU.name && !(x.RedisIdleUsPerEvent >= 0) {
				t.Errorf("%s: Redis idle CPU %v µs/event; want a number", name, x.RedisIdleUsPerEvent)
			}
			// Nobody follows the CPU step's streams from another replica:
			// no event goes to Redis. Each joiner step's stream is
			// followed: its owner mirrors it, a batch an event at most
			// (and one for the commit).
			if m.Path == pathRedisCPU.name && x.EventsAppended != 0 {
				t.Errorf("%s: %d events appended to Redis with no follower; want none", name, x.EventsAppended)
			}
			if m.Path == pathJoinOwner.name && (x.EventsAppended == 0 || x.Batches == 0 || x.Batches > x.EventsAppended+3*m.Streams) {
				t.Errorf("%s: %d events appended in %d batches; want some, at most one batch an event and three a stream", name, x.EventsAppended, x.Batches)
			}
			if m.Path == pathJoinRemote.name && (x.Tails == 0 || x.Reads == 0) {
				t.Errorf("%s: %d tails, %d reads on the joiners' replica; want some", name, x.Tails, x.Reads)
			}
		}
		if strings.HasPrefix(m.Step, "joiners") && (x.Samples == 0 || !(x.AddedP99us >= x.AddedP50us)) {
			t.Errorf("%s: %d latency samples, p50 %v, p99 %v", name, x.Samples, x.AddedP50us, x.AddedP99us)
		}
	}
	for _, p := range []path{pathMemCPU, pathRedisCPU, pathJoinMem, pathJoinOwner, pathJoinRemote} {
		if !paths[p.name] {
			t.Errorf("no measurement of %q", p.name)
		}
	}
	if !strings.Contains(stdout, "### (redis) Redis store") {
		t.Errorf("the report lacks the redis table:\n%s", stdout)
	}
}
