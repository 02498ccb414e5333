package cache

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
	const failedTTL = 700 * time.Millisecond
	addr, prefix := redistest.Shared(t), redistest.Prefix(t)
	mod := func(c *RedisConfig) { c.FailedTTL, c.MaxKeysPerTenant = failedTTL, 3 }
	rs := []*Redis{newRedis(t, addr, prefix, mod), newRedis(t, addr, prefix, mod)}
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
