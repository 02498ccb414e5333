// Package storetest holds the contract every store of package cache
// keeps, whatever holds its ledger: a store's tests run each Contract
// against a store of their own (cache's against Memory, cache/redis's
// against a Redis store on a real redis-server), so that the stores
// cannot drift apart. It also has the helpers those tests share.
package storetest

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
)

// Store is what the contracts need of a store.
type Store interface {
	Begin(sc cache.Scope, fp string) (cache.Begun, error)
	Info(sc cache.Scope) (cache.KeyInfo, bool)
	Forget(sc cache.Scope) error
}

// A Contract is one test every store passes: Run, against a store made
// with MaxKeys and Limits.
type Contract struct {
	Name    string
	MaxKeys int
	Limits  cache.Limits
	Run     func(t *testing.T, s Store)
}

// Contracts are the tests every store passes.
var Contracts = []Contract{
	{"AccountBounds", 100, cache.Limits{MaxKeysPerTenant: 2, MaxStrangerKeys: 100}, AccountBounds},
	{"DeniedKeyForgotten", 2, cache.Limits{MaxStrangerKeys: 2, MaxKeysPerTenant: 2}, DeniedKeyForgotten},
	{"StrangersLeaveRoom", 8, cache.Limits{MaxStrangerKeys: 4, MaxKeysPerTenant: 8}, StrangersLeaveRoom},
	{"LiveShares", 100, cache.Limits{MaxLiveBytes: 64 << 10, MaxLiveBytesPerTenant: 16 << 10}, LiveShares},
	{"CancelledHeld", 100, cache.Limits{}, CancelledHeld},
}

// CancelledHeld: a generation its tenant stopped (a Fail with
// StateCancelled) holds its key: the same request is Cancelled, another
// is a Conflict, neither a new generation; Info says cancelled; another
// tenant's same key is its own; once forgotten the key is a Miss again.
func CancelledHeld(t *testing.T, s Store) {
	sc := cache.Scope{Tenant: "t", Key: "stopped"}
	f := Miss(t, s, sc)
	StartStream(t, f)
	f.Fail(cache.StateCancelled, "cancelled", nil)
	for _, c := range []struct {
		fp   string
		want cache.Decision
	}{{"fp", cache.Cancelled}, {"other", cache.Conflict}, {"fp", cache.Cancelled}} {
		if b, err := s.Begin(sc, c.fp); err != nil || b.Decision != c.want {
			t.Fatalf("Begin(%q) of a cancelled key: got %v, %v; want %v", c.fp, b.Decision, err, c.want)
		}
	}
	if ki, ok := s.Info(sc); !ok || ki.State != cache.StateCancelled || ki.Reason != "cancelled" {
		t.Fatalf("Info: got %+v, %v; want state cancelled, reason cancelled", ki, ok)
	}
	Miss(t, s, cache.Scope{Tenant: "u", Key: "stopped"}).Fail(cache.StateFailedRetryable, "x", nil)
	if err := s.Forget(sc); err != nil {
		t.Fatalf("Forget: %v", err)
	}
	Miss(t, s, sc).Fail(cache.StateFailedRetryable, "x", nil)
}

// AccountBounds: a key counts against every account of its scope,
// first or not, and is refused while any of them holds
// MaxKeysPerTenant keys, whatever its tenant: the same credential value
// ("real") behind four tenants is held to 2 keys; a key of another
// account is not refused; a known key of the full account is decided as
// usual; forgetting a key gives its place back in every account.
func AccountBounds(t *testing.T, s Store) {
	{
		full := func(sc cache.Scope) {
			t.Helper()
			if _, err := s.Begin(sc, "fp"); !errors.Is(err, cache.ErrTenantFull) {
				t.Fatalf("Begin(%v): got %v; want ErrTenantFull", sc, err)
			}
		}
		x1 := cache.Scope{Tenant: "t1", Key: "k", Accounts: []string{"real", "m1"}}
		x2 := cache.Scope{Tenant: "t2", Key: "k", Accounts: []string{"m2", "real"}}
		Miss(t, s, x1).Fail(cache.StateFailedRetryable, "test", nil)
		f := Miss(t, s, x2)
		StartStream(t, f)
		AppendN(t, f, 1, 3)
		if !f.Commit(nil) {
			t.Fatal("commit: got not stored; want stored")
		}
		full(cache.Scope{Tenant: "t3", Key: "k", Accounts: []string{"real"}})
		full(cache.Scope{Tenant: "t4", Key: "k", Accounts: []string{"m4", "real"}})
		full(cache.Scope{Tenant: "t4", Key: "k", Accounts: []string{"m4", "m5", "real"}})
		Miss(t, s, cache.Scope{Tenant: "t5", Key: "k", Accounts: []string{"m5", "m1"}}).Fail(cache.StateFailedRetryable, "test", nil)
		if b, err := s.Begin(x2, "fp"); err != nil || b.Decision != cache.Hit {
			t.Fatalf("Begin of the full account's committed key: got %v, %v; want a hit", b.Decision, err)
		}
		Miss(t, s, x1).Fail(cache.StateFailedRetryable, "test", nil) // a known key starts again
		if err := s.Forget(x1); err != nil {
			t.Fatalf("Forget: %v", err)
		}
		Miss(t, s, cache.Scope{Tenant: "t4", Key: "k", Accounts: []string{"m4", "real"}}).Fail(cache.StateFailedRetryable, "test", nil)
		full(cache.Scope{Tenant: "t3", Key: "k", Accounts: []string{"real"}})
	}
}

