package cache

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTenantsDoNotStarve: with one tenant at its key bound and the ledger
// near full, another tenant's hits are as fast while the full tenant
// keeps trying new keys, or while a third replays a large result, as
// while the same load runs on another store (p99 within 2x); the other
// tenant's new keys are taken and the full tenant's refused with
// ErrTenantFull.
//
// The baseline is a load of the same CPU cost that shares nothing with
// the measured store, rather than no load at all: with a core to spare,
// the hits' own wake-ups of the runtime make an idle p99 several times a
// loaded one on a small machine, and a comparison with it would miss
// what it is meant to catch. What it catches: a ledger whose refusals
// hold its lock exclusively makes a hit that meets one park, and on two
// cores the wake-up takes tens of microseconds (a p99 of 80-120µs, 2-4µs
// against the other store); one that sweeps every key under its lock at
// the bound, or decodes results under it, makes them wait milliseconds.
//
// It measures latency, so it runs alone (not in parallel), with the
// collector held off while it measures, and needs two cores: the load
// runs on one while the hits run on the other.
func TestTenantsDoNotStarve(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs GOMAXPROCS >= 2: the load and the hits each take a core")
	}
	const hits = 2000
	start := time.Now()
	m, hitSc, bigSc := starveLedger(t)
	twin, _, _ := starveLedger(t) // the baseline load's store
	t.Logf("two ledgers of %d keys built in %v", m.Stats().Keys, time.Since(start).Round(time.Millisecond))

	// p99 measures the other tenant's hits, one each 25µs after the last
	// returned (time.Sleep is too coarse for that), about 60 ms in all:
	// their share that lands while the load holds what they need is the
	// share of the time it holds it.
	p99 := func() time.Duration {
		lat := make([]time.Duration, hits)
		for i := range lat {
			spin(25 * time.Microsecond)
			t0 := time.Now()
			b, err := m.Begin(hitSc, "fp")
			lat[i] = time.Since(t0)
			if err != nil || b.Decision != Hit {
				t.Fatalf("Begin of the other tenant's committed key: got %v, %v; want a hit", b.Decision, err)
			}
		}
		slices.Sort(lat)
		return lat[hits*99/100]
	}

	loads := []struct {
		name string
		op   func(s *Memory, i int) error
	}{
		{"the full tenant's new keys", func(s *Memory, i int) error {
			b, err := s.Begin(Scope{Tenant: "full", Key: "new-" + strconv.Itoa(i)}, "fp")
			if errors.Is(err, ErrTenantFull) {
				return nil
			}
			if err == nil && b.Flight != nil {
				b.Flight.Fail(StateFailedRetryable, "test", nil)
			}
			return fmt.Errorf("Begin of a new key of the full tenant: got %v, %v; want ErrTenantFull", b.Decision, err)
		}},
		{"replays of a large result", func(s *Memory, _ int) error {
			b, err := s.Begin(bigSc, "fp")
			if err != nil || b.Decision != Hit {
				return fmt.Errorf("Begin of the large result: got %v, %v; want a hit", b.Decision, err)
			}
			return nil
		}},
	}
	// under runs op on s, 10µs apart, on a goroutine of its own, while
	// the hits are measured.
	under := func(s *Memory, op func(*Memory, int) error, from int) (p time.Duration, ops int, err error) {
		runtime.GC()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for n := from; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				err = cmp.Or(err, op(s, n))
				ops++
				spin(10 * time.Microsecond)
			}
		})
		spin(10 * time.Millisecond) // let the load start
		p = p99()
		close(stop)
		wg.Wait()
		return p, ops, err
	}
	// A collection's pauses and assists, which the large replays bring on,
	// are not what this measures: the collector runs between rounds only.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	p99() // warm up
	for _, load := range loads {
		t.Run(load.name, func(t *testing.T) {
			// Timing on a shared machine is noisy, and noise only adds:
			// the least p99 of up to five rounds under the load on this
			// store must be within 2x the least of as many under it on
			// the other.
			base, busy := time.Duration(1<<62), time.Duration(1<<62)
			var loadErr error
			// Run the load a little first, so that the heap has room for
			// what it allocates rather than growing while measured.
			for n := range 50 {
				loadErr = cmp.Or(loadErr, load.op(m, 100_000_000+n), load.op(twin, 100_000_000+n))
			}
			for round := range 5 {
				b, bops, err1 := under(twin, load.op, round*1_000_000)
				s, sops, err2 := under(m, load.op, round*1_000_000+500_000)
				loadErr = cmp.Or(loadErr, err1, err2)
				t.Logf("round %d: other tenant's hit p99 %v with the load on another store (%d ops), %v with it on this one (%d ops)", round, b, bops, s, sops)
				base, busy = min(base, b), min(busy, s)
				if busy <= 2*base {
					break
				}
			}
			if loadErr != nil {
				t.Error(loadErr)
			}
			switch {
			case busy <= 2*base:
			case raceEnabled:
				t.Logf("other tenant's hit p99 under load: %v, %v with the load on another store (not checked under the race detector)", busy, base)
			default:
				t.Errorf("other tenant's hit p99 under load: got %v; want at most 2x the %v with the load on another store", busy, base)
			}
		})
	}

	for i := range 10 {
		sc := Scope{Tenant: "other", Key: "new-" + strconv.Itoa(i)}
		if b, err := m.Begin(sc, "fp"); err != nil || b.Decision != Miss {
			t.Errorf("Begin of the other tenant's new key %d: got %v, %v; want a miss", i, b.Decision, err)
		}
	}
	_, err := m.Begin(Scope{Tenant: "full", Key: "one-more"}, "fp")
	if !errors.Is(err, ErrTenantFull) || errors.Is(err, ErrStoreFull) {
		t.Errorf("Begin of the full tenant's new key: got %v; want ErrTenantFull", err)
	}
	if b := begin(t, m, Scope{Tenant: "full", Key: "0"}, "fp"); b.Decision != Miss {
		t.Errorf("Begin of the full tenant's known failed key: got %v; want a miss (it is not a new key)", b.Decision)
	}
}

