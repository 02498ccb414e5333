package cache

import (
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/ssegate/ssegate/sse"
)

// MissingBody is the policy for a committed key whose body the body store
// no longer holds.
type MissingBody int

const (
	// Regenerate treats the key as free: a new generation replaces it. The
	// replacement is flagged (Begun.Regenerated) for logs and metrics.
	Regenerate MissingBody = iota
	// Refuse answers Gone instead of calling the upstream again.
	Refuse
)

// Config bounds and tunes a Memory store. Its zero value is usable: every
// zero field takes the default documented beside it.
type Config struct {
	// TTL is how long a committed result is kept (default 24h).
	TTL time.Duration
	// FailedTTL is how long the ledger remembers a key whose generation
	// failed, so a resume with its ids gets "gone" (default 5m).
	FailedTTL time.Duration
	// MaxStoreBytes bounds the committed bodies held in memory (default 512 MiB).
	MaxStoreBytes int64
	// Limits bound the live generations.
	Limits
	// MaxKeys bounds the ledger (default 1,000,000 keys). Expired keys do
	// not count. Limits.MaxKeysPerTenant defaults to a tenth of it, and
	// Limits.MaxStrangerKeys to half.
	MaxKeys int
	// MissingBody is the policy for a committed key whose body is gone.
	MissingBody MissingBody
	// Now is the clock (default time.Now); tests replace it.
	Now func() time.Time
	// Logger receives what the store cannot answer for (default slog.Default()).
	Logger *slog.Logger
}

// DefaultConfig is the zero Config with its defaults filled in, less
// its clock and logger: the one place a default is written, which
// cmd/ssegate's flags take theirs from. The bounds derived from others
// (MaxKeysPerTenant, MaxStrangerKeys, and the Limits' per-tenant share
// and SealLiveBytes) are filled for the defaults they derive from.
func DefaultConfig() Config {
	var c Config
	c.setDefaults()
	c.Now, c.Logger = nil, nil
	return c
}

