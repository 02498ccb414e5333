package cache

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/redistest"
)

// TestAccountBounds: a key counts against every account of its scope,
// first or not, and is refused while any of them holds
// MaxKeysPerTenant keys, whatever its tenant: the same credential value
// ("real") behind four tenants is held to 2 keys; a key of another
// account is not refused; a known key of the full account is decided as
// usual; forgetting a key gives its place back in every account.
func TestAccountBounds(t *testing.T) {
	bothStores(t, 100, accountLimits, accountBounds)
}

// accountLimits are the bounds of accountBounds.
var accountLimits = Limits{MaxKeysPerTenant: 2, MaxStrangerKeys: 100}

func accountBounds(t *testing.T, s ledger) {
	{
		full := func(sc Scope) {
			t.Helper()
			if _, err := s.Begin(sc, "fp"); !errors.Is(err, ErrTenantFull) {
				t.Fatalf("Begin(%v): got %v; want ErrTenantFull", sc, err)
			}
		}
		x1 := Scope{Tenant: "t1", Key: "k", Accounts: []string{"real", "m1"}}
		x2 := Scope{Tenant: "t2", Key: "k", Accounts: []string{"m2", "real"}}
		miss(t, s, x1).Fail(StateFailedRetryable, "test", nil)
		f := miss(t, s, x2)
		startStream(t, f)
		appendN(t, f, 1, 3)
		if !f.Commit(nil) {
			t.Fatal("commit: got not stored; want stored")
		}
		full(Scope{Tenant: "t3", Key: "k", Accounts: []string{"real"}})
		full(Scope{Tenant: "t4", Key: "k", Accounts: []string{"m4", "real"}})
		full(Scope{Tenant: "t4", Key: "k", Accounts: []string{"m4", "m5", "real"}})
		miss(t, s, Scope{Tenant: "t5", Key: "k", Accounts: []string{"m5", "m1"}}).Fail(StateFailedRetryable, "test", nil)
		if b, err := s.Begin(x2, "fp"); err != nil || b.Decision != Hit {
			t.Fatalf("Begin of the full account's committed key: got %v, %v; want a hit", b.Decision, err)
		}
		miss(t, s, x1).Fail(StateFailedRetryable, "test", nil) // a known key starts again
		if err := s.(interface{ Forget(Scope) error }).Forget(x1); err != nil {
			t.Fatalf("Forget: %v", err)
		}
		miss(t, s, Scope{Tenant: "t4", Key: "k", Accounts: []string{"m4", "real"}}).Fail(StateFailedRetryable, "test", nil)
		full(Scope{Tenant: "t3", Key: "k", Accounts: []string{"real"}})
		if m, ok := s.(*Memory); ok {
			checkLedger(t, m)
		}
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
	r := newRedis(t, addr, redistest.Prefix(t), func(c *RedisConfig) { c.FailedTTL, c.MaxKeysPerTenant = failedTTL, 2 })
	score := func(account string, sc Scope) time.Duration {
		t.Helper()
		ms, err := r.c.Do(context.Background(), r.c.B().Zscore().Key(r.accountKey(account)).Member(r.keys(sc).h).Build()).AsFloat64()
		if err != nil {
			t.Fatalf("score of %v in %s's set: %v", sc, account, err)
		}
		return time.Until(time.UnixMilli(int64(ms)))
	}
	failed := Scope{Tenant: "t1", Key: "failed", Accounts: []string{"m1", "real"}}
	done := Scope{Tenant: "t2", Key: "done", Accounts: []string{"m2", "real"}}
	rbegin(t, r, failed, "fp").Flight.Fail(StateFailedRetryable, "upstream reset", nil)
	f := rbegin(t, r, done, "fp").Flight
	startStream(t, f)
	appendN(t, f, 1, 3)
	if !f.Commit(nil) {
		t.Fatal("commit: got not stored; want stored")
	}
	if d := score("real", failed); d > failedTTL {
		t.Errorf("failed key in its second account's set: expires in %v; want within FailedTTL %v", d, failedTTL)
	}
	if d := score("real", done); d < r.cfg.TTL-time.Minute {
		t.Errorf("committed key in its second account's set: expires in %v; want about TTL %v", d, r.cfg.TTL)
	}
	next := Scope{Tenant: "t3", Key: "next", Accounts: []string{"real"}}
	if _, err := r.Begin(next, "fp"); !errors.Is(err, ErrTenantFull) {
		t.Fatalf("Begin(%v) while the account holds 2 keys: got %v; want ErrTenantFull", next, err)
	}
	eventually(t, failedTTL+2*time.Second, func() error {
		b, err := r.Begin(next, "fp")
		if err != nil {
			return err
		}
		b.Flight.Fail(StateFailedRetryable, "test", nil)
		return nil
	})
}
