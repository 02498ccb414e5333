package cache

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/ssegate/ssegate/internal/redistest"
)

// ledger is what the tests of tenant bounds need of either store.
type ledger interface {
	Begin(sc Scope, fp string) (Begun, error)
	Info(sc Scope) (KeyInfo, bool)
}

// bothStores runs test against a Memory store and a Redis store (a real
// redis-server) with the same bounds: keys bounds every store's MaxKeys.
func bothStores(t *testing.T, keys int, l Limits, test func(t *testing.T, s ledger)) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		test(t, newMemory(t, Config{MaxKeys: keys, Limits: l}))
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		addr, prefix := redistest.Shared(t), redistest.Prefix(t)
		test(t, newRedis(t, addr, prefix, func(c *RedisConfig) { c.MaxKeys, c.Limits = keys, l }))
	})
}

func miss(t *testing.T, s ledger, sc Scope) *Flight {
	t.Helper()
	b, err := s.Begin(sc, "fp")
	if err != nil || b.Decision != Miss {
		t.Fatalf("Begin(%v): got %v, %v; want a miss", sc, b.Decision, err)
	}
	return b.Flight
}

// TestDeniedKeyForgotten: a key whose upstream refused the credential
// (Flight.Deny) holds no place in the ledger past its answer: the ledger
// bound (two keys) lets any number of such keys through one after
// another, each a miss, while a joiner of the denied flight still gets
// the upstream's answer, and the key is unknown after it.
func TestDeniedKeyForgotten(t *testing.T) {
	bothStores(t, 2, deniedLimits, deniedKeyForgotten)
}

// deniedLimits are the bounds of deniedKeyForgotten: two keys.
var deniedLimits = Limits{MaxStrangerKeys: 2, MaxKeysPerTenant: 2}

func deniedKeyForgotten(t *testing.T, s ledger) {
	{
		for i := range 6 {
			sc := Scope{Tenant: "minted-" + strconv.Itoa(i), Key: "k"}
			f := miss(t, s, sc)
			b, err := s.Begin(sc, "fp")
			if err != nil || b.Decision != Join {
				t.Fatalf("second Begin(%v): got %v, %v; want a join", sc, b.Decision, err)
			}
			f.SetHead(Head{Status: 401, ContentType: "application/json"})
			f.Deny("upstream_status_401", []byte(`{"error":"bad key"}`))
			state, _, body := b.Flight.Outcome()
			if state != StateFailedTerminal || string(body) != `{"error":"bad key"}` {
				t.Fatalf("joiner's outcome: got %s %q; want failed_terminal with the upstream's body", state, body)
			}
			if ki, ok := s.Info(sc); ok {
				t.Fatalf("Info of a denied key: got %+v; want none", ki)
			}
		}
		// A repeat of a denied key is a new miss.
		sc := Scope{Tenant: "minted-0", Key: "k"}
		miss(t, s, sc).Fail(StateFailedRetryable, "test", nil)
		if m, ok := s.(*Memory); ok {
			if st := m.Stats(); st.Keys != 1 || st.LiveFlights != 0 || st.ByState[StateFailedTerminal] != 0 {
				t.Errorf("stats: got %d keys, %d live, %d failed_terminal; want 1, 0, 0", st.Keys, st.LiveFlights, st.ByState[StateFailedTerminal])
			}
		}
	}
}

// TestStrangersLeaveRoom: strangers (tenants none of whose keys
// committed) hold at most MaxStrangerKeys keys together, so that when
// their failed keys fill that part of the ledger, a known tenant's new
// keys are still claimed, up to MaxKeys, which bounds Redis's ledger too.
func TestStrangersLeaveRoom(t *testing.T) {
	bothStores(t, 8, strangersLimits, strangersLeaveRoom)
}

// strangersLimits are the bounds of strangersLeaveRoom: eight keys.
var strangersLimits = Limits{MaxStrangerKeys: 4, MaxKeysPerTenant: 8}

