package redis

import (
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"github.com/ssegate/ssegate/cache/internal/wiretest"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/redistest"
)

// reportRedisCost reports what the server did since before, per op, or
// per each of an op's per parts (a stream, an event); b.N itself is left
// as it is, since the benchmark's next run is sized from it.
func reportRedisCost(b *testing.B, addr string, before redisCost, per int) {
	b.Helper()
	after := readRedisCost(b, addr)
	n := float64(b.N * per)
	b.ReportMetric(float64(after.commands-before.commands)/n, "cmds/op") // INFO is not counted
	b.ReportMetric(float64(after.scripts-before.scripts)/n, "scripts/op")
	b.ReportMetric((after.scriptUS-before.scriptUS)/n, "script-µs/op")
	b.ReportMetric((after.cpuUS-before.cpuUS)/n, "redis-cpu-µs/op")
	// Where the time went, by command (go test -v shows it); a script's
	// time includes that of the commands it called, listed too.
	cmds := slices.Sorted(maps.Keys(after.calls))
	for _, cmd := range cmds {
		if calls := after.calls[cmd] - before.calls[cmd]; calls > 0 {
			b.Logf("%-16s %8.3f calls/op %8.2f µs/op", cmd, float64(calls)/n, (after.usec[cmd]-before.usec[cmd])/n)
		}
	}
}

// costEvents is the stream of the cost benchmarks: 200 chat chunks, the
// size of the bench's mock answer.
const costEvents = 200

// costStream claims key on r, journals costEvents chat chunks and
// commits them: an unfollowed stream.
func costStream(b *testing.B, r *Store, key string) {
	f := rbegin(b, r, cache.Scope{Tenant: "t", Key: key}, "fp").Flight
	if f == nil {
		b.Fatalf("key %s: not a miss", key)
	}
	storetest.StartStream(b, f)
	for range costEvents {
		if _, err := f.Append("", wiretest.ChatChunk); err != nil {
			b.Fatal(err)
		}
	}
	if !f.Commit(nil) {
		b.Fatal("Commit: got false")
	}
}

// BenchmarkRedisStreams measures what Redis spends on 64 concurrent
// unfollowed streams of 200 events paced over two seconds each, with a
// 900 ms lease so that each is renewed about six times (every lease/3),
// as the bench's paced streams of 10 s are at the default lease: an op is
// the 64, the metrics per op are per stream.
func BenchmarkRedisStreams(b *testing.B) {
	const streams, pace = 64, 10 * time.Millisecond
	srv := redistest.Start(b)
	r := newRedis(b, srv.Addr, "streams", func(c *Config) { c.Lease = 900 * time.Millisecond })
	costStream(b, r, "warm") // loads the scripts
	before := readRedisCost(b, srv.Addr)
	b.ResetTimer()
	for n := range b.N {
		var wg sync.WaitGroup
		for i := range streams {
			wg.Go(func() {
				f := rbegin(b, r, cache.Scope{Tenant: "t", Key: strconv.Itoa(n) + "-" + strconv.Itoa(i)}, "fp").Flight
				storetest.StartStream(b, f)
				for range costEvents {
					if _, err := f.Append("", wiretest.ChatChunk); err != nil {
						b.Error(err)
						return
					}
					time.Sleep(pace)
				}
				if !f.Commit(nil) {
					b.Error("Commit: got false")
				}
			})
		}
		wg.Wait()
	}
	b.StopTimer()
	reportRedisCost(b, srv.Addr, before, streams) // per stream
}

