package cache

import (
	"testing"
	"time"
)

// TestMemoryAlias: an alias resolves for its tenant only, to its key and
// generation, until the key's ledger entry expires; a name given to
// another key's stream moves to it, and the first key's end does not take
// it away.
func TestMemoryAlias(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { return now }
	m := newMemory(t, Config{TTL: time.Minute, FailedTTL: time.Second, Now: clock})
	a := Scope{Tenant: "t1", Key: "a"}
	b, err := m.Begin(a, "fp")
	if err != nil || b.Decision != Miss {
		t.Fatalf("Begin: %v %v", b.Decision, err)
	}
	m.SetAlias(a, b.Flight.Gen, "resp_1", 0)
	if got, ok := m.ResolveAlias("t1", "resp_1"); !ok || got != (Alias{Key: "a", Gen: b.Flight.Gen}) {
		t.Fatalf("resolve: %+v %v", got, ok)
	}
	if _, ok := m.ResolveAlias("t2", "resp_1"); ok {
		t.Fatal("another tenant resolved the alias")
	}
	m.SetAlias(a, b.Flight.Gen+1, "resp_other", 0) // not the key's generation
	if _, ok := m.ResolveAlias("t1", "resp_other"); ok {
		t.Fatal("an alias of a generation the key does not have resolved")
	}
	b.Flight.Fail(StateFailedRetryable, "test", nil)
	c := Scope{Tenant: "t1", Key: "c"}
	bc, _ := m.Begin(c, "fp")
	m.SetAlias(c, bc.Flight.Gen, "resp_1", 4)        // an upstream that reuses an id
	now = now.Add(2 * time.Second)                   // a's failure expired
	m.Begin(Scope{Tenant: "t1", Key: "sweep"}, "fp") //nolint:errcheck // a new key, to make room
	if got, ok := m.ResolveAlias("t1", "resp_1"); !ok || got.Key != "c" || got.Base != 4 {
		t.Fatalf("after the move: %+v %v; want key c, base 4", got, ok)
	}
	bc.Flight.Fail(StateFailedRetryable, "test", nil)
	now = now.Add(2 * time.Second)
	if _, ok := m.ResolveAlias("t1", "resp_1"); ok {
		t.Fatal("an alias of an expired key resolved")
	}
}

// TestRedisAlias: an alias set on one replica resolves on another, for
// its tenant only.
func TestRedisAlias(t *testing.T) {
	t.Parallel()
	rs := replicas(t, 2)
	sc := Scope{Tenant: "t", Key: "alias"}
	rs[0].SetAlias(sc, 42, "resp_abc", 0)
	if got, ok := rs[1].ResolveAlias("t", "resp_abc"); !ok || got != (Alias{Key: "alias", Gen: 42}) {
		t.Fatalf("other replica: %+v %v; want key alias, generation 42", got, ok)
	}
	if _, ok := rs[1].ResolveAlias("u", "resp_abc"); ok {
		t.Fatal("another tenant resolved the alias")
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