// starveLedger returns TestTenantsDoNotStarve's store: tenant "full" at
// its bound of failed keys (cheap to make, kept for minutes), nine more
// tenants' failed keys filling the ledger to 20 keys short of MaxKeys
// (the other tenants need 12), tenant "other"'s committed key hitSc, and
// tenant "big"'s result bigSc, too large for the cache of decoded
// results (a sixteenth of MaxStoreBytes), so that every replay of it
// decodes 1 MiB. The full tenant's keys are claimed and failed; the
// others' are put in the ledger as that leaves them, which is four
// times as fast under the race detector.
func starveLedger(t *testing.T) (m *Memory, hitSc, bigSc Scope) {
	const (
		maxKeys = 200_000
		quota   = maxKeys / 10
		room    = 20
	)
	m = newMemory(t, Config{MaxKeys: maxKeys, MaxStoreBytes: 16 << 20, Limits: Limits{MaxKeysPerTenant: quota}})
	failKey := func(tenant, key string) {
		b, err := m.Begin(Scope{Tenant: tenant, Key: key}, "fp")
		if err != nil || b.Decision != Miss {
			t.Fatalf("Begin(%s, %s): got %v, %v; want a miss", tenant, key, b.Decision, err)
		}
		b.Flight.Fail(StateFailedRetryable, "upstream reset", nil)
	}
	for i := range quota {
		failKey("full", strconv.Itoa(i))
	}
	now := m.cfg.Now()
	m.mu.Lock()
	for i := range maxKeys - quota - room {
		sc := Scope{Tenant: "filler-" + strconv.Itoa(i%9), Key: strconv.Itoa(i)}
		e := &entry{fp: "fp", gen: nextGen(now, 0), state: StateFailedRetryable, reason: "upstream reset",
			created: now, updated: now, id: sc.id()}
		m.putLocked(sc.Tenant, nil, e)
		m.expireAtLocked(e, now.Add(m.cfg.FailedTTL))
	}
	m.mu.Unlock()
	hitSc = Scope{Tenant: "other", Key: "hit"}
	commitStream(t, m, hitSc, "fp", 10)
	bigSc = Scope{Tenant: "big", Key: "big"}
	f := claim(t, m, bigSc, "fp")
	f.SetHead(streamHead)
	ev := strings.Repeat("y", 4<<10)
	for range 256 {
		if _, err := f.Append("", ev); err != nil {
			t.Fatal(err)
		}
	}
	f.Commit(nil)
	return m, hitSc, bigSc
}

// spin waits d without sleeping: time.Sleep is too coarse for µs.
func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}

