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
