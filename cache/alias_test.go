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
	m := newMemory(t, Config{TTL: time.Minute, FailedTTL: time.Second, Now: clk.Now})
	a := Scope{Tenant: "t1", Key: "a"}
	b, err := m.Begin(a, "fp")
	if err != nil || b.Decision != Miss {
		t.Fatalf("Begin: %v %v", b.Decision, err)
	}
	m.SetAlias(a, b.Flight.Gen, "resp_1", 0)
	if got, ok := m.ResolveAlias("t1", "resp_1"); !ok || got != (Alias{Key: "a", Gen: b.Flight.Gen}) {
		t.Fatalf("resolve: %+v %v", got, ok)
	}
	m.SetAlias(a, b.Flight.Gen+1, "resp_other", 0) // not the key's generation
	if _, ok := m.ResolveAlias("t1", "resp_other"); ok {
		t.Fatal("an alias of a generation the key does not have resolved")
	}
	b.Flight.Fail(StateFailedRetryable, "test", nil)
	c := Scope{Tenant: "t1", Key: "c"}
	bc, _ := m.Begin(c, "fp")
	m.SetAlias(c, bc.Flight.Gen, "resp_1", 4)        // an upstream that reuses an id
	clk.Advance(2 * time.Second)                     // a's failure expired
	m.Begin(Scope{Tenant: "t1", Key: "sweep"}, "fp") //nolint:errcheck // a new key, to make room
	if got, ok := m.ResolveAlias("t1", "resp_1"); !ok || got.Key != "c" || got.Base != 4 {
		t.Fatalf("after the move: %+v %v; want key c, base 4", got, ok)
	}
	bc.Flight.Fail(StateFailedRetryable, "test", nil)
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
	b, err := m.Begin(a, "fp")
	if err != nil || b.Decision != Miss {
		t.Fatalf("Begin: %v %v", b.Decision, err)
	}
	m.SetAlias(a, b.Flight.Gen, "resp_1", 0)
	m.SetAlias(a, b.Flight.Gen, "resp_2", 0)
	if _, ok := m.ResolveAlias("t1", "resp_1"); ok {
		t.Error("the first name still resolves; want it replaced")
	}
	if got, ok := m.ResolveAlias("t1", "resp_2"); !ok || got != (Alias{Key: "a", Gen: b.Flight.Gen}) {
		t.Fatalf("second name: %+v %v; want key a, generation %d", got, ok, b.Flight.Gen)
	}
	b.Flight.Fail(StateFailedRetryable, "test", nil)
	again, err := m.Begin(a, "fp")
	if err != nil || again.Decision != Miss || again.Flight.Gen == b.Flight.Gen {
		t.Fatalf("regeneration: %v %v; want a new generation", again.Decision, err)
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
