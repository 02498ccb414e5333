package cache

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// TestLedgerExpiry runs random claims, ends, sweeps and clock moves and
// holds the ledger to a model of the rules in docs/design.md, Commit and the ledger: a key is known until
// it expires (TTL after a commit, FailedTTL after a failure, never while
// live), and expired keys count against neither bound. After every step
// the expiry heaps and counts must agree with the keys.
func TestLedgerExpiry(t *testing.T) {
	t.Parallel()
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
	m := newMemory(t, Config{MaxKeys: maxKeys, TTL: ttl, FailedTTL: failedTTL, Now: clk.Now, Limits: Limits{MaxKeysPerTenant: quota, MaxStrangerKeys: maxKeys}})
	type skey struct{ Tenant, Key string } // a Scope, which is no map key
	model := map[skey]*mkey{}
	known := func(k *mkey) bool { return k != nil && (k.f != nil || !clk.Now().After(k.expires)) }
	rng := rand.New(rand.NewPCG(1, 2))
	for step := range 5000 {
		sc := Scope{Tenant: "t" + strconv.Itoa(rng.IntN(4)), Key: strconv.Itoa(rng.IntN(8))}
		k := model[skey{sc.Tenant, sc.Key}]
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
				model[skey{sc.Tenant, sc.Key}] = &mkey{f: b.Flight}
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
			if _, ok := m.Info(Scope{Tenant: s.Tenant, Key: s.Key}); ok != known(k) {
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
	perTenant := map[*tenantKeys][3]int{} // keys, ended keys it keeps, keys it is the first account of
	states := map[State]int64{}
	for id, e := range m.keys {
		if e.id != id || m.tenants[e.tenant.name] != e.tenant {
			t.Fatalf("entry %q: got id %q, tenant %p; want its own id and tenant", id, e.id, e.tenant)
		}
		for _, t := range e.more {
			c := perTenant[t]
			c[0]++
			perTenant[t] = c
		}
		c := perTenant[e.tenant]
		c[0]++
		c[2]++
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
		if tk.n != c[0] || tk.n == 0 || tk.exp.len() != c[1] || tk.own != c[2] {
			t.Fatalf("tenant %q: got %d keys, %d expiries, %d its own; want %d > 0, %d, %d", name, tk.n, tk.exp.len(), tk.own, c[0], c[1], c[2])
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