func (c *Config) setDefaults() {
	if c.TTL <= 0 {
		c.TTL = 24 * time.Hour
	}
	if c.FailedTTL <= 0 {
		c.FailedTTL = 5 * time.Minute
	}
	if c.MaxStoreBytes <= 0 {
		c.MaxStoreBytes = 512 << 20
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = 1_000_000
	}
	if c.MaxKeysPerTenant <= 0 {
		c.MaxKeysPerTenant = max(c.MaxKeys/10, 1)
	}
	if c.MaxStrangerKeys <= 0 {
		c.MaxStrangerKeys = max(c.MaxKeys/2, 1)
	}
	c.Limits.SetDefaults()
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Stats counts what the store did; all fields are cumulative except
// LiveBytes, LiveFlights and Keys.
type Stats struct {
	Commits     int64 // results committed to the ledger
	Stored      int64 // of those, bodies the body store admitted
	Rejected    int64 // bodies the body store refused (full, admission)
	Evicted     int64 // bodies the body store later evicted or expired
	BodyMissing int64 // lookups of committed keys whose body was gone
	Regenerated int64 // of those, keys handed out for a new generation
	Failed      int64 // generations that ended without a result
	LiveBytes   int64
	LiveFlights int64
	Keys        int64
	// ByState counts the ledger's keys in each state.
	ByState      map[State]int64
	StoredBytes  int64 // bytes the body store currently holds
	StoreEntries int64
	// The bounds, so that a dashboard can show how near they are:
	// Config.MaxLiveBytes, MaxStoreBytes and MaxKeys.
	MaxLiveBytes, MaxStoreBytes, MaxKeys int64
}

type entry struct {
	fp         string
	gen        uint64
	state      State
	flight     *Flight
	attempts   int
	lastStatus int
	model      string
	fallbacks  []Fallback
	events     int
	bytes      int
	bodyStored bool
	reason     string
	tool       string // the tool's name, for a tool call's key (BeginTool)
	created    time.Time
	updated    time.Time
	expires    time.Time // zero while live

	id     string      // its key in Memory.keys
	alias  string      // its key in Memory.aliases, or "" (alias.go)
	tenant *tenantKeys // its first account's part of the ledger (Scope.Account)
	// more are its other accounts' parts (Scope.Accounts), which count it
	// but do not keep it by expiry: at a bound they make room from the
	// ledger's expiries.
	more []*tenantKeys
	// at is its place in the ledger's expiries and in its tenant's, or
	// -1 where it is in neither (while live).
	at [2]int32
}

// tenantKeys is what the ledger holds of one account (Scope.Accounts; a
// tenant with no secret credential is its own), to bound its keys.
type tenantKeys struct {
	name string
	n    int // its keys in the ledger, expired ones not yet deleted included
	// own: those of them whose first account it is (entry.tenant), which
	// its known decides the strangers' count of.
	own int
	exp expiries // those of own that ended, by expiry
	// known: a key of the tenant committed while the ledger held one of
	// its keys (Limits.MaxStrangerKeys). Until then its keys count
	// among the strangers'.
	known bool
}

const (
	// sweepEvery is how often the sweeper deletes expired keys.
	sweepEvery = time.Second
	// sweepBatch bounds the keys the sweeper deletes before it lets
	// others have the ledger's lock: tens of microseconds of holding it.
	sweepBatch = 256
	// boundBatch bounds the expired keys that a new key at a bound
	// deletes: one makes room, a few more take work off the sweeper.
	boundBatch = 16
)

// Memory is the single-process store: a ledger in a map, live flights,
// and committed bodies in ristretto.
type Memory struct {
	cfg    Config
	bodies *ristretto.Cache[string, *blob]
	codec  *Codec
	// hot keeps decoded copies of recently replayed bodies, so a hot key's
	// replays and resumes do not decode its blob each time. Losing one
	// only costs a decode.
	hot *ristretto.Cache[string, *Result]

	// mu guards keys, the entries in it, tenants, exp, flights and
	// states. It is held for lookups and O(log n) updates only: nothing
	// that scales with the ledger or with a result is done under it.
	// What only reads (a hit, a join, a conflict, a new key refused at a
	// bound, Attach, Info, Stats) takes it shared, so that one tenant's
	// refused keys never make another tenant's hits wait.
	mu      sync.RWMutex
	keys    map[string]*entry
	aliases map[string]aliasEntry // by aliasID; each alias's entry has it as its alias
	tenants map[string]*tenantKeys
	exp     expiries        // the ended entries of keys, by expiry
	flights int64           // live flights
	states  map[State]int64 // keys per state
	// toolUnknowns counts the keys of tool calls in commit_unknown,
	// expired ones not yet deleted included.
	toolUnknowns int64
	// strangers counts the keys of tenants not known, expired ones not
	// yet deleted included (Limits.MaxStrangerKeys).
	strangers int

	journals    *Journals // live journal bytes, all and per tenant, and when they seal
	commits     atomic.Int64
	stored      atomic.Int64
	rejected    atomic.Int64
	evicted     atomic.Int64
	missing     atomic.Int64
	regenerated atomic.Int64
	failed      atomic.Int64
	storeBytes  atomic.Int64
	storeCount  atomic.Int64

	stop chan struct{}
	wg   sync.WaitGroup
}

// NewMemory returns a Memory store; Close releases it.
func NewMemory(cfg Config) (*Memory, error) {
	cfg.setDefaults()
	m := &Memory{
		cfg: cfg, keys: make(map[string]*entry), aliases: make(map[string]aliasEntry), tenants: make(map[string]*tenantKeys),
		states: make(map[State]int64), stop: make(chan struct{}),
	}
	// About ten counters per expected item; items average a few KiB.
	counters := max(cfg.MaxStoreBytes/4096*10, 10_000)
	codec, err := NewCodec(cfg.MaxStreamBytes)
	if err != nil {
		return nil, fmt.Errorf("body codec: %w", err)
	}
	m.codec = codec
	m.journals = NewJournals(cfg.Limits, cfg.Now)
	bodies, err := ristretto.NewCache(&ristretto.Config[string, *blob]{
		NumCounters: counters,
		MaxCost:     cfg.MaxStoreBytes,
		BufferItems: 64,
		// Result.cost already allows for the structure. Without this,
		// ristretto adds its own per-item size to the cost it reports to
		// OnEvict, and StoredBytes would drift below zero.
		IgnoreInternalCost: true,
		OnEvict: func(it *ristretto.Item[*blob]) {
			m.evicted.Add(1)
			m.storeBytes.Add(-it.Cost)
			m.storeCount.Add(-1)
		},
		OnReject: func(it *ristretto.Item[*blob]) { m.rejected.Add(1) },
	})
	if err != nil {
		return nil, fmt.Errorf("body store: %w", err)
	}
	m.bodies = bodies
	hot, err := ristretto.NewCache(&ristretto.Config[string, *Result]{
		NumCounters: 10_000, MaxCost: max(cfg.MaxStoreBytes/16, 1<<20), BufferItems: 64,
	})
	if err != nil {
		return nil, fmt.Errorf("hot body cache: %w", err)
	}
	m.hot = hot
	m.wg.Add(1)
	go m.sweep()
	return m, nil
}

// Close stops the sweeper and releases the body store.
func (m *Memory) Close() {
	close(m.stop)
	m.wg.Wait()
	m.bodies.Close()
	m.hot.Close()
	m.codec.Close()
}

// blob is a committed result as the body store keeps it: compressed (the
// chunks of one completion are nearly identical JSON), with the scope and
// generation to verify a lookup by (ristretto keeps only hashes of keys).
type blob struct {
	sc    Scope
	gen   uint64
	z     []byte
	trace string // Result.Trace, which the encoding leaves out
}

func (b *blob) cost() int64 { return int64(len(b.z)) + 128 }

// body returns the committed result of id when the body store still holds
// the one of generation gen.
func (m *Memory) body(id string, sc Scope, gen uint64) (*Result, bool) {
	b, ok := m.bodies.Get(id)
	if !ok || b.gen != gen || !b.sc.Same(sc) {
		return nil, false
	}
	if r, ok := m.hot.Get(id); ok && r.Gen == gen && r.Scope.Same(sc) {
		return r, true
	}
	r, err := m.codec.Decode(b.z, sc)
	if err != nil {
		m.cfg.Logger.Error("stored body of a committed key is unreadable", "scope", sc, "err", err.Error())
		return nil, false
	}
	r.Trace = b.trace
	m.hot.SetWithTTL(id, r, r.Cost(), m.cfg.TTL)
	return r, true
}

var lastGen atomic.Uint64

// nextGen returns a generation number larger than any before it in this
// process and than prev: the clock in milliseconds when it has moved on.
func nextGen(now time.Time, prev uint64) uint64 {
	for {
		last := lastGen.Load()
		g := max(uint64(now.UnixMilli()), last+1, prev+1)
		if lastGen.CompareAndSwap(last, g) {
			return g
		}
	}
}

// Begin takes the decision for one request with a key: it claims the key
// (Miss: the caller owns the returned Flight and must end it), or returns
// the live Flight to join, the Result to replay, or Conflict. It is atomic:
// among concurrent callers with the same scope exactly one gets Miss.
// A new key is refused with ErrTenantFull when its tenant holds
// MaxKeysPerTenant keys, and with ErrStoreFull when the ledger holds
// MaxKeys, or the strangers' keys MaxStrangerKeys and its tenant is a
// stranger; a new generation is refused with ErrStoreFull when the live
// journals hold MaxLiveBytes, or when its tenant is past its share of
// them (Limits.MaxLiveBytesPerTenant).
func (m *Memory) Begin(sc Scope, fp string) (Begun, error) { return m.beginTool(sc, fp, nil) }

// BeginTool is Begin for an MCP tool call t: a key whose call ended
// commit_unknown is Unknown (with fp) or Conflict (with another, and for
// Begin), until it expires (t.UnknownTTL) or is forgotten, rather than a
// Miss.
func (m *Memory) BeginTool(sc Scope, fp string, t Tool) (Begun, error) {
	return m.beginTool(sc, fp, &t)
}

func (m *Memory) beginTool(sc Scope, fp string, t *Tool) (Begun, error) {
	id := sc.ID()
	var gone uint64 // a committed generation found without its body
	for {
		b, hit, err := m.begin(id, sc, fp, gone, t)
		if hit == 0 {
			return b, err
		}
		// A hit reads and decodes its result outside the ledger's lock:
		// a large one takes milliseconds, and every tenant needs the lock.
		if r, ok := m.body(id, sc, hit); ok {
			return Begun{Decision: Hit, Result: r}, nil
		}
		m.missing.Add(1)
		if m.cfg.MissingBody == Refuse || t != nil {
			// A tool call that committed ran: its answer lost, it is
			// never run again to get another.
			return Begun{Decision: Gone}, nil
		}
		gone = hit // decide again: regenerate, unless the key moved on
	}
}

// begin is Begin's decision under the lock. For a committed key with the
// request's fingerprint it returns the generation whose result the caller
// reads (hit), or, when that is gone (its body was found missing), hands
// the key out for a new generation.
func (m *Memory) begin(id string, sc Scope, fp string, gone uint64, t *Tool) (b Begun, hit uint64, err error) {
	now := m.cfg.Now()
	m.mu.RLock()
	b, hit, decided, err := m.peekLocked(id, sc, fp, gone, now, t)
	m.mu.RUnlock()
	if decided {
		return b, hit, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.keys[id]
	if e != nil && !e.state.Live() && now.After(e.expires) {
		m.deleteLocked(e)
		e = nil
	}
	regenerated := false
	if e != nil {
		switch {
		case heldUnknown(e.state, e.tool):
			if t == nil || e.fp != fp {
				return Begun{Decision: Conflict}, 0, nil
			}
			return Begun{Decision: Unknown}, 0, nil
		case e.state == StateCancelled:
			return heldCancelled(e.fp, fp), 0, nil
		case e.state.Live():
			if e.fp != fp {
				return Begun{Decision: Conflict}, 0, nil
			}
			return Begun{Decision: Join, Flight: e.flight}, 0, nil
		case e.state == StateCommitted:
			if e.fp != fp {
				return Begun{Decision: Conflict}, 0, nil
			}
			if e.gen != gone {
				return Begun{}, e.gen, nil
			}
			m.regenerated.Add(1)
			regenerated = true
		}
	}
	if e == nil {
		if err := m.roomLocked(sc, now); err != nil {
			return Begun{}, 0, err
		}
	}
	if err := m.journals.Admit(sc); err != nil {
		return Begun{}, 0, err
	}
	var prev uint64
	if e != nil {
		prev = e.gen
	}
	f := m.journals.NewFlight((*memoryBackend)(m), sc, nextGen(now, prev), fp, t)
	// Its readers are all Subs of this process, so its blocks can go back
	// to the pools (Flight.freeLocked).
	f.j.pooled = true
	f.id = id
	ne := &entry{
		fp: fp, gen: f.Gen, state: StateIntentReceived, flight: f,
		created: now, updated: now, id: id,
	}
	if t != nil {
		ne.tool = t.Name
	}
	m.putLocked(sc, e, ne)
	m.flights++
	return Begun{Decision: Miss, Flight: f, Regenerated: regenerated}, 0, nil
}

// peekLocked is begin's decision where it changes nothing, under the
// read lock: a join, a conflict, a hit, or a new key refused by a bound
// that no expired key could make room under. decided is false when the
// decision must be taken under the write lock (a claim, an expired
// entry to delete).
func (m *Memory) peekLocked(id string, sc Scope, fp string, gone uint64, now time.Time, t *Tool) (b Begun, hit uint64, decided bool, err error) {
	e := m.keys[id]
	switch {
	case e != nil && heldUnknown(e.state, e.tool) && !now.After(e.expires):
		if t == nil || e.fp != fp {
			return Begun{Decision: Conflict}, 0, true, nil
		}
		return Begun{Decision: Unknown}, 0, true, nil
	case e != nil && e.state == StateCancelled && !now.After(e.expires):
		return heldCancelled(e.fp, fp), 0, true, nil
	case e == nil:
		t := m.tenants[sc.Account()]
		if t != nil && t.n >= m.cfg.MaxKeysPerTenant && !expiredTop(&t.exp, now) && (t.n == t.own || !expiredTop(&m.exp, now)) {
			return Begun{}, 0, true, tenantFull(t.n)
		}
		if len(sc.Accounts) > 1 && !expiredTop(&m.exp, now) {
			if n := m.fullerLocked(sc); n >= 0 {
				return Begun{}, 0, true, tenantFull(n)
			}
		}
		if len(m.keys) >= m.cfg.MaxKeys && !expiredTop(&m.exp, now) {
			return Begun{}, 0, true, storeFull(len(m.keys))
		}
		if (t == nil || !t.known) && m.strangers >= m.cfg.MaxStrangerKeys && !expiredTop(&m.exp, now) {
			return Begun{}, 0, true, strangersFull(m.strangers)
		}
	case !e.state.Live() && now.After(e.expires): // deleted under the write lock
	case e.state.Live() || e.state == StateCommitted:
		if e.fp != fp {
			return Begun{Decision: Conflict}, 0, true, nil
		}
		if e.state.Live() {
			return Begun{Decision: Join, Flight: e.flight}, 0, true, nil
		}
		if e.gen != gone {
			return Begun{}, e.gen, true, nil
		}
	}
	return Begun{}, 0, false, nil
}

// expiredTop reports whether the entry of h that expires first has
// expired by now.
func expiredTop(h *expiries, now time.Time) bool {
	return h.len() > 0 && now.After(h.top().expires)
}

func tenantFull(n int) error {
	return fmt.Errorf("this credential holds %d keys, the -max-keys-per-tenant bound: %w", n, ErrTenantFull)
}

// fullerLocked returns the keys of the first of sc's accounts after its
// first that holds MaxKeysPerTenant of them, or -1 when none does.
func (m *Memory) fullerLocked(sc Scope) int {
	for _, a := range sc.Accounts[1:] {
		if t := m.tenants[a]; t != nil && t.n >= m.cfg.MaxKeysPerTenant {
			return t.n
		}
	}
	return -1
}

func storeFull(n int) error {
	return fmt.Errorf("ledger holds %d keys, the -max-keys bound: %w", n, ErrStoreFull)
}

func strangersFull(n int) error {
	return fmt.Errorf("credentials none of whose keys has completed hold %d keys, the -max-stranger-keys bound; a credential with a completed key is not refused by it: %w", n, ErrStoreFull)
}

// roomLocked makes room for a new key of sc, or says which bound
// refuses it. Expired keys do not count against either bound: at one, it
// deletes those that expired first, a few at a time, so that a new key
// costs O(log n) whatever the size of the ledger. An account after the
// first makes room from the ledger's expiries (it keeps none of its
// own): one that holds its bound with some of them expired may refuse a
// key until the sweeper has deleted them, within sweepEvery.
func (m *Memory) roomLocked(sc Scope, now time.Time) error {
	tenant := sc.Account()
	t := m.tenants[tenant]
	if t != nil && t.n >= m.cfg.MaxKeysPerTenant {
		m.expireLocked(&t.exp, now, boundBatch)
		if t.n >= m.cfg.MaxKeysPerTenant && t.n > t.own {
			// some of its keys are kept by another account's expiries
			m.expireLocked(&m.exp, now, boundBatch)
		}
		if t.n >= m.cfg.MaxKeysPerTenant {
			return tenantFull(t.n)
		}
	}
	if len(m.keys) >= m.cfg.MaxKeys {
		m.expireLocked(&m.exp, now, boundBatch)
		if len(m.keys) >= m.cfg.MaxKeys {
			return storeFull(len(m.keys))
		}
	}
	if len(sc.Accounts) > 1 && m.fullerLocked(sc) >= 0 {
		m.expireLocked(&m.exp, now, boundBatch)
		if n := m.fullerLocked(sc); n >= 0 {
			return tenantFull(n)
		}
	}
	stranger := func() bool { t := m.tenants[tenant]; return t == nil || !t.known } // expiring may delete the tenant
	if stranger() && m.strangers >= m.cfg.MaxStrangerKeys {
		m.expireLocked(&m.exp, now, boundBatch)
		if stranger() && m.strangers >= m.cfg.MaxStrangerKeys {
			return strangersFull(m.strangers)
		}
	}
	return nil
}

// Attach finds what a resume reads: the live Flight or the committed
// Result of the key. With after set, after.Gen must be the key's current
// generation (else ErrGone) and after.Seq an event it had (else
// ErrPosition). With fp not empty, the key's fingerprint must match (else
// Conflict is reported as ErrConflict).
func (m *Memory) Attach(sc Scope, fp string, after sse.ID, hasAfter bool) (*Flight, *Result, error) {
	now := m.cfg.Now()
	id := sc.ID()
	m.mu.RLock()
	e := m.knownLocked(id, now)
	if e == nil {
		m.mu.RUnlock()
		return nil, nil, ErrNotFound
	}
	if fp != "" && e.fp != fp {
		m.mu.RUnlock()
		return nil, nil, ErrConflict
	}
	if hasAfter && after.Gen != e.gen {
		m.mu.RUnlock()
		return nil, nil, ErrGone
	}
	switch {
	case e.state.Live():
		f := e.flight
		m.mu.RUnlock()
		return f, nil, nil
	case e.state == StateCommitted:
		m.mu.RUnlock()
		r, ok := m.body(id, sc, e.gen)
		if !ok {
			m.missing.Add(1)
			return nil, nil, ErrGone
		}
		if hasAfter && r.Head.Stream && after.Seq > uint64(r.Events()) {
			return nil, nil, ErrPosition
		}
		return nil, r, nil
	default:
		m.mu.RUnlock()
		return nil, nil, ErrGone
	}
}

// knownLocked returns the ledger's entry of id, or nil when it holds none
// or only an expired one.
func (m *Memory) knownLocked(id string, now time.Time) *entry {
	e := m.keys[id]
	if e == nil || (!e.state.Live() && now.After(e.expires)) {
		return nil
	}
	return e
}

// EndsNoFlight says that a Memory store never ends a flight itself: only
// its generation does (a client awaiting a head need not watch it).
func (*Memory) EndsNoFlight() {}

// Info returns what the ledger knows of a key.
func (m *Memory) Info(sc Scope) (KeyInfo, bool) {
	now := m.cfg.Now()
	id := sc.ID()
	m.mu.RLock()
	e := m.knownLocked(id, now)
	if e == nil {
		m.mu.RUnlock()
		return KeyInfo{}, false
	}
	ki := KeyInfo{
		State: e.state, Generation: e.gen, Attempts: e.attempts, LastStatus: e.lastStatus,
		Events: e.events, Bytes: e.bytes, Reason: e.reason, Model: e.model, Fallbacks: e.fallbacks, Tool: e.tool,
		Created: e.created, Updated: e.updated, Expires: e.expires,
	}
	f := e.flight
	m.mu.RUnlock()
	if f != nil {
		ki.Events = f.Events()
	}
	if ki.State == StateCommitted {
		b, ok := m.bodies.Get(id)
		ki.BodyStored = ok && b.gen == ki.Generation && b.sc.Same(sc)
	}
	return ki, true
}

// Stats returns the store's counters.
func (m *Memory) Stats() Stats {
	m.mu.RLock()
	keys, flights := int64(len(m.keys)), m.flights
	byState := make(map[State]int64, len(m.states))
	for s, n := range m.states {
		byState[s] = n
	}
	m.mu.RUnlock()
	return Stats{
		Commits: m.commits.Load(), Stored: m.stored.Load(), Rejected: m.rejected.Load(),
		Evicted: m.evicted.Load(), BodyMissing: m.missing.Load(), Regenerated: m.regenerated.Load(),
		Failed: m.failed.Load(), LiveBytes: m.journals.Bytes(), LiveFlights: flights, Keys: keys, ByState: byState,
		StoredBytes: m.storeBytes.Load(), StoreEntries: m.storeCount.Load(),
		MaxLiveBytes: m.cfg.MaxLiveBytes, MaxStoreBytes: m.cfg.MaxStoreBytes, MaxKeys: int64(m.cfg.MaxKeys),
	}
}

// DropBody removes a committed body from the body store, as an eviction
// would; the ledger keeps the commit. It exists for tests and operators.
func (m *Memory) DropBody(sc Scope) {
	id := sc.ID()
	b, ok := m.bodies.Get(id)
	m.bodies.Del(id)
	m.bodies.Wait()
	if ok {
		// Del does not call OnEvict: count the removal here.
		m.evicted.Add(1)
		m.storeBytes.Add(-b.cost())
		m.storeCount.Add(-1)
	}
}

// memoryBackend is Memory as the Backend of its flights.
type memoryBackend Memory

var _ Backend = (*memoryBackend)(nil)

func (b *memoryBackend) Reserve(f *Flight, n int) error { return b.journals.Reserve(f, n) }
func (b *memoryBackend) Release(f *Flight, n int)       { b.journals.Release(f, n) }
func (b *memoryBackend) Commit(f *Flight, res *Result) bool {
	return (*Memory)(b).commit(f, res)
}
func (b *memoryBackend) Fail(f *Flight, state State, reason string) {
	(*Memory)(b).fail(f, state, reason)
}
func (b *memoryBackend) Mark(f *Flight, state State, attempts, lastStatus int) {
	(*Memory)(b).mark(f, state, attempts, lastStatus)
}

func (m *Memory) commit(f *Flight, res *Result) bool {
	id := f.id
	stored := false
	if z, err := m.codec.Encode(res); err == nil {
		b := &blob{sc: f.Scope, gen: f.Gen, z: z, trace: res.Trace}
		cost := b.cost()
		// Set is asynchronous and may drop or later reject the item: wait
		// for it to be applied, then look, so the ledger knows whether it
		// is held.
		m.bodies.SetWithTTL(id, b, cost, f.KeepFor(StateCommitted, m.cfg.TTL, m.cfg.FailedTTL))
		m.bodies.Wait()
		got, ok := m.bodies.Get(id)
		stored = ok && got == b
		if stored {
			m.storeBytes.Add(cost)
			m.storeCount.Add(1)
		}
	}
	m.commits.Add(1)
	if stored {
		m.stored.Add(1)
	}
	now := m.cfg.Now()
	m.mu.Lock()
	if e := m.keys[id]; e != nil && e.flight == f {
		m.setStateLocked(e, StateCommitted)
		if t := e.tenant; !t.known {
			t.known = true
			m.strangers -= t.own
		}
		e.flight = nil
		e.events = res.Events()
		e.bytes = res.dataSize()
		e.bodyStored = stored
		e.updated = now
		m.expireAtLocked(e, now.Add(f.KeepFor(StateCommitted, m.cfg.TTL, m.cfg.FailedTTL)))
		m.flights--
	}
	m.mu.Unlock()
	return stored
}

func (m *Memory) fail(f *Flight, state State, reason string) {
	now := m.cfg.Now()
	m.failed.Add(1)
	denied := f.Denied()
	m.mu.Lock()
	if e := m.keys[f.id]; e != nil && e.flight == f && denied {
		// Its clients hold the flight, which has the answer: the ledger
		// forgets the key (Flight.Deny).
		m.deleteLocked(e)
		m.flights--
	} else if e != nil && e.flight == f {
		m.setStateLocked(e, state)
		e.flight = nil
		e.reason = reason
		e.events = f.Events()
		e.updated = now
		m.expireAtLocked(e, now.Add(f.KeepFor(state, m.cfg.TTL, m.cfg.FailedTTL)))
		m.flights--
	}
	m.mu.Unlock()
}

func (m *Memory) mark(f *Flight, state State, attempts, lastStatus int) {
	now := m.cfg.Now()
	m.mu.Lock()
	if e := m.keys[f.id]; e != nil && e.flight == f {
		m.setStateLocked(e, state)
		e.attempts = attempts
		if lastStatus != 0 {
			e.lastStatus = lastStatus
		}
		e.model, e.fallbacks = f.Model()
		e.updated = now
	}
	m.mu.Unlock()
}

// sweep deletes expired ledger entries, so the ledger's size follows the
// keys in use rather than every key ever seen.
func (m *Memory) sweep() {
	defer m.wg.Done()
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.sweepExpired()
		}
	}
}