func TestMaxKeysPerTenant(t *testing.T) {
	const failedTTL = time.Minute
	clk := newClock()
	m := newMemory(t, Config{MaxKeys: 100, FailedTTL: failedTTL, Now: clk.Now, Limits: Limits{MaxKeysPerTenant: 3}})
	a := func(k string) Scope { return Scope{Tenant: "a", Key: k} }
	refused := func(sc Scope) {
		t.Helper()
		_, err := m.Begin(sc, "fp")
		if !errors.Is(err, ErrTenantFull) || errors.Is(err, ErrStoreFull) {
			t.Fatalf("Begin of %v: got %v; want ErrTenantFull", sc, err)
		}
		if !strings.Contains(err.Error(), "-max-keys-per-tenant") {
			t.Errorf("error: got %q; want it to name -max-keys-per-tenant", err)
		}
	}

	live := claim(t, m, a("live"), "fp")
	commitStream(t, m, a("done"), "fp", 2)
	claim(t, m, a("failed"), "fp").Fail(StateFailedRetryable, "upstream reset", nil)
	refused(a("new"))
	for _, tt := range []struct {
		key, fp string
		want    Decision
	}{
		{"live", "fp", Join}, {"done", "fp", Hit}, {"done", "other", Conflict}, {"live", "other", Conflict},
	} {
		if b := begin(t, m, a(tt.key), tt.fp); b.Decision != tt.want {
			t.Errorf("Begin of the full tenant's known key %q (%s): got %v; want %v", tt.key, tt.fp, b.Decision, tt.want)
		}
	}
	// A failed key is not a new one: it may start again.
	claim(t, m, a("failed"), "fp").Fail(StateFailedRetryable, "upstream reset", nil)
	claim(t, m, Scope{Tenant: "b", Key: "new"}, "fp")

	// Once the failed key has expired it counts no more.
	clk.Advance(failedTTL + time.Millisecond)
	claim(t, m, a("new"), "fp")
	refused(a("new2"))
	// A generation that ends keeps its key for FailedTTL.
	live.Fail(StateFailedRetryable, "upstream reset", nil)
	refused(a("new2"))
	clk.Advance(failedTTL + time.Millisecond)
	claim(t, m, a("new2"), "fp")
	if st := m.Stats(); st.Keys != 4 {
		t.Errorf("Keys: got %d; want 4 (a's done, new, new2; b's new)", st.Keys)
	}

	t.Run("default", func(t *testing.T) {
		m := newMemory(t, Config{MaxKeys: 50})
		for i := range 5 {
			claim(t, m, Scope{Tenant: "a", Key: strconv.Itoa(i)}, "fp")
		}
		if _, err := m.Begin(Scope{Tenant: "a", Key: "5"}, "fp"); !errors.Is(err, ErrTenantFull) {
			t.Errorf("Begin of a 6th key with MaxKeys 50: got %v; want ErrTenantFull (a tenth of MaxKeys)", err)
		}
	})
}

