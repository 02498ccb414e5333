package cache

import (
	"testing"
	"time"
)

// TestMemoryAlias: an alias resolves to its key and generation until the
// key's ledger entry expires; a name given to another key's stream moves
// to it, and the first key's end does not take it away. TestAliasTenants
// holds an alias to its tenant.
func TestMemoryAlias(t *testing.T) {
	t.Parallel()
	clk := newClock()
	// At the MaxKeys bound, a new key deletes an expired one (roomLocked).
	m := newMemory(t, Config{TTL: time.Minute, FailedTTL: time.Second, Now: clk.Now, MaxKeys: 2,
		Limits: Limits{MaxKeysPerTenant: 2, MaxStrangerKeys: 2}})
	a := Scope{Tenant: "t1", Key: "a"}
	fa := claim(t, m, a, "fp")
	m.SetAlias(a, fa.Gen, "resp_1", 0)
	if got, ok := m.ResolveAlias("t1", "resp_1"); !ok || got != (Alias{Key: "a", Gen: fa.Gen}) {
		t.Fatalf("resolve: got %+v (found %v); want key a, generation %d", got, ok, fa.Gen)
	}
	m.SetAlias(a, fa.Gen+1, "resp_other", 0) // not the key's generation
	if _, ok := m.ResolveAlias("t1", "resp_other"); ok {
		t.Fatal("an alias of a generation the key does not have resolved")
	}
	fa.Fail(StateFailedRetryable, "test", nil)
	c := Scope{Tenant: "t1", Key: "c"}
	fc := claim(t, m, c, "fp")
	m.SetAlias(c, fc.Gen, "resp_1", 4) // an upstream that reuses an id
	clk.Advance(2 * time.Second)       // a's failure expired
	claim(t, m, Scope{Tenant: "t1", Key: "sweep"}, "fp")
	if _, ok := m.keys[a.ID()]; ok {
		t.Fatal("key a is still in the ledger; want it deleted to make room")
	}
	if got, ok := m.ResolveAlias("t1", "resp_1"); !ok || got.Key != "c" || got.Base != 4 {
		t.Fatalf("after the move: got %+v (found %v); want key c, base 4", got, ok)
	}
	fc.Fail(StateFailedRetryable, "test", nil)
	clk.Advance(2 * time.Second)
	if _, ok := m.ResolveAlias("t1", "resp_1"); ok {
		t.Fatal("an alias of an expired key resolved")
	}
}

// TestMemoryAliasReplaced: a key's stream has one alias, so a second name
// replaces the first; and a regeneration of the key takes the old
// generation's name away.
func TestMemoryAliasReplaced(t *testing.T) {
	t.Parallel()
	m := newMemory(t, Config{TTL: time.Minute})
	a := Scope{Tenant: "t1", Key: "a"}
	f := claim(t, m, a, "fp")
	m.SetAlias(a, f.Gen, "resp_1", 0)
	m.SetAlias(a, f.Gen, "resp_2", 0)
	if _, ok := m.ResolveAlias("t1", "resp_1"); ok {
		t.Error("the first name still resolves; want it replaced")
	}
	if got, ok := m.ResolveAlias("t1", "resp_2"); !ok || got != (Alias{Key: "a", Gen: f.Gen}) {
		t.Fatalf("second name: got %+v (found %v); want key a, generation %d", got, ok, f.Gen)
	}
	f.Fail(StateFailedRetryable, "test", nil)
	if again := claim(t, m, a, "fp"); again.Gen == f.Gen {
		t.Fatalf("regeneration: got generation %d again; want a new one", again.Gen)
	}
	if got, ok := m.ResolveAlias("t1", "resp_2"); ok {
		t.Fatalf("after the regeneration: %+v; want the old name gone", got)
	}
}

// TestAliasTenants: two tenants that name a stream of the same key alike
// each resolve the name to their own stream, and a third tenant resolves
// it to nothing, in either store.
func TestAliasTenants(t *testing.T) {
	t.Parallel()
	type store interface {
		Begin(Scope, string) (Begun, error)
		SetAlias(Scope, uint64, string, int64)
		ResolveAlias(string, string) (Alias, bool)
	}
	stores := []struct {
		name string
		new  func(t *testing.T) (set, get store)
	}{
		{"memory", func(t *testing.T) (store, store) {
			m := newMemory(t, Config{})
			return m, m
		}},
		{"redis", func(t *testing.T) (store, store) {
			rs := replicas(t, 2)
			return rs[0], rs[1] // set on one replica, resolved on another
		}},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			set, get := st.new(t)
			want := map[string]Alias{}
			for i, tenant := range []string{"t1", "t2"} {
				sc := Scope{Tenant: tenant, Key: "k"}
				b, err := set.Begin(sc, "fp")
				if err != nil || b.Decision != Miss {
					t.Fatalf("%s: Begin: got %v, %v; want a miss", tenant, b.Decision, err)
				}
				base := int64(10 * (i + 1)) // tells the tenants' aliases apart when their generations agree
				set.SetAlias(sc, b.Flight.Gen, "resp_same", base)
				want[tenant] = Alias{Key: "k", Gen: b.Flight.Gen, Base: base}
			}
			for tenant, w := range want {
				if got, ok := get.ResolveAlias(tenant, "resp_same"); !ok || got != w {
					t.Errorf("%s: got %+v (found %v); want %+v, its own stream", tenant, got, ok, w)
				}
			}
			if got, ok := get.ResolveAlias("t3", "resp_same"); ok {
				t.Errorf("t3: got %+v; want nothing: the name is other tenants'", got)
			}
		})
	}
}