func strangersLeaveRoom(t *testing.T, s ledger) {
	{
		known := func(k string) Scope { return Scope{Tenant: "known", Key: k} }
		f := miss(t, s, known("done"))
		startStream(t, f)
		appendN(t, f, 1, 2)
		if !f.Commit(nil) {
			t.Fatal("commit: got not stored; want stored")
		}
		for i := range 4 {
			miss(t, s, Scope{Tenant: "stranger-" + strconv.Itoa(i), Key: "k"}).Fail(StateFailedTerminal, "upstream_status_400", nil)
		}
		for _, sc := range []Scope{{Tenant: "stranger-9", Key: "k"}, {Tenant: "stranger-0", Key: "other"}} {
			if _, err := s.Begin(sc, "fp"); !errors.Is(err, ErrStoreFull) || !strings.Contains(err.Error(), "-max-stranger-keys") {
				t.Fatalf("Begin(%v) with strangers at their bound: got %v; want ErrStoreFull of -max-stranger-keys", sc, err)
			}
		}
		var live []*Flight
		for _, k := range []string{"a", "b", "c"} { // 1 + 4 + 3 = MaxKeys
			live = append(live, miss(t, s, known(k)))
		}
		if _, err := s.Begin(known("d"), "fp"); !errors.Is(err, ErrStoreFull) || !strings.Contains(err.Error(), "-max-keys") {
			t.Fatalf("Begin of a known tenant's key past MaxKeys: got %v; want ErrStoreFull of -max-keys", err)
		}
		for _, f := range live {
			f.Fail(StateFailedRetryable, "test", nil)
		}
	}
}

// TestLiveShares: tenant A's many growing streams are stopped once they
// leave less than one share of MaxLiveBytes free, and its new streams
// refused before then; tenant B's stream, within its share, grows to its
// end and commits, where it used to be cut with ErrStoreFull.
func TestLiveShares(t *testing.T) {
	const (
		bound = 64 << 10
		share = 16 << 10
	)
	bothStores(t, 100, Limits{MaxLiveBytes: bound, MaxLiveBytesPerTenant: share}, func(t *testing.T, s ledger) {
		ev := strings.Repeat("a", 1000)
		// A opens streams, 8 KB each, until its new ones are refused:
		// past its share, with less than two shares free.
		var as []*Flight
		for i := 0; ; i++ {
			b, err := s.Begin(Scope{Tenant: "A", Key: strconv.Itoa(i)}, "fp")
			if err != nil {
				if !errors.Is(err, ErrStoreFull) || !strings.Contains(err.Error(), "-max-live-bytes-per-tenant") || i < 4 {
					t.Fatalf("Begin of A's stream #%d: got %v; want a miss up to 32 KB, then ErrStoreFull of its share", i, err)
				}
				break
			}
			startStream(t, b.Flight)
			as = append(as, b.Flight)
			for range 8 {
				if _, err := b.Flight.Append("", ev); err != nil {
					t.Fatalf("Append to A's stream #%d: got %v; want none", i, err)
				}
			}
		}
		// Its streams grow on until less than one share is free: then the
		// one that grows is stopped.
		for i := 0; ; i++ {
			f := as[i%len(as)]
			if _, err := f.Append("", ev); err != nil {
				if !errors.Is(err, ErrStoreFull) || !strings.Contains(err.Error(), "-max-live-bytes-per-tenant") {
					t.Fatalf("Append to A's stream: got %v; want ErrStoreFull of its share", err)
				}
				f.Fail(StateFailedRetryable, "store_full", nil)
				break
			}
		}
		b := miss(t, s, Scope{Tenant: "B", Key: "b"})
		startStream(t, b)
		for i := range 12 {
			if _, err := b.Append("", ev); err != nil {
				t.Fatalf("Append #%d to B's stream, within its share: got %v; want none", i+1, err)
			}
		}
		if !b.Commit(nil) {
			t.Fatal("B's commit: got not stored; want stored")
		}
		if _, err := s.Begin(Scope{Tenant: "A", Key: "next"}, "fp"); !errors.Is(err, ErrStoreFull) || !strings.Contains(err.Error(), "-max-live-bytes-per-tenant") {
			t.Fatalf("Begin of A's next stream: got %v; want ErrStoreFull of its share", err)
		}
		miss(t, s, Scope{Tenant: "B", Key: "next"}).Fail(StateFailedRetryable, "test", nil)
		for _, f := range as {
			f.Fail(StateFailedRetryable, "test", nil)
		}
	})
}