// sweepExpired deletes every expired key, sweepBatch at a time, letting
// others take the lock between batches.
func (m *Memory) sweepExpired() {
	for {
		m.mu.Lock()
		n := m.expireLocked(&m.exp, m.cfg.Now(), sweepBatch)
		m.mu.Unlock()
		if n < sweepBatch {
			return
		}
		select {
		case <-m.stop:
			return
		default:
		}
		runtime.Gosched()
	}
}

// expireLocked deletes up to limit entries of h that have expired by now,
// those that expired first first, and returns how many it deleted.
func (m *Memory) expireLocked(h *expiries, now time.Time, limit int) int {
	n := 0
	for n < limit && h.len() > 0 && now.After(h.top().expires) {
		m.deleteLocked(h.top())
		n++
	}
	return n
}

// putLocked makes e the entry of its key, in place of old (nil for a key
// the ledger does not hold), and counts it for each of sc's accounts.
func (m *Memory) putLocked(sc Scope, old, e *entry) {
	e.at = [2]int32{-1, -1}
	if old != nil {
		m.unscheduleLocked(old)
		m.unaliasLocked(old)
		m.countLocked(old, -1)
		e.tenant, e.more = old.tenant, old.more
	} else {
		account := func(name string) *tenantKeys {
			t := m.tenants[name]
			if t == nil {
				t = &tenantKeys{name: name, exp: expiries{which: 1}}
				m.tenants[name] = t
			}
			t.n++
			return t
		}
		t := account(sc.Account())
		t.own++
		if !t.known {
			m.strangers++
		}
		e.tenant = t
		if len(sc.Accounts) > 1 {
			e.more = make([]*tenantKeys, len(sc.Accounts)-1)
			for i, a := range sc.Accounts[1:] {
				e.more[i] = account(a)
			}
		}
	}
	m.keys[e.id] = e
	m.countLocked(e, 1)
}