// DeniedKeyForgotten: a key whose upstream refused the credential
// (Flight.Deny) holds no place in the ledger past its answer: the ledger
// bound (two keys) lets any number of such keys through one after
// another, each a miss, while a joiner of the denied flight still gets
// the upstream's answer, and the key is unknown after it.
func DeniedKeyForgotten(t *testing.T, s Store) {
	{
		for i := range 6 {
			sc := cache.Scope{Tenant: "minted-" + strconv.Itoa(i), Key: "k"}
			f := Miss(t, s, sc)
			b, err := s.Begin(sc, "fp")
			if err != nil || b.Decision != cache.Join {
				t.Fatalf("second Begin(%v): got %v, %v; want a join", sc, b.Decision, err)
			}
			f.SetHead(cache.Head{Status: 401, ContentType: "application/json"})
			f.Deny("upstream_status_401", []byte(`{"error":"bad key"}`))
			state, _, body := b.Flight.Outcome()
			if state != cache.StateFailedTerminal || string(body) != `{"error":"bad key"}` {
				t.Fatalf("joiner's outcome: got %s %q; want failed_terminal with the upstream's body", state, body)
			}
			if ki, ok := s.Info(sc); ok {
				t.Fatalf("Info of a denied key: got %+v; want none", ki)
			}
		}
		// A repeat of a denied key is a new miss.
		sc := cache.Scope{Tenant: "minted-0", Key: "k"}
		Miss(t, s, sc).Fail(cache.StateFailedRetryable, "test", nil)
		if m, ok := s.(interface{ Stats() cache.Stats }); ok {
			if st := m.Stats(); st.Keys != 1 || st.LiveFlights != 0 || st.ByState[cache.StateFailedTerminal] != 0 {
				t.Errorf("stats: got %d keys, %d live, %d failed_terminal; want 1, 0, 0", st.Keys, st.LiveFlights, st.ByState[cache.StateFailedTerminal])
			}
		}
	}
}

// StrangersLeaveRoom: strangers (tenants none of whose keys
// committed) hold at most MaxStrangerKeys keys together, so that when
// their failed keys fill that part of the ledger, a known tenant's new
// keys are still claimed, up to MaxKeys, which bounds Redis's ledger too.
func StrangersLeaveRoom(t *testing.T, s Store) {
	{
		known := func(k string) cache.Scope { return cache.Scope{Tenant: "known", Key: k} }
		f := Miss(t, s, known("done"))
		StartStream(t, f)
		AppendN(t, f, 1, 2)
		if !f.Commit(nil) {
			t.Fatal("commit: got not stored; want stored")
		}
		for i := range 4 {
			Miss(t, s, cache.Scope{Tenant: "stranger-" + strconv.Itoa(i), Key: "k"}).Fail(cache.StateFailedTerminal, "upstream_status_400", nil)
		}
		for _, sc := range []cache.Scope{{Tenant: "stranger-9", Key: "k"}, {Tenant: "stranger-0", Key: "other"}} {
			if _, err := s.Begin(sc, "fp"); !errors.Is(err, cache.ErrStoreFull) || !strings.Contains(err.Error(), "-max-stranger-keys") {
				t.Fatalf("Begin(%v) with strangers at their bound: got %v; want ErrStoreFull of -max-stranger-keys", sc, err)
			}
		}
		var live []*cache.Flight
		for _, k := range []string{"a", "b", "c"} { // 1 + 4 + 3 = MaxKeys
			live = append(live, Miss(t, s, known(k)))
		}
		if _, err := s.Begin(known("d"), "fp"); !errors.Is(err, cache.ErrStoreFull) || !strings.Contains(err.Error(), "-max-keys") {
			t.Fatalf("Begin of a known tenant's key past MaxKeys: got %v; want ErrStoreFull of -max-keys", err)
		}
		for _, f := range live {
			f.Fail(cache.StateFailedRetryable, "test", nil)
		}
	}
}

