package redis

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/poll"
	"github.com/ssegate/ssegate/internal/redistest"
)

// The Redis store's tests run against a real
// redis-server: the one CI starts (SSEGATE_REDIS_ADDR) or one of their
// own. Two stores on one Redis are two replicas in one process.

// testLease is their stores' lease: short, so that a lease lapses within
// a test.
const testLease = 400 * time.Millisecond

// newRedis returns a store on addr with the test's key prefix, closed when
// the test ends.
func newRedis(tb testing.TB, addr, prefix string, mod func(*Config)) *Store {
	tb.Helper()
	cfg := Config{URL: "redis://" + addr, Prefix: prefix, Lease: testLease, Timeout: time.Second}
	if mod != nil {
		mod(&cfg)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r, err := New(cfg)
	if err != nil {
		tb.Fatalf("New: got error %v; want none", err)
	}
	tb.Cleanup(r.Close)
	return r
}

// replicas returns n stores sharing one Redis and one prefix.
func replicas(tb testing.TB, n int) []*Store {
	tb.Helper()
	addr := redistest.Shared(tb)
	prefix := redistest.Prefix(tb)
	rs := make([]*Store, n)
	for i := range rs {
		rs[i] = newRedis(tb, addr, prefix, nil)
	}
	return rs
}

func rbegin(tb testing.TB, r *Store, sc cache.Scope, fp string) cache.Begun {
	tb.Helper()
	b, err := r.Begin(sc, fp)
	if err != nil {
		tb.Fatalf("Begin(%v): got error %v; want none", sc, err)
	}
	return b
}

// waitDone waits for f to end and returns its outcome.
func waitDone(tb testing.TB, f *cache.Flight, within time.Duration) cache.State {
	tb.Helper()
	select {
	case <-f.Done():
	case <-time.After(within):
		tb.Fatalf("flight %d: not ended after %v", f.Gen, within)
	}
	state, _, _ := f.Outcome()
	return state
}

// eventually calls cond until it returns nil (poll.Until), and fails the
// test with its last error if it has not within d. It is for what a test
// against a real Redis waits for (a server back, a lease renewed, an
// expiry in Redis), which no synctest bubble can stand in for.
func eventually(tb testing.TB, d time.Duration, cond func() error) {
	tb.Helper()
	var err error
	if !poll.Until(d, func() bool { err = cond(); return err == nil }) {
		tb.Fatal(err)
	}
}

func commits(tb testing.TB, r *Store, sc cache.Scope) int64 {
	tb.Helper()
	n, err := r.c.Do(context.Background(), r.c.B().Hget().Key(r.keys(sc).st).Field("commits").Build()).AsInt64()
	if err != nil && !rueidis.IsRedisNil(err) {
		tb.Fatalf("HGET commits: %v", err)
	}
	return n
}

// redisCost is what a private redis-server did: its script calls, the
// time it counted in them, its process CPU, and all the commands
// clients sent it.
type redisCost struct {
	scripts, commands int64
	scriptUS, cpuUS   float64
	calls             map[string]int64   // per command, lower case
	usec              map[string]float64 // the time INFO commandstats counted in each
}

// readRedisCost reads INFO commandstats and INFO cpu of the server at addr.
func readRedisCost(tb testing.TB, addr string) redisCost {
	tb.Helper()
	c := redisCost{calls: map[string]int64{}, usec: map[string]float64{}}
	stats, err := redistest.Command(addr, 5*time.Second, "INFO", "commandstats")
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	for _, l := range strings.Split(stats, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		cmd, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd || cmd == "info" {
			continue
		}
		var calls int64
		var usec float64
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, _ = strconv.ParseFloat(v, 64)
			}
		}
		c.commands += calls
		c.calls[cmd] = calls
		c.usec[cmd] = usec
		if cmd == "evalsha" || cmd == "eval" {
			c.scripts += calls
			c.scriptUS += usec
		}
	}
	cpu, err := redistest.Command(addr, 5*time.Second, "INFO", "cpu")
	if err != nil {
		tb.Fatalf("INFO cpu: %v", err)
	}
	for _, l := range strings.Split(cpu, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(l), ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			s, _ := strconv.ParseFloat(v, 64)
			c.cpuUS += s * 1e6
		}
	}
	return c
}

// script is a Lua script of the store.
type script = *rueidis.Lua

// runScript runs s once on r's Redis, failing tb on an error reply.
func runScript(tb testing.TB, r *Store, s script, keys, args []string) {
	tb.Helper()
	if err := s.Exec(r.ctx, r.c, keys, args).Error(); err != nil && !rueidis.IsRedisNil(err) {
		tb.Fatal(err)
	}
}

// claimReplyCut claims sc on a, through relay, which loses the claim's
// answer and cuts the connection that carried it (the claim ran on the
// server). The claim must still come back its own miss: the generation
// Redis holds (read on b), which a duplicate on b joins.
func claimReplyCut(t *testing.T, relay *redistest.Relay, a, b *Store, sc cache.Scope) cache.Begun {
	t.Helper()
	lost := relay.LoseReply("$4\r\nmiss\r\n", 0)
	got := rbegin(t, a, sc, "fp")
	select {
	case <-lost:
	default:
		t.Fatal("no claim's reply was lost")
	}
	if got.Decision != cache.Miss || got.Flight == nil {
		t.Fatalf("got %v; want the claim's own miss", got.Decision)
	}
	if ki, _ := b.Info(sc); ki.Generation != got.Flight.Gen || ki.State != cache.StateIntentReceived {
		t.Fatalf("Redis holds generation %d (%s); want the miss's %d", ki.Generation, ki.State, got.Flight.Gen)
	}
	if j := rbegin(t, b, sc, "fp"); j.Decision != cache.Join || j.Flight.Gen != got.Flight.Gen {
		t.Fatalf("duplicate: got %v; want a join of the claim's generation", j.Decision)
	}
	return got
}