// expireAtLocked sets when an entry that ended expires.
func (m *Memory) expireAtLocked(e *entry, t time.Time) {
	m.unscheduleLocked(e)
	e.expires = t
	m.exp.push(e)
	e.tenant.exp.push(e)
}

// unscheduleLocked takes e out of the expiries it is in.
func (m *Memory) unscheduleLocked(e *entry) {
	if e.at[0] >= 0 {
		m.exp.remove(e)
	}
	if e.at[1] >= 0 {
		e.tenant.exp.remove(e)
	}
}

func (m *Memory) setStateLocked(e *entry, s State) {
	m.countLocked(e, -1)
	e.state = s
	m.countLocked(e, 1)
}

// countLocked adds d to the counts that e's state is part of: by state,
// and of the tool calls held unknown.
func (m *Memory) countLocked(e *entry, d int64) {
	m.states[e.state] += d
	if heldUnknown(e.state, e.tool) {
		m.toolUnknowns += d
	}
}

// ToolUnknowns returns how many tool calls' keys hold commit_unknown.
func (m *Memory) ToolUnknowns() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.toolUnknowns
}

// Forget deletes a key that is not running, whatever it ended in, and
// its stored answer: ErrLive while it runs, ErrNotFound when the ledger
// holds nothing for it.
func (m *Memory) Forget(sc Scope) error {
	id := sc.ID()
	now := m.cfg.Now()
	m.mu.Lock()
	e := m.knownLocked(id, now)
	switch {
	case e == nil:
		m.mu.Unlock()
		return ErrNotFound
	case e.state.Live():
		m.mu.Unlock()
		return ErrLive
	}
	m.deleteLocked(e)
	// The body goes under the lock: once it is released a new generation
	// of the key may be claimed and commit, and a deletion after that
	// would take its answer. ristretto applies a Del and a later Set of
	// the key in their order, so the commit's Set, which comes after
	// this unlock, is never undone; Wait, which may take a while, is left
	// out of the lock.
	b, ok := m.bodies.Get(id)
	m.bodies.Del(id)
	m.hot.Del(id)
	m.mu.Unlock()
	m.bodies.Wait()
	if ok {
		m.storeBytes.Add(-b.cost())
		m.storeCount.Add(-1)
	}
	return nil
}

func (m *Memory) deleteLocked(e *entry) {
	m.unscheduleLocked(e)
	m.countLocked(e, -1)
	delete(m.keys, e.id)
	m.unaliasLocked(e)
	t := e.tenant
	t.n--
	t.own--
	if !t.known {
		m.strangers--
	}
	if t.n == 0 {
		delete(m.tenants, t.name)
	}
	for _, t := range e.more {
		if t.n--; t.n == 0 {
			delete(m.tenants, t.name)
		}
	}
}