// BenchmarkRedisCost measures what Redis spends on one unfollowed stream
// of 200 events (op "stream": its claim, key count, commit and key's end;
// no renewal at this speed) and on each script of it alone (one call per
// op, with the arguments the store sends), on a private redis-server:
// its commands, its script calls and the time INFO commandstats counted
// in them, and its process CPU (INFO cpu, user and system), per op.
func BenchmarkRedisCost(b *testing.B) {
	srv := redistest.Start(b)
	r := newRedis(b, srv.Addr, "cost", func(c *Config) { c.Lease = 10 * time.Second })
	ctx := r.ctx
	seq := 0
	fresh := func() rkeys { // the keys of a scope nobody used yet
		seq++
		return r.keys(cache.Scope{Tenant: "t", Key: "k" + strconv.Itoa(seq)})
	}
	sc := cache.Scope{Tenant: "t", Key: "x"}
	claimOf := func(k rkeys, tok string, ask claimAsk) claimArgs {
		return claimArgs{keys: k.all, fp: "fp", tok: tok, owner: r.replica, lease: r.cfg.Lease, liveTTL: r.cfg.LiveTTL,
			now: time.Now(), ask: ask}
	}
	claim := func(k rkeys, tok string) string {
		out, err := scriptStrings(run(ctx, r.c, claimScript, claimOf(k, tok, askClaim)))
		if err != nil || out[0] != "miss" {
			b.Fatalf("claim: %v %v", out, err)
		}
		return out[1]
	}
	exec := func(s script, a scriptArgs) {
		keys, args := a.keysArgs()
		runScript(b, r, s, keys, args)
	}
	// A committed stream's blob, as the finish script gets it.
	costStream(b, r, "blob")
	blob, err := r.c.Do(ctx, r.c.B().Get().Key(r.keys(cache.Scope{Tenant: "t", Key: "blob"}).res).Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("blob of %d events: %d bytes", costEvents, len(blob))

	bench := func(name string, prep func(n int) []rkeys, op func(i int, k rkeys)) {
		b.Run(name, func(b *testing.B) {
			var ks []rkeys
			if prep != nil {
				ks = prep(b.N)
			}
			before := readRedisCost(b, srv.Addr)
			b.ResetTimer()
			for i := range b.N {
				var k rkeys
				if ks != nil {
					k = ks[i]
				}
				op(i, k)
			}
			b.StopTimer()
			reportRedisCost(b, srv.Addr, before, 1)
		})
	}
	claimed := func(n int) []rkeys { // live generations, h holding each one's gen
		ks := make([]rkeys, n)
		for i := range ks {
			ks[i] = fresh()
			ks[i].h = claim(ks[i], "tok")
		}
		return ks
	}
	quota := func(k rkeys) quotaArgs {
		return quotaArgs{set: r.tenantKey(sc), member: k.h, bound: -1, liveTTL: r.cfg.LiveTTL, setTTL: r.setTTL()}
	}
	global := func(k rkeys) globalArgs {
		return globalArgs{keys: r.globalKeys(), member: k.h, all: -1, strangers: -1, stranger: true,
			liveTTL: r.cfg.LiveTTL, setTTL: r.setTTL()}
	}
	bench("stream", nil, func(i int, _ rkeys) { seq++; costStream(b, r, "s"+strconv.Itoa(seq)) })
	bench("claim-new", nil, func(int, rkeys) { exec(claimScript, claimOf(fresh(), "tok", askCount)) })
	bench("quota", nil, func(int, rkeys) { exec(quotaScript, quota(fresh())) })
	bench("global", nil, func(int, rkeys) { exec(globalScript, global(fresh())) })
	bench("claim-miss", nil, func(int, rkeys) { claim(fresh(), "tok") })
	// A renewal as renewAll sends it mid-stream: the lease, and the
	// generation's progress (what moved since the last renewal).
	renewItem := func(k rkeys) batchItem {
		return batchItem{keys: k.withoutResult[:2], args: []string{"n67", "tok", k.h,
			"120", "45000", nowMS(time.Now())}} // events, bytes, updated
	}
	renew := func(items ...batchItem) {
		out, err := r.renewRun(ctx, items)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range out {
			if n, err := m.AsInt64(); err != nil || n != 1 {
				b.Fatalf("renewal: %d %v", n, err)
			}
		}
	}
	// One renewal a call, as on a Cluster.
	bench("renew", claimed, func(_ int, k rkeys) { renew(renewItem(k)) })
	// 64 renewals in one call, as renewAll sends them on a standalone
	// Redis: an op is the 64.
	together := claimed(64)
	bench("renew-64", nil, func(int, rkeys) {
		items := make([]batchItem, len(together))
		for i, k := range together {
			items[i] = renewItem(k)
		}
		renew(items...)
	})
	// 64 mirrored owners' appends of one event each in one call, as the
	// appendBatcher sends a followed stream's events at an LLM's pace:
	// an op is the 64.
	mirrored := claimed(64)
	seqs := make([]int, len(mirrored))
	bench("appends-64", nil, func(int, rkeys) {
		items := make([]batchItem, len(mirrored))
		for i, k := range mirrored {
			gen, head := k.h, ""
			if seqs[i] == 0 {
				head = `{"status":200}`
			}
			a := appendArgs{keys: k.journal, tok: "tok", gen: gen, prev: gen + "-" + strconv.Itoa(seqs[i]),
				mark: markFields{state: cache.StateExecutionStarted, attempts: 1, status: 200}, now: time.Now(), head: head,
				bytes: int64(len(wiretest.ChatChunk) * (seqs[i] + 1)), from: seqs[i], evs: [][]byte{[]byte(wiretest.ChatChunk)}}
			items[i].keys, items[i].args = a.keysArgs()
			seqs[i]++
		}
		out, err := appendsScript.exec(ctx, r.c, items)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range out {
			if a, err := parseWriteStrings(m.AsStrSlice()); err != nil || a.verdict != writeOK {
				b.Fatalf("append: %v %v", a, err)
			}
		}
	})
	bench("finish", claimed, func(_ int, k rkeys) {
		gen := k.h
		k.h = k.st // a member to end
		exec(finishScript, finishArgs{keys: r.finishKeys(sc, k, r.sharedKeys()), tok: "tok", gen: gen, done: true,
			prev: gen + "-0", keep: r.cfg.TTL, state: cache.StateCommitted, now: time.Now(), result: []byte(blob),
			events: costEvents, bytes: 45000, mark: markFields{attempts: 1, status: 200, model: "gpt-4o-mini"},
			end: r.countEnd(k, r.cfg.TTL, true, false, "1")}) // a known tenant's new key
	})
	counted := func(n int) []rkeys { // keys counted as a new key's are
		ks := make([]rkeys, n)
		for i := range ks {
			ks[i] = fresh()
			exec(quotaScript, quota(ks[i]))
			exec(globalScript, global(ks[i]))
		}
		return ks
	}
	bench("key-end", counted, func(_ int, k rkeys) {
		exec(keyEndScript, keyEndArgs{set: r.tenantKey(sc), end: r.countEnd(k, r.cfg.TTL, true, false, "")})
	})
	bench("global-end", counted, func(_ int, k rkeys) {
		exec(globalEndScript, globalEndArgs{keys: r.globalKeys(), end: r.countEnd(k, r.cfg.TTL, true, false, "")})
	})
	bench("unknown-count", nil, func(int, rkeys) {
		if _, err := r.UnknownKeys(); err != nil {
			b.Fatal(err)
		}
	})
	bench("ping", nil, func(int, rkeys) {
		if err := r.c.Do(ctx, r.c.B().Ping().Build()).Error(); err != nil {
			b.Fatal(err)
		}
	})
}
