package redis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"github.com/ssegate/ssegate/cache/internal/wiretest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/redistest"
)

// TestRedisFencing: an owner whose lease was lost and whose key another
// replica claimed can neither append nor commit; its flight fails, so its
// own clients get stream_aborted, and the new owner's result stands.
func TestRedisFencing(t *testing.T) {
	t.Parallel()
	t.Run("commit", func(t *testing.T) {
		rs := replicas(t, 2)
		sc := cache.Scope{Tenant: "t", Key: "fence-commit"}
		a := rbegin(t, rs[0], sc, "fp").Flight
		storetest.StartStream(t, a)
		storetest.AppendN(t, a, 1, 5)
		expireLease(t, rs[0], sc)
		b := rbegin(t, rs[1], sc, "fp")
		if b.Decision != cache.Miss || b.Flight.Gen <= a.Gen {
			t.Fatalf("claim after the lease expired: got %v gen %d; want a miss with a newer generation than %d", b.Decision, b.Flight.Gen, a.Gen)
		}
		// This append may land before the fence is noticed (never in Redis),
		// or find the flight already failed by it.
		if _, err := a.Append("", "6"); err != nil && !errors.Is(err, cache.ErrEnded) {
			t.Fatalf("stale owner's Append: got %v; want none or ErrEnded", err)
		}
		if a.Commit(nil) {
			t.Fatal("stale owner's Commit: got true; want it refused")
		}
		if state, reason, _ := a.Outcome(); state == cache.StateCommitted || reason != "generation_lost" {
			t.Fatalf("stale owner: got %v (%s); want a failure with generation_lost", state, reason)
		}
		storetest.StartStream(t, b.Flight)
		want := storetest.AppendN(t, b.Flight, 1, 3)
		if !b.Flight.Commit(nil) {
			t.Fatal("new owner's Commit: got false; want true")
		}
		if r := rbegin(t, rs[0], sc, "fp"); r.Decision != cache.Hit || !bytes.Equal(r.Result.Data, want) {
			t.Fatalf("replay: got %v; want the new owner's result", r.Decision)
		}
		if n := commits(t, rs[0], sc); n != 1 {
			t.Fatalf("commits: got %d; want 1", n)
		}
	})
	t.Run("append", func(t *testing.T) {
		rs := replicas(t, 2)
		sc := cache.Scope{Tenant: "t", Key: "fence-append"}
		a := rbegin(t, rs[0], sc, "fp").Flight
		storetest.StartStream(t, a)
		sub, _ := a.Subscribe(0)
		storetest.AppendN(t, a, 1, 5)
		expireLease(t, rs[0], sc)
		if b := rbegin(t, rs[1], sc, "fp"); b.Decision != cache.Miss {
			t.Fatalf("claim after the lease expired: got %v; want miss", b.Decision)
		}
		// The stale owner learns of it from its next batch or renewal,
		// without committing anything.
		if _, err := a.Append("", "6"); err != nil && !errors.Is(err, cache.ErrEnded) {
			t.Fatalf("stale owner's Append: got %v; want none or ErrEnded", err)
		}
		if state := waitDone(t, a, 2*testLease); state != cache.StateCommitUnknown {
			t.Fatalf("stale owner: state %v; want commit_unknown", state)
		}
		if _, ended := wiretest.Follow(sub, time.Second); !ended {
			t.Fatal("stale owner's client: stream did not end")
		}
		if rs[0].Stats().Fenced != 1 {
			t.Fatalf("fenced: got %d; want 1", rs[0].Stats().Fenced)
		}
	})
	t.Run("pause without reap", func(t *testing.T) {
		rs := replicas(t, 1)
		sc := cache.Scope{Tenant: "t", Key: "fence-none"}
		a := rbegin(t, rs[0], sc, "fp").Flight
		storetest.StartStream(t, a)
		expireLease(t, rs[0], sc)
		// The renewal sets the lease again: nobody took over.
		lease := rs[0].keys(sc).lease
		eventually(t, testLease, func() error {
			n, err := rs[0].c.Do(context.Background(), rs[0].c.B().Exists().Key(lease).Build()).AsInt64()
			if err != nil || n != 1 {
				return fmt.Errorf("lease of the paused owner: not set again within a lease (%d, %v)", n, err)
			}
			return nil
		})
		storetest.AppendN(t, a, 1, 3)
		if !a.Commit(nil) {
			t.Fatal("Commit: got false; want true (no other replica claimed the key)")
		}
	})
}

// expireLease deletes a generation's lease, as its expiry would.
func expireLease(tb testing.TB, r *Store, sc cache.Scope) {
	tb.Helper()
	if err := r.c.Do(context.Background(), r.c.B().Del().Key(r.keys(sc).lease).Build()).Error(); err != nil {
		tb.Fatal(err)
	}
}

// redisReads returns how many reads from its clients the server at addr
// processed (INFO stats).
func redisReads(tb testing.TB, addr string) int64 {
	tb.Helper()
	info, err := redistest.Command(addr, 5*time.Second, "INFO", "stats")
	if err != nil {
		tb.Fatalf("INFO stats: %v", err)
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "total_reads_processed:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				tb.Fatalf("INFO stats: %q", l)
			}
			return n
		}
	}
	tb.Fatal("INFO stats: no total_reads_processed")
	return 0
}

// TestRedisRenewalsTogether: the leases of a replica's generations,
// claimed at different times, are renewed together, so that Redis reads
// many renewals at once rather than each on its own (a read, a wake-up and
// a reply write each, which cost Redis more than the renewal script); and
// every generation stays owned meanwhile.
func TestRedisRenewalsTogether(t *testing.T) {
	t.Parallel()
	const lease, owners = 600 * time.Millisecond, 32
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "renew", func(c *Config) { c.Lease = lease })
	var fs []*cache.Flight
	for i := range owners {
		f := rbegin(t, r, cache.Scope{Tenant: "t", Key: strconv.Itoa(i)}, "fp").Flight
		storetest.StartStream(t, f)
		fs = append(fs, f)
		time.Sleep(5 * time.Millisecond) // claims apart: renewals timed by each claim would be reads apart
	}
	reads0, renewals0 := redisReads(t, srv.Addr), r.Stats().Renewals
	time.Sleep(4 * lease)
	reads, renewals := redisReads(t, srv.Addr)-reads0, r.Stats().Renewals-renewals0
	if renewals < owners*4 {
		t.Fatalf("%d renewals of %d generations in four leases; want at least 4 each", renewals, owners)
	}
	if reads*4 > renewals {
		t.Errorf("Redis took %d renewals in %d reads; want at least 4 renewals a read", renewals, reads)
	}
	for i, f := range fs {
		select {
		case <-f.Done():
			t.Fatalf("generation %d ended while renewed: %v", i, waitDone(t, f, 0))
		default:
		}
		f.Fail(cache.StateFailedRetryable, "test over", nil)
	}
}
