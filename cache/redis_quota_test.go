package cache

import (
	"context"
	"errors"
	"fmt"
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
	maxKeysPerTenant(t, func(mod func(*RedisConfig)) *Redis { return newRedis(t, addr, prefix, mod) })
}

// maxKeysPerTenant is TestRedisMaxKeysPerTenant on the replicas store
// makes, with a FailedTTL and a bound of its own.
func maxKeysPerTenant(t *testing.T, store func(mod func(*RedisConfig)) *Redis) {
	const failedTTL = 700 * time.Millisecond
	mod := func(c *RedisConfig) { c.FailedTTL, c.MaxKeysPerTenant = failedTTL, 3 }
	rs := []*Redis{store(mod), store(mod)}
	a := func(k string) Scope { return Scope{Tenant: "a", Key: k} }
	refused := func(r *Redis, sc Scope) {
		t.Helper()
		_, err := r.Begin(sc, "fp")
		if !errors.Is(err, ErrTenantFull) || errors.Is(err, ErrStoreFull) || errors.Is(err, ErrUnavailable) {
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
	startStream(t, done)
	appendN(t, done, 1, 3)
	if !done.Commit(nil) {
		t.Fatal("commit: got not stored; want stored")
	}
	live := rbegin(t, rs[1], a("live"), "fp").Flight
	startStream(t, live)
	rbegin(t, rs[0], a("failed"), "fp").Flight.Fail(StateFailedRetryable, "upstream reset", nil)
	refused(rs[0], a("new"))
	refused(rs[1], a("new"))
	if n := counted(); n != 3 {
		t.Errorf("tenant's set: got %d members; want 3", n)
	}

	for _, tt := range []struct {
		key, fp string
		want    Decision
	}{
		{"done", "fp", Hit}, {"live", "fp", Join}, {"done", "other", Conflict}, {"failed", "fp", Miss},
	} {
		for i, r := range rs {
			b := rbegin(t, r, a(tt.key), tt.fp)
			if b.Decision != tt.want {
				t.Errorf("replica %d, Begin of the full tenant's known key %q (%s): got %v; want %v", i, tt.key, tt.fp, b.Decision, tt.want)
			}
			if b.Decision == Miss {
				b.Flight.Fail(StateFailedRetryable, "upstream reset", nil)
			}
		}
	}
	other := rbegin(t, rs[1], Scope{Tenant: "b", Key: "new"}, "fp")
	if other.Decision != Miss {
		t.Errorf("another tenant's new key: got %v; want miss", other.Decision)
	}
	other.Flight.Fail(StateFailedRetryable, "test", nil)

	// The failed key stops counting once its records expire; the reaped
	// generation of a dead owner counts for FailedTTL as well.
	eventually(t, failedTTL+time.Second, uncounted(rs[0], a("failed")))
	nf := rbegin(t, rs[1], a("new"), "fp")
	if nf.Decision != Miss {
		t.Fatalf("a new key after the failed one expired: got %v; want miss", nf.Decision)
	}
	refused(rs[0], a("new2"))
	j := rbegin(t, rs[0], a("live"), "fp") // a follower, on the other replica
	if j.Decision != Join {
		t.Fatalf("Begin of the live key: got %v; want join", j.Decision)
	}
	live.be.(*owner).shutdown() // the owner's process is gone: the follower reaps
	if st := waitDone(t, j.Flight, 3*testLease); st != StateCommitUnknown {
		t.Fatalf("follower of the dead owner: got %v; want commit_unknown", st)
	}
	refused(rs[0], a("new2"))
	eventually(t, failedTTL+time.Second, uncounted(rs[0], a("live")))
	b := rbegin(t, rs[0], a("new2"), "fp")
	if b.Decision != Miss {
		t.Fatalf("a new key after the reaped one expired: got %v; want miss", b.Decision)
	}
	b.Flight.Fail(StateFailedRetryable, "test", nil)
	nf.Flight.Fail(StateFailedRetryable, "test", nil)
}

// uncounted returns a condition for eventually: sc's key no longer counts
// against its tenant, its member of the tenant's set having a score (the
// key's expiry) that Redis's clock has passed, as quotaScript reads it.
func uncounted(r *Redis, sc Scope) func() error {
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

// TestRedisCountInScripts: on a standalone Redis a new key is counted by
// its claim and its count ended by its commit: one script call each, where
// the count took scripts of its own (three more at the claim, two at the
// commit). The count is the same: the key counts against its tenant and
// the whole while live, then for TTL after its commit, its tenant known.
func TestRedisCountInScripts(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "count", func(c *RedisConfig) { c.Lease = time.Minute })
	// A first stream loads the scripts (EVALSHA, then EVAL once).
	warm := rbegin(t, r, Scope{Tenant: "t", Key: "warm"}, "fp").Flight
	startStream(t, warm)
	warm.Commit(nil)
	sc := Scope{Tenant: "t", Key: "k"}
	before := readRedisCost(t, srv.Addr)
	f := rbegin(t, r, sc, "fp").Flight
	if n := readRedisCost(t, srv.Addr).scripts - before.scripts; n != 1 {
		t.Errorf("the claim of a new key: %d script calls; want 1", n)
	}
	if got := tenantScore(t, r, sc); got < 59*time.Minute || got > time.Hour {
		t.Errorf("a live key counts for its tenant %v more; want LiveTTL (1h)", got)
	}
	startStream(t, f)
	appendN(t, f, 1, 20)
	before = readRedisCost(t, srv.Addr)
	if !f.Commit(nil) {
		t.Fatal("Commit: got false")
	}
	if n := readRedisCost(t, srv.Addr).scripts - before.scripts; n != 1 {
		t.Errorf("the commit: %d script calls; want 1", n)
	}
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
	if _, err := r.UnknownKeys(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("UnknownKeys with Redis gone: got %v; want ErrUnavailable", err)
	}
	if n := r.Stats().Unavailable; n != 0 {
		t.Fatalf("unavailable operations after a failed scrape: got %d; want 0", n)
	}
}