// TestLedgerExpiry runs random claims, ends, sweeps and clock moves and
// holds the ledger to a model of DESIGN.md's rules: a key is known until
// it expires (TTL after a commit, FailedTTL after a failure, never while
// live), and expired keys count against neither bound. After every step
// the expiry heaps and counts must agree with the keys.
func TestLedgerExpiry(t *testing.T) {
	const (
		ttl, failedTTL = 2 * time.Minute, 30 * time.Second
		maxKeys, quota = 12, 5
	)
	type mkey struct {
		f         *Flight // while live
		committed bool
		expires   time.Time
	}
	clk := newClock()
	m := newMemory(t, Config{MaxKeys: maxKeys, TTL: ttl, FailedTTL: failedTTL, Now: clk.Now, Limits: Limits{MaxKeysPerTenant: quota}})
	model := map[Scope]*mkey{}
	known := func(k *mkey) bool { return k != nil && (k.f != nil || !clk.Now().After(k.expires)) }
	rng := rand.New(rand.NewPCG(1, 2))
	for step := range 5000 {
		sc := Scope{Tenant: "t" + strconv.Itoa(rng.IntN(4)), Key: strconv.Itoa(rng.IntN(8))}
		k := model[sc]
		switch op := rng.IntN(10); {
		case op < 5: // Begin
			var want Decision
			var wantErr error
			switch {
			case known(k) && k.f != nil:
				want = Join
			case known(k) && k.committed:
				want = Hit
			case known(k):
				want = Miss
			default:
				tenant, all := 0, 0
				for s, k := range model {
					if known(k) {
						all++
						if s.Tenant == sc.Tenant {
							tenant++
						}
					}
				}
				switch {
				case tenant >= quota:
					wantErr = ErrTenantFull
				case all >= maxKeys:
					wantErr = ErrStoreFull
				default:
					want = Miss
				}
			}
			b, err := m.Begin(sc, "fp")
			if wantErr != nil || err != nil {
				if !errors.Is(err, wantErr) || wantErr == nil {
					t.Fatalf("step %d: Begin(%v): got %v; want %v", step, sc, err, wantErr)
				}
				break
			}
			if want == Hit && b.Decision == Miss && b.Regenerated {
				want = Miss // the body store may drop a body
			}
			if b.Decision != want {
				t.Fatalf("step %d: Begin(%v): got %v; want %v", step, sc, b.Decision, want)
			}
			if b.Decision == Miss {
				model[sc] = &mkey{f: b.Flight}
			}
		case op < 8: // end a live generation
			if k == nil || k.f == nil {
				break
			}
			if op == 5 {
				k.f.SetHead(streamHead)
				k.f.Commit(nil)
				k.committed, k.expires = true, clk.Now().Add(ttl)
			} else {
				k.f.Fail(StateFailedRetryable, "upstream reset", nil)
				k.committed, k.expires = false, clk.Now().Add(failedTTL)
			}
			k.f = nil
		case op < 9:
			clk.Advance(time.Duration(rng.IntN(40)) * time.Second)
		default:
			m.sweepExpired()
			for s, k := range model {
				if !known(k) {
					delete(model, s)
				}
			}
			if got, want := m.Stats().Keys, int64(len(model)); got != want {
				t.Fatalf("step %d: Keys after a sweep: got %d; want %d", step, got, want)
			}
		}
		for s, k := range model {
			if _, ok := m.Info(s); ok != known(k) {
				t.Fatalf("step %d: Info(%v) found: got %v; want %v", step, s, ok, known(k))
			}
		}
		checkLedger(t, m)
	}
}

// checkLedger checks that the expiry heaps and the counts agree with the
// ledger's keys.
func checkLedger(t *testing.T, m *Memory) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	ended := 0
	perTenant := map[*tenantKeys][2]int{} // keys, ended keys
	states := map[State]int64{}
	for id, e := range m.keys {
		if e.id != id || m.tenants[e.tenant.name] != e.tenant {
			t.Fatalf("entry %q: got id %q, tenant %p; want its own id and tenant", id, e.id, e.tenant)
		}
		c := perTenant[e.tenant]
		c[0]++
		states[e.state]++
		if e.state.Live() {
			if e.at != [2]int32{-1, -1} {
				t.Fatalf("live entry %q: got heap places %v; want none", id, e.at)
			}
		} else {
			ended++
			c[1]++
			if i := e.at[0]; i < 0 || int(i) >= m.exp.len() || m.exp.es[i] != e {
				t.Fatalf("ended entry %q: not at its place %d in the ledger's expiries", id, i)
			}
			if i := e.at[1]; i < 0 || int(i) >= e.tenant.exp.len() || e.tenant.exp.es[i] != e {
				t.Fatalf("ended entry %q: not at its place %d in its tenant's expiries", id, i)
			}
		}
		perTenant[e.tenant] = c
	}
	if m.exp.len() != ended {
		t.Fatalf("ledger's expiries: got %d; want the %d ended keys", m.exp.len(), ended)
	}
	heaps := []*expiries{&m.exp}
	for name, tk := range m.tenants {
		c := perTenant[tk]
		if tk.n != c[0] || tk.n == 0 || tk.exp.len() != c[1] {
			t.Fatalf("tenant %q: got %d keys, %d expiries; want %d > 0, %d", name, tk.n, tk.exp.len(), c[0], c[1])
		}
		heaps = append(heaps, &tk.exp)
	}
	for _, h := range heaps {
		for i := 1; i < h.len(); i++ {
			if h.less(i, (i-1)/2) {
				t.Fatalf("expiries: entry %d expires before its parent", i)
			}
		}
	}
	for s, n := range m.states {
		if n != states[s] {
			t.Fatalf("state %s: got count %d; want %d", s, n, states[s])
		}
	}
}
