package redis

import (
	"context"
	"errors"
	"fmt"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/ssegate/ssegate/internal/redistest"
)

// TestRedisMaxKeysPerTenant: a tenant's keys are counted across replicas;
// at its bound its new keys get ErrTenantFull on either replica, while
// its known keys are decided as usual and other tenants' new keys are
// claimed; a failed key counts until FailedTTL, a reaped one too. It is
// not parallel: its checks that a key still counts must land within the
// 700 ms FailedTTL of the key's end, which other tests' load could delay.
func TestRedisMaxKeysPerTenant(t *testing.T) {
	addr, prefix := redistest.Shared(t), redistest.Prefix(t)
	maxKeysPerTenant(t, func(mod func(*Config)) *Store { return newRedis(t, addr, prefix, mod) })
}

// maxKeysPerTenant is TestRedisMaxKeysPerTenant on the replicas store
// makes, with a FailedTTL and a bound of its own.
func maxKeysPerTenant(t *testing.T, store func(mod func(*Config)) *Store) {
	const failedTTL = 700 * time.Millisecond
	mod := func(c *Config) { c.FailedTTL, c.MaxKeysPerTenant = failedTTL, 3 }
	rs := []*Store{store(mod), store(mod)}
	a := func(k string) cache.Scope { return cache.Scope{Tenant: "a", Key: k} }
	refused := func(r *Store, sc cache.Scope) {
		t.Helper()
		_, err := r.Begin(sc, "fp")
		if !errors.Is(err, cache.ErrTenantFull) || errors.Is(err, cache.ErrStoreFull) || errors.Is(err, cache.ErrUnavailable) {
			t.Fatalf("Begin of %v: got %v; want ErrTenantFull", sc, err)
		}
	}
	counted := func() int64 {
		t.Helper()
		n, err := rs[0].c.Do(context.Background(), rs[0].c.B().Zcard().Key(rs[0].tenantKey(a(""))).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	done := rbegin(t, rs[0], a("done"), "fp").Flight
	storetest.StartStream(t, done)
	storetest.AppendN(t, done, 1, 3)
	if !done.Commit(nil) {
		t.Fatal("commit: got not stored; want stored")
	}
	live := rbegin(t, rs[1], a("live"), "fp").Flight
	storetest.StartStream(t, live)
	rbegin(t, rs[0], a("failed"), "fp").Flight.Fail(cache.StateFailedRetryable, "upstream reset", nil)
	refused(rs[0], a("new"))
	refused(rs[1], a("new"))
	if n := counted(); n != 3 {
		t.Errorf("tenant's set: got %d members; want 3", n)
	}

	for _, tt := range []struct {
		key, fp string
		want    cache.Decision
	}{
		{"done", "fp", cache.Hit}, {"live", "fp", cache.Join}, {"done", "other", cache.Conflict}, {"failed", "fp", cache.Miss},
	} {
		for i, r := range rs {
			b := rbegin(t, r, a(tt.key), tt.fp)
			if b.Decision != tt.want {
				t.Errorf("replica %d, Begin of the full tenant's known key %q (%s): got %v; want %v", i, tt.key, tt.fp, b.Decision, tt.want)
			}
			if b.Decision == cache.Miss {
				b.Flight.Fail(cache.StateFailedRetryable, "upstream reset", nil)
			}
		}
	}
	other := rbegin(t, rs[1], cache.Scope{Tenant: "b", Key: "new"}, "fp")
	if other.Decision != cache.Miss {
		t.Errorf("another tenant's new key: got %v; want miss", other.Decision)
	}
	other.Flight.Fail(cache.StateFailedRetryable, "test", nil)

	// The failed key stops counting once its records expire; the reaped
	// generation of a dead owner counts for FailedTTL as well.
	eventually(t, failedTTL+time.Second, uncounted(rs[0], a("failed")))
	nf := rbegin(t, rs[1], a("new"), "fp")
	if nf.Decision != cache.Miss {
		t.Fatalf("a new key after the failed one expired: got %v; want miss", nf.Decision)
	}
	refused(rs[0], a("new2"))
	j := rbegin(t, rs[0], a("live"), "fp") // a follower, on the other replica
	if j.Decision != cache.Join {
		t.Fatalf("Begin of the live key: got %v; want join", j.Decision)
	}
	live.Backend().(*owner).shutdown() // the owner's process is gone: the follower reaps
	if st := waitDone(t, j.Flight, 3*testLease); st != cache.StateCommitUnknown {
		t.Fatalf("follower of the dead owner: got %v; want commit_unknown", st)
	}
	refused(rs[0], a("new2"))
	eventually(t, failedTTL+time.Second, uncounted(rs[0], a("live")))
	b := rbegin(t, rs[0], a("new2"), "fp")
	if b.Decision != cache.Miss {
		t.Fatalf("a new key after the reaped one expired: got %v; want miss", b.Decision)
	}
	b.Flight.Fail(cache.StateFailedRetryable, "test", nil)
	nf.Flight.Fail(cache.StateFailedRetryable, "test", nil)
}

// uncounted returns a condition for eventually: sc's key no longer counts
// against its tenant, its member of the tenant's set having a score (the
// key's expiry) that Redis's clock has passed, as quotaScript reads it.
func uncounted(r *Store, sc cache.Scope) func() error {
	return func() error {
		ctx := context.Background()
		score, err := r.c.Do(ctx, r.c.B().Zscore().Key(r.tenantKey(sc)).Member(r.keys(sc).h).Build()).AsFloat64()
		if rueidis.IsRedisNil(err) {
			return nil
		}
		now, err2 := r.c.Do(ctx, r.c.B().Time().Build()).AsStrSlice()
		if err != nil || err2 != nil || len(now) != 2 {
			return fmt.Errorf("%v: score and time: %v, %v", sc, err, err2)
		}
		s, _ := strconv.ParseInt(now[0], 10, 64)
		us, _ := strconv.ParseInt(now[1], 10, 64)
		if ms := float64(s*1000 + us/1000); score >= ms {
			return fmt.Errorf("%v: still counts for its tenant (expires at %.0f, Redis's clock %.0f)", sc, score, ms)
		}
		return nil
	}
}

// maxCountedCmds bounds the commands Redis runs, inner ones included, for
// the claim and the commit of a known tenant's new key whose count does
// not prune (TestRedisCountInScripts).
const maxCountedCmds = 20

// TestRedisCountInScripts: on a standalone Redis a new key is counted by
// its claim and its count ended by its commit: one script call each, where
// the count took scripts of its own (three more at the claim, two at the
// commit), and at most maxCountedCmds commands in Redis in all. The count is the same: the key counts against its tenant and
// the whole while live, then for TTL after its commit, its tenant known.
func TestRedisCountInScripts(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "count", func(c *Config) { c.Lease = time.Minute })
	// A first stream renews the sets' expiry (setRenewals).
	warm := rbegin(t, r, cache.Scope{Tenant: "t", Key: "warm"}, "fp").Flight
	storetest.StartStream(t, warm)
	warm.Commit(nil)
	sc := keysThatPrune(r, "t", 1, false)[0] // its count does not prune: a fixed cost
	polls := storeCmds(t, srv.Addr)
	before := readRedisCost(t, srv.Addr)
	f := rbegin(t, r, sc, "fp").Flight
	claimed := readRedisCost(t, srv.Addr)
	if n := claimed.scripts - before.scripts; n != 1 {
		t.Errorf("the claim of a new key: %d script calls; want 1", n)
	}
	cmds := storeCmds(t, srv.Addr) - polls
	if got := tenantScore(t, r, sc); got < 59*time.Minute || got > time.Hour {
		t.Errorf("a live key counts for its tenant %v more; want LiveTTL (1h)", got)
	}
	storetest.StartStream(t, f)
	storetest.AppendN(t, f, 1, 20)
	polls = storeCmds(t, srv.Addr)
	before = readRedisCost(t, srv.Addr)
	if !f.Commit(nil) {
		t.Fatal("Commit: got false")
	}
	committed := readRedisCost(t, srv.Addr)
	if n := committed.scripts - before.scripts; n != 1 {
		t.Errorf("the commit: %d script calls; want 1", n)
	}
	// Redis's cost is about its commands, inner ones included: a known
	// tenant's new key takes 2 scripts; at the claim its record (HMGET,
	// TIME, HSET, PEXPIRE), its lease (SET) and 5 commands of count (ZCARD
	// and ZADD of the tenant's set and of all keys, EXISTS of the known
	// marker; the warm stream's claim renewed the sets' expiry); at the
	// commit its record and result (HMGET, SET, HSET, PEXPIRE; no journal
	// was written, the lease is left to expire) and 4 of the count's end
	// (TIME, SET of the marker, ZADD of the tenant's set and of all keys;
	// the key was in neither the strangers' nor the commit_unknown's set,
	// which the claim knew): 20, where the code before this count took 35.
	if cmds += storeCmds(t, srv.Addr) - polls; cmds > maxCountedCmds {
		t.Errorf("a new key's claim and commit: %d commands in Redis; want at most %d", cmds, maxCountedCmds)
	}
	t.Logf("a new key's claim and commit: %d commands in Redis", cmds)
	if got := tenantScore(t, r, sc); got < 23*time.Hour || got > 24*time.Hour {
		t.Errorf("a committed key counts for its tenant %v more; want TTL (24h)", got)
	}
	ctx := context.Background()
	for _, key := range r.globalKeys()[:2] {
		n, err := r.c.Do(ctx, r.c.B().Zcard().Key(key).Build()).AsInt64()
		if want := int64(2 - 2*strings.Count(key, "strangers")); err != nil || n != want {
			t.Errorf("%s: %d members, %v; want %d", key, n, err, want)
		}
	}
	if n, err := r.c.Do(ctx, r.c.B().Exists().Key(r.knownKey(sc)).Build()).AsInt64(); err != nil || n != 1 {
		t.Errorf("the tenant's known marker after a commit: %d, %v; want set", n, err)
	}
	// The commit did not renew the sets' expiry: the claim's is past the
	// key's score.
	for _, key := range []string{r.tenantKey(sc), r.globalKeys()[0]} {
		if err := setOutlives(r, key, r.keys(sc).h); err != nil {
			t.Error(err)
		}
	}
}

// setOutlives returns an error unless the set key expires after member's
// score, by Redis's clock.
func setOutlives(r *Store, key, member string) error { return setOutlivesBy(r, key, member, 0) }

// setOutlivesBy returns an error unless the set key expires at least
// margin after member's score.
func setOutlivesBy(r *Store, key, member string, margin time.Duration) error {
	ctx := context.Background()
	score, err := r.c.Do(ctx, r.c.B().Zscore().Key(key).Member(member).Build()).AsFloat64()
	if err != nil {
		return fmt.Errorf("%s: score of %s: %w", key, member, err)
	}
	at, err := r.c.Do(ctx, r.c.B().Pexpiretime().Key(key).Build()).AsInt64()
	if err != nil {
		return fmt.Errorf("%s: PEXPIRETIME: %w", key, err)
	}
	if float64(at) < score+float64(margin.Milliseconds()) {
		return fmt.Errorf("%s expires at %d, less than %v after its member's score %.0f", key, at, margin, score)
	}
	return nil
}

// TestRedisLongGenerationRenewsSets: a generation that ends long after
// its claim renews its sets' expiry, which its claim's no longer covers:
// a set never expires before one of its members' scores.
func TestRedisLongGenerationRenewsSets(t *testing.T) {
	t.Parallel()
	// As if claimed age ago, the sets' expiry renewed renewed before the
	// claim: 20 minutes, renewed by the claim; 9.5 minutes, renewed by
	// the replica's claim a minute before (setRenewEvery). Either way the
	// end renews the sets, so that they outlive the key's new score by the
	// minute kept for a server clock that steps back.
	for _, c := range []struct {
		name         string
		age, renewed time.Duration
	}{{"20m", 20 * time.Minute, 0}, {"9.5m", 9*time.Minute + 30*time.Second, setRenewEvery}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			longGeneration(t, c.age, c.renewed)
		})
	}
}