// LiveShares: tenant A's many growing streams are stopped once they
// leave less than one share of MaxLiveBytes free, and its new streams
// refused before then; tenant B's stream, within its share, grows to its
// end and commits, where it used to be cut with ErrStoreFull.
func LiveShares(t *testing.T, s Store) {
	ev := strings.Repeat("a", 1000)
	// A opens streams, 8 KB each, until its new ones are refused:
	// past its share, with less than two shares free.
	var as []*cache.Flight
	for i := 0; ; i++ {
		b, err := s.Begin(cache.Scope{Tenant: "A", Key: strconv.Itoa(i)}, "fp")
		if err != nil {
			if !errors.Is(err, cache.ErrStoreFull) || !strings.Contains(err.Error(), "-max-live-bytes-per-tenant") || i < 4 {
				t.Fatalf("Begin of A's stream #%d: got %v; want a miss up to 32 KB, then ErrStoreFull of its share", i, err)
			}
			break
		}
		StartStream(t, b.Flight)
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
			if !errors.Is(err, cache.ErrStoreFull) || !strings.Contains(err.Error(), "-max-live-bytes-per-tenant") {
				t.Fatalf("Append to A's stream: got %v; want ErrStoreFull of its share", err)
			}
			f.Fail(cache.StateFailedRetryable, "store_full", nil)
			break
		}
	}
	b := Miss(t, s, cache.Scope{Tenant: "B", Key: "b"})
	StartStream(t, b)
	for i := range 12 {
		if _, err := b.Append("", ev); err != nil {
			t.Fatalf("Append #%d to B's stream, within its share: got %v; want none", i+1, err)
		}
	}
	if !b.Commit(nil) {
		t.Fatal("B's commit: got not stored; want stored")
	}
	if _, err := s.Begin(cache.Scope{Tenant: "A", Key: "next"}, "fp"); !errors.Is(err, cache.ErrStoreFull) || !strings.Contains(err.Error(), "-max-live-bytes-per-tenant") {
		t.Fatalf("Begin of A's next stream: got %v; want ErrStoreFull of its share", err)
	}
	Miss(t, s, cache.Scope{Tenant: "B", Key: "next"}).Fail(cache.StateFailedRetryable, "test", nil)
	for _, f := range as {
		f.Fail(cache.StateFailedRetryable, "test", nil)
	}
}

// Miss calls Begin and fails the test unless it is a miss.
func Miss(t *testing.T, s Store, sc cache.Scope) *cache.Flight {
	t.Helper()
	b, err := s.Begin(sc, "fp")
	if err != nil || b.Decision != cache.Miss {
		t.Fatalf("Begin(%v): got %v, %v; want a miss", sc, b.Decision, err)
	}
	return b.Flight
}

// StartStream marks f's generation started and sets a stream's head.
func StartStream(tb testing.TB, f *cache.Flight) {
	tb.Helper()
	f.Mark(cache.StateExecutionStarted, 1, 200)
	f.SetHead(cache.Head{Status: 200, ContentType: "text/event-stream", Stream: true,
		Header: []cache.Header{{Name: "X-Request-Id", Value: "req-1"}}})
}

// AppendN appends n events whose data is their seq and returns the bytes
// the journal should hold for them.
func AppendN(tb testing.TB, f *cache.Flight, from, n int) []byte {
	tb.Helper()
	var want []byte
	for seq := from; seq < from+n; seq++ {
		data := strconv.Itoa(seq)
		id, err := f.Append("", data)
		if err != nil {
			tb.Fatalf("Append #%d: got error %v; want none", seq, err)
		}
		if id != (sse.ID{Gen: f.Gen, Seq: uint64(seq)}) {
			tb.Fatalf("Append #%d: got id %v; want %d-%d", seq, id, f.Gen, seq)
		}
		want = sse.AppendEvent(want, id, "", data)
	}
	return want
}

// AliasStore is what AliasTenants needs of a store.
type AliasStore interface {
	Begin(cache.Scope, string) (cache.Begun, error)
	SetAlias(cache.Scope, uint64, string, int64)
	ResolveAlias(string, string) (cache.Alias, bool)
}

// AliasTenants: two tenants that name a stream of the same key alike
// each resolve the name to their own stream, and a third tenant resolves
// it to nothing. The aliases are set on set and resolved on get (two
// replicas of one store, or the same store).
func AliasTenants(t *testing.T, set, get AliasStore) {
	want := map[string]cache.Alias{}
	for i, tenant := range []string{"t1", "t2"} {
		sc := cache.Scope{Tenant: tenant, Key: "k"}
		b, err := set.Begin(sc, "fp")
		if err != nil || b.Decision != cache.Miss {
			t.Fatalf("%s: Begin: got %v, %v; want a miss", tenant, b.Decision, err)
		}
		base := int64(10 * (i + 1)) // tells the tenants' aliases apart when their generations agree
		set.SetAlias(sc, b.Flight.Gen, "resp_same", base)
		want[tenant] = cache.Alias{Key: "k", Gen: b.Flight.Gen, Base: base}
	}
	for tenant, w := range want {
		if got, ok := get.ResolveAlias(tenant, "resp_same"); !ok || got != w {
			t.Errorf("%s: got %+v (found %v); want %+v, its own stream", tenant, got, ok, w)
		}
	}
	if got, ok := get.ResolveAlias("t3", "resp_same"); ok {
		t.Errorf("t3: got %+v; want nothing: the name is other tenants'", got)
	}
}

// ReadAll reads what s has now, over as many Reads as the journal's
// blocks take.
func ReadAll(s *cache.Sub) (got []byte, ended bool) {
	for {
		p, end := s.Read()
		got = append(got, p...)
		if end || len(p) == 0 {
			return got, end
		}
	}
}