func longGeneration(t *testing.T, age, renewed time.Duration) {
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "long", func(c *Config) { c.Lease = time.Minute })
	ctx := context.Background()
	sc := cache.Scope{Tenant: "t", Key: "long"}
	o := rbegin(t, r, sc, "fp").Flight.Backend().(*owner)
	o.shutdown() // its finish is sent below, as if by it
	k := r.keys(sc)
	old := time.Now().Add(-age)
	gen := strconv.FormatInt(old.UnixMilli(), 10)
	if err := r.c.Do(ctx, r.c.B().Hset().Key(k.st).FieldValue().FieldValue("gen", gen).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{r.tenantKey(sc), r.globalKeys()[0], r.globalKeys()[1]} {
		at := old.Add(-renewed + max(r.cfg.TTL, r.cfg.FailedTTL, r.cfg.LiveTTL) + setSlack).UnixMilli()
		if err := r.c.Do(ctx, r.c.B().Pexpireat().Key(key).MillisecondsTimestamp(at).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	a, err := parseWriteAnswer(run(ctx, r.c, finishScript, finishArgs{keys: r.finishKeys(sc, k, true),
		tok: o.tok, gen: gen, done: true, prev: gen + "-0", keep: r.cfg.TTL, state: cache.StateCommitted,
		now: time.Now(), mark: markFields{attempts: 1, status: 200}, end: r.countEnd(k, r.cfg.TTL, true, false, "")}))
	if err != nil || a.verdict != writeOK {
		t.Fatalf("finish: %v, %v; want ok", a, err)
	}
	for _, key := range []string{r.tenantKey(sc), r.globalKeys()[0]} {
		if err := setOutlivesBy(r, key, k.h, time.Minute); err != nil {
			t.Error(err)
		}
	}
}

// TestRedisStrangersLeaveAtCommit: a key counted as a stranger's leaves
// the strangers' set at its commit, also when its tenant became known
// between its claim and its commit.
func TestRedisStrangersLeaveAtCommit(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "strangers", func(c *Config) { c.Lease = time.Minute })
	ctx := context.Background()
	set := r.globalKeys()[1]
	in := func(sc cache.Scope) bool {
		t.Helper()
		err := r.c.Do(ctx, r.c.B().Zscore().Key(set).Member(r.keys(sc).h).Build()).Error()
		if err != nil && !rueidis.IsRedisNil(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	a, b := cache.Scope{Tenant: "s", Key: "a"}, cache.Scope{Tenant: "s", Key: "b"}
	fa, fb := rbegin(t, r, a, "fp").Flight, rbegin(t, r, b, "fp").Flight
	for _, sc := range []cache.Scope{a, b} {
		if !in(sc) {
			t.Fatalf("%v, a stranger's key: not in the strangers' set", sc)
		}
	}
	for _, f := range []*cache.Flight{fa, fb} {
		storetest.StartStream(t, f)
		if !f.Commit(nil) {
			t.Fatal("Commit: got false")
		}
	}
	for _, sc := range []cache.Scope{a, b} {
		if in(sc) {
			t.Errorf("%v: still in the strangers' set after its tenant's commits", sc)
		}
	}
}

// storeCmds is how many commands the server ran, inner ones included,
// less INFO, a replica's polls of its inbox (BLPOP, LPOP), which come
// whenever they time out, and the client's PINGs of idle connections.
func storeCmds(tb testing.TB, addr string) int64 {
	tb.Helper()
	stats, err := redistest.Command(addr, 5*time.Second, "INFO", "commandstats")
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	var n int64
	for _, l := range strings.Split(stats, "\n") {
		name, rest, _ := strings.Cut(strings.TrimSpace(l), ":")
		cmd, ok := strings.CutPrefix(name, "cmdstat_")
		// INFO is the test's, the rest the client's own: the inbox's polls, its
		// health checks and the handshake of a connection it opens meanwhile.
		if !ok || cmd == "info" || cmd == "blpop" || cmd == "lpop" || cmd == "ping" || cmd == "hello" || strings.HasPrefix(cmd, "client") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		c, _ := strconv.ParseInt(calls, 10, 64)
		n += c
	}
	return n
}

// TestRedisScrapeReads: counting the keys in commit_unknown for a scrape
// writes nothing (an expired member stays for the next end to remove)
// and does not count as a store operation that failed when Redis is gone.
func TestRedisScrapeReads(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "scrape", nil)
	ctx := context.Background()
	key := r.globalKeys()[2]
	if err := r.c.Do(ctx, r.c.B().Zadd().Key(key).ScoreMember().ScoreMember(1, "expired").ScoreMember(1e15, "held").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if n, err := r.UnknownKeys(); err != nil || n != 1 {
		t.Fatalf("UnknownKeys: got %d, %v; want 1", n, err)
	}
	if n, err := r.c.Do(ctx, r.c.B().Zcard().Key(key).Build()).AsInt64(); err != nil || n != 2 {
		t.Fatalf("the set after a scrape: %d members, %v; want both still there", n, err)
	}
	srv.Stop()
	if _, err := r.UnknownKeys(); !errors.Is(err, cache.ErrUnavailable) {
		t.Fatalf("UnknownKeys with Redis gone: got %v; want ErrUnavailable", err)
	}
	if n := r.Stats().Unavailable; n != 0 {
		t.Fatalf("unavailable operations after a failed scrape: got %d; want 0", n)
	}
}

// TestRedisCountPrunes: one count in 8, chosen by the key's hash, takes
// expired members out of its sets, a bounded number at a time, so that
// the sets hold about their unexpired keys, with bounds far away or none
// (a set pruned only when full grew to its bound and then had one claim
// remove it all, stalling Redis); the other counts leave them.
func TestRedisCountPrunes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "prune", func(c *Config) { c.MaxKeysPerTenant = -1 })
	ctx := context.Background()
	keep, pruning := keysThatPrune(r, "t", 1, false), keysThatPrune(r, "t", 4, true)
	sets := []string{r.globalKeys()[0], r.globalKeys()[1], r.tenantKey(keep[0])}
	for _, key := range sets {
		for i := range 200 {
			if err := r.c.Do(ctx, r.c.B().Zadd().Key(key).ScoreMember().ScoreMember(1, fmt.Sprint("expired-", i)).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	card := func(key string) int64 {
		t.Helper()
		n, err := r.c.Do(ctx, r.c.B().Zcard().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	rbegin(t, r, keep[0], "fp")
	for _, key := range sets {
		if got, want := card(key), int64(200+1); got != want {
			t.Errorf("%s after a count that does not prune: %d members; want %d (none removed)", key, got, want)
		}
	}
	rbegin(t, r, pruning[0], "fp")
	for _, key := range sets {
		if got, want := card(key), int64(200-64+2); got != want {
			t.Errorf("%s after a count that prunes: %d members; want %d (64 expired removed)", key, got, want)
		}
	}
	for _, sc := range pruning[1:] {
		rbegin(t, r, sc, "fp")
	}
	for _, key := range sets {
		if got := card(key); got != 5 {
			t.Errorf("%s after four counts that prune: %d members; want the 5 live keys", key, got)
		}
	}
}

// keysThatPrune returns n scopes of tenant whose count prunes (or, with
// prune false, does not): countLua's pruning() of their hash.
func keysThatPrune(r *Store, tenant string, n int, prune bool) []cache.Scope {
	var out []cache.Scope
	for i := 0; len(out) < n; i++ {
		sc := cache.Scope{Tenant: tenant, Key: fmt.Sprint("key-", prune, "-", i)}
		if h := r.keys(sc).h; (h[len(h)-1]%8 == 0) == prune {
			out = append(out, sc)
		}
	}
	return out
}

// TestRedisBoundsWithoutPrune: a count that does not prune still refuses
// a key only when the set holds its bound of unexpired keys: a set at its
// bound with expired members removes them all, then takes the key; at its
// bound of unexpired keys it refuses a new key, writing nothing, but takes
// a key it already counts (whose records are gone); and it never holds
// more than its bound. So for each of the tenant's, all keys' and
// strangers' sets.
func TestRedisBoundsWithoutPrune(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := context.Background()
	const bound = 3
	for _, tt := range []struct {
		name string
		mod  func(*Config)
		set  func(*Store, cache.Scope) string
		err  error
	}{
		{"tenant", func(c *Config) { c.MaxKeysPerTenant = bound }, (*Store).tenantKey, cache.ErrTenantFull},
		{"all", func(c *Config) { c.MaxKeys, c.MaxStrangerKeys = bound, 100 }, func(r *Store, _ cache.Scope) string { return r.globalKeys()[0] }, cache.ErrStoreFull},
		{"strangers", func(c *Config) { c.MaxStrangerKeys = bound }, func(r *Store, _ cache.Scope) string { return r.globalKeys()[1] }, cache.ErrStoreFull},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRedis(t, srv.Addr, "bound-"+tt.name, tt.mod)
			ks := keysThatPrune(r, "t", 3, false)
			set := tt.set(r, ks[0])
			zadd := func(score float64, member string) {
				t.Helper()
				if err := r.c.Do(ctx, r.c.B().Zadd().Key(set).ScoreMember().ScoreMember(score, member).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			card := func() int64 {
				t.Helper()
				n, err := r.c.Do(ctx, r.c.B().Zcard().Key(set).Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			for i := range bound {
				zadd(1, fmt.Sprint("expired-", i))
			}
			if b := rbegin(t, r, ks[0], "fp"); b.Decision != cache.Miss {
				t.Fatalf("a new key, the set at its bound of expired keys: got %v; want miss", b.Decision)
			}
			if n := card(); n != 1 {
				t.Fatalf("the set after it: %d members; want 1 (the expired all removed)", n)
			}
			// Two more unexpired: one a key counted whose records are gone.
			ghost := cache.Scope{Tenant: "t", Key: "ghost"}
			zadd(1e15, r.keys(ghost).h)
			zadd(1e15, "live")
			zadd(1, "expired")
			if _, err := r.Begin(ks[1], "fp"); !errors.Is(err, tt.err) {
				t.Fatalf("a new key, the set at its bound of unexpired keys: got %v; want %v", err, tt.err)
			}
			if n := card(); n != bound {
				t.Fatalf("the set after a refusal: %d members; want %d", n, bound)
			}
			if b := rbegin(t, r, ghost, "fp"); b.Decision != cache.Miss {
				t.Fatalf("a key the full set counts already: got %v; want miss", b.Decision)
			}
			if n := card(); n != bound {
				t.Fatalf("the set after the counted key's claim: %d members; want %d", n, bound)
			}
		})
	}
}

// TestRedisClaimFresh: a claim tells its finish whether it counted a key
// with no record (a known tenant's, or a stranger's) or a key the ledger
// held, and the finish of a fresh key leaves the sets it was not in alone
// (an earlier generation's member left there is past its score).
func TestRedisClaimFresh(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "fresh", func(c *Config) { c.Lease = time.Minute })
	ctx := context.Background()
	fresh := func(f *cache.Flight) string { return f.Backend().(*owner).fresh }
	stranger := rbegin(t, r, cache.Scope{Tenant: "t", Key: "first"}, "fp").Flight
	if got := fresh(stranger); got != "2" {
		t.Errorf("a stranger's new key: fresh %q; want 2", got)
	}
	storetest.StartStream(t, stranger)
	stranger.Commit(nil)
	// An earlier generation of the next key left members in the strangers'
	// and the commit_unknown keys' sets, their scores past.
	sc := cache.Scope{Tenant: "t", Key: "next"}
	past := float64(time.Now().Add(-time.Second).UnixMilli())
	for _, set := range r.globalKeys()[1:] {
		if err := r.c.Do(ctx, r.c.B().Zadd().Key(set).ScoreMember().ScoreMember(past, r.keys(sc).h).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	f := rbegin(t, r, sc, "fp").Flight
	if got := fresh(f); got != "1" {
		t.Errorf("a known tenant's new key: fresh %q; want 1", got)
	}
	storetest.StartStream(t, f)
	if !f.Commit(nil) {
		t.Fatal("Commit: got false")
	}
	for _, set := range r.globalKeys()[1:] {
		if err := r.c.Do(ctx, r.c.B().Zscore().Key(set).Member(r.keys(sc).h).Build()).Error(); err != nil {
			t.Errorf("%s: the earlier generation's member: %v; want it left to the pruning, not looked for", set, err)
		}
	}
	// A key the ledger holds, claimed again, is not fresh.
	failed := cache.Scope{Tenant: "t", Key: "failed"}
	g := rbegin(t, r, failed, "fp").Flight
	storetest.StartStream(t, g)
	g.Fail(cache.StateFailedRetryable, "test", nil)
	waitDone(t, g, 5*time.Second)
	again := rbegin(t, r, failed, "fp").Flight
	if again == nil {
		t.Fatal("a failed key claimed again: not a miss")
	}
	if got := fresh(again); got != "0" {
		t.Errorf("a failed key claimed again: fresh %q; want 0", got)
	}
	again.Fail(cache.StateFailedRetryable, "test", nil)
}

// TestRedisSetRenewals: a replica's claims renew the expiry of the sets
// they count in once every setRenewEvery, not each; a set found empty is
// renewed whatever (the ZADD made it anew, with no expiry), and one whose
// last renewal is older than setRenewEvery is renewed again.
func TestRedisSetRenewals(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "renewals", func(c *Config) { c.Lease = time.Minute })
	ctx := context.Background()
	sets := []string{r.tenantKey(cache.Scope{Tenant: "t"}), r.globalKeys()[0]}
	pttl := func(set string) time.Duration {
		t.Helper()
		n, err := r.c.Do(ctx, r.c.B().Pttl().Key(set).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(n) * time.Millisecond
	}
	shorten := func() {
		t.Helper()
		for _, set := range sets {
			if err := r.c.Do(ctx, r.c.B().Pexpire().Key(set).Milliseconds(100_000).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	full, _ := strconv.ParseInt(r.setTTL(), 10, 64)
	renewedAll := func(what string, want bool) {
		t.Helper()
		for _, set := range sets {
			left := pttl(set)
			if got := left > 200*time.Second; got != want {
				t.Errorf("%s: %s expires in %v; renewed %v, want %v (to %v)", what, set, left, got, want, time.Duration(full)*time.Millisecond)
			}
		}
	}
	claim := func(key string) {
		t.Helper()
		f := rbegin(t, r, cache.Scope{Tenant: "t", Key: key}, "fp").Flight
		if f == nil {
			t.Fatalf("%s: not a miss", key)
		}
		f.Fail(cache.StateFailedRetryable, "test", nil)
		waitDone(t, f, 5*time.Second)
	}
	claim("a")
	renewedAll("the first claim", true)
	strangers := r.globalKeys()[1]
	if left := pttl(strangers); left < 200*time.Second {
		t.Errorf("a stranger's first key: the strangers' set expires in %v; want renewed", left)
	}
	r.setRenewals.mu.Lock()
	_, remembered := r.setRenewals.last[strangers]
	r.setRenewals.mu.Unlock()
	if !remembered {
		t.Error("a stranger's key renewed the strangers' set: not remembered")
	}
	shorten()
	was := time.Now().Add(-50 * time.Second)
	r.setRenewals.mu.Lock()
	for set := range r.setRenewals.last {
		r.setRenewals.last[set] = was
	}
	r.setRenewals.mu.Unlock()
	claim("b")
	renewedAll("a claim within setRenewEvery of the last renewal", false)
	r.setRenewals.mu.Lock()
	for set, at := range r.setRenewals.last {
		if !at.Equal(was) {
			t.Errorf("%s: a claim that did not renew it moved its renewal to %v", set, at)
		}
	}
	r.setRenewals.mu.Unlock()
	// The sets emptied (their last members went) are made anew by the
	// next ZADD: that claim renews them.
	for _, set := range sets {
		if err := r.c.Do(ctx, r.c.B().Del().Key(set).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	claim("c")
	renewedAll("a claim that found the sets empty", true)
	// The last renewal setRenewEvery ago: the next claim renews.
	shorten()
	r.setRenewals.mu.Lock()
	for set := range r.setRenewals.last {
		r.setRenewals.last[set] = time.Now().Add(-setRenewEvery)
	}
	r.setRenewals.mu.Unlock()
	claim("d")
	renewedAll("a claim setRenewEvery after the last renewal", true)
}

// TestSetRenewalsBounded: a replica remembers at most maxRenewedSets
// sets; past it, those it forgot or could not take are renewed at each
// claim, and the renewals older than setRenewEvery make room.
func TestSetRenewalsBounded(t *testing.T) {
	t.Parallel()
	var s setRenewals
	t0 := time.Now()
	for i := range maxRenewedSets {
		s.renewed(t0, "set"+strconv.Itoa(i))
	}
	if got := s.flags(t0.Add(time.Second), "set0", "new"); got != "01" {
		t.Errorf("flags at the bound: %q; want 01", got)
	}
	s.renewed(t0.Add(time.Second), "new")
	if got := s.flags(t0.Add(2*time.Second), "new"); got != "1" {
		t.Errorf("a set renewed with the memory full: %q; want 1 (not remembered)", got)
	}
	// The sweep at the bound, which dropped nothing at t0+1s, runs again
	// setRenewEvery later.
	s.renewed(t0.Add(setRenewEvery), "new")
	if n := len(s.last); n != maxRenewedSets {
		t.Errorf("a sweep within setRenewEvery of the last: %d sets remembered; want %d", n, maxRenewedSets)
	}
	s.renewed(t0.Add(setRenewEvery+time.Second), "new")
	if n := len(s.last); n != 1 {
		t.Errorf("after setRenewEvery: %d sets remembered; want 1", n)
	}
	if got := s.flags(t0.Add(setRenewEvery+2*time.Second), "new", "set0"); got != "01" {
		t.Errorf("flags after the sweep: %q; want 01", got)
	}
}

// TestRedisAccountEnds: with Redis, a key's end sets its expiry in the
// set of each account after its first, as in its first's, on a
// standalone Redis (whose finish script ends the first's count itself)
// and where each count is a script of its own: a failed key stops
// counting against every account once FailedTTL passes, so the full
// account takes a new key then, and a committed key counts for TTL.
func TestRedisAccountEnds(t *testing.T) {
	const failedTTL = 700 * time.Millisecond
	addr := redistest.Shared(t)
	r := newRedis(t, addr, redistest.Prefix(t), func(c *Config) { c.FailedTTL, c.MaxKeysPerTenant = failedTTL, 2 })
	score := func(account string, sc cache.Scope) time.Duration {
		t.Helper()
		ms, err := r.c.Do(context.Background(), r.c.B().Zscore().Key(r.accountKey(account)).Member(r.keys(sc).h).Build()).AsFloat64()
		if err != nil {
			t.Fatalf("score of %v in %s's set: %v", sc, account, err)
		}
		return time.Until(time.UnixMilli(int64(ms)))
	}
	failed := cache.Scope{Tenant: "t1", Key: "failed", Accounts: []string{"m1", "real"}}
	done := cache.Scope{Tenant: "t2", Key: "done", Accounts: []string{"m2", "real"}}
	rbegin(t, r, failed, "fp").Flight.Fail(cache.StateFailedRetryable, "upstream reset", nil)
	f := rbegin(t, r, done, "fp").Flight
	storetest.StartStream(t, f)
	storetest.AppendN(t, f, 1, 3)
	if !f.Commit(nil) {
		t.Fatal("commit: got not stored; want stored")
	}
	if d := score("real", failed); d > failedTTL {
		t.Errorf("failed key in its second account's set: expires in %v; want within FailedTTL %v", d, failedTTL)
	}
	if d := score("real", done); d < r.cfg.TTL-time.Minute {
		t.Errorf("committed key in its second account's set: expires in %v; want about TTL %v", d, r.cfg.TTL)
	}
	next := cache.Scope{Tenant: "t3", Key: "next", Accounts: []string{"real"}}
	if _, err := r.Begin(next, "fp"); !errors.Is(err, cache.ErrTenantFull) {
		t.Fatalf("Begin(%v) while the account holds 2 keys: got %v; want ErrTenantFull", next, err)
	}
	eventually(t, failedTTL+2*time.Second, func() error {
		b, err := r.Begin(next, "fp")
		if err != nil {
			return err
		}
		b.Flight.Fail(cache.StateFailedRetryable, "test", nil)
		return nil
	})
}
