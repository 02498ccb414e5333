package cache

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Limits bound what a store holds; both stores take them. Zero fields
// take the defaults beside them.
type Limits struct {
	// MaxLiveBytes bounds the bytes of all live journals together, on this
	// process (default 256 MiB).
	MaxLiveBytes int64
	// MaxLiveBytesPerTenant is one tenant's share of MaxLiveBytes
	// (default a quarter of it). A tenant within its share may fill the
	// live journals up to MaxLiveBytes. A tenant past it holds more only
	// while one share of MaxLiveBytes stays free: past that its streams
	// that grow are stopped (ErrStoreFull), and its new keys are refused
	// (ErrStoreFull, before any upstream call) while less than two shares
	// are free. So one tenant's many long streams stop themselves, never
	// another tenant's stream that is within its share.
	MaxLiveBytesPerTenant int64
	// MaxStreamBytes bounds one generation's journal (default 16 MiB).
	MaxStreamBytes int
	// MaxSubscribers bounds the local clients following one live
	// generation (default 1024).
	MaxSubscribers int
	// MaxKeysPerTenant bounds the unexpired keys one tenant holds, live,
	// committed or failed: past it, that tenant's new keys are refused
	// with ErrTenantFull, while its known keys, and every other tenant's
	// keys, are decided as usual. It keeps one tenant from filling the
	// ledger (failed keys are cheap to make and kept for FailedTTL).
	// Default: a tenth of Config.MaxKeys for Memory; 100,000 for Redis.
	MaxKeysPerTenant int
	// MaxStrangerKeys bounds the unexpired keys of strangers together: a
	// tenant is a stranger until one of its keys commits (its credential
	// was taken and answered), and stays known while the ledger holds a
	// key of its, or, with Redis, for TTL after its last commit. Past the
	// bound strangers' new keys are refused with ErrStoreFull, while known
	// tenants still have the rest of MaxKeys: a flood of minted
	// credentials cannot refuse a known tenant's new key. Default: half of
	// the store's MaxKeys.
	MaxStrangerKeys int

	// A live journal seals (S2-compresses) a full block its readers have
	// all read only when memory asks for it, so that a stream that is
	// short, young and alone costs no compression on the path of its
	// events (its result is compressed once, at commit). The three bounds
	// below say when memory asks; each is consulted when a block fills.
	//
	// SealStreamBytes: a journal that holds this many bytes seals from
	// then on (default 128 KiB: at most that much, plus the open block, of
	// a stream is held raw for its age).
	SealStreamBytes int
	// SealAge: a journal whose generation began this long ago seals from
	// then on (default 1 minute).
	SealAge time.Duration
	// SealLiveBytes: while the live journals together hold this many
	// bytes (as reserved against MaxLiveBytes, raw), every journal seals
	// the blocks it fills (default 8 MiB, or half of MaxLiveBytes if that
	// is less). Few streams, such as a saturated relay's dozens, stay
	// below it and cost no compression; many paced ones pass it, and
	// their journals then take about a tenth of their raw bytes.
	SealLiveBytes int64
}

func (l *Limits) SetDefaults() {
	if l.MaxLiveBytes <= 0 {
		l.MaxLiveBytes = 256 << 20
	}
	if l.MaxLiveBytesPerTenant <= 0 {
		l.MaxLiveBytesPerTenant = max(l.MaxLiveBytes/4, 1)
	}
	if l.MaxStreamBytes <= 0 {
		l.MaxStreamBytes = 16 << 20
	}
	if l.MaxSubscribers <= 0 {
		l.MaxSubscribers = 1024
	}
	if l.MaxKeysPerTenant <= 0 {
		l.MaxKeysPerTenant = 100_000
	}
	if l.SealStreamBytes <= 0 {
		l.SealStreamBytes = 128 << 10
	}
	if l.SealAge <= 0 {
		l.SealAge = time.Minute
	}
	if l.SealLiveBytes <= 0 {
		l.SealLiveBytes = min(8<<20, l.MaxLiveBytes/2)
	}
}

// sealPolicy is what a store's flights consult, when a journal block
// fills, to decide whether to seal (Limits, SealStreamBytes and after).
// One serves all of a store's flights.
type sealPolicy struct {
	streamBytes int
	age         time.Duration
	now         func() time.Time
	live        *atomic.Int64 // the bytes the store has reserved for live journals
	liveBytes   int64
}

func newSealPolicy(l Limits, now func() time.Time, live *atomic.Int64) *sealPolicy {
	return &sealPolicy{streamBytes: l.SealStreamBytes, age: l.SealAge, now: now, live: live, liveBytes: l.SealLiveBytes}
}

// wants reports whether a journal that holds size bytes, of a generation
// that began at started, is to seal: once it holds streamBytes, or began
// age ago, or while the live journals together hold liveBytes. The first
// two, once true, stay true.
func (p *sealPolicy) wants(size int, started time.Time) bool {
	return size >= p.streamBytes || p.now().Sub(started) >= p.age || p.live.Load() >= p.liveBytes
}

// liveShares accounts the bytes of a store's live journals, all together
// and per account, against Limits.MaxLiveBytes and each account's share
// of it (MaxLiveBytesPerTenant, which says the rule). A flight's bytes
// count against every account of its scope (Scope.Charged): a tenant
// that adds or varies credentials still holds its real credential's
// bytes, and is held to its share.
type liveShares struct {
	max, share int64
	total      atomic.Int64

	mu      sync.Mutex // guards tenants and their flights counts
	tenants map[string]*tenantLive
}

// tenantLive is one account's live journal bytes. A flight holds its
// accounts' from its start to its end (enter, release).
type tenantLive struct {
	name    string
	n       atomic.Int64
	flights int // live flights of the account; guarded by liveShares.mu
}

func newLiveShares(l Limits) *liveShares {
	return &liveShares{max: l.MaxLiveBytes, share: l.MaxLiveBytesPerTenant, tenants: make(map[string]*tenantLive)}
}

// admit reports whether a new generation of a scope with accounts may
// begin: not while the live journals are full, nor while one of its
// accounts holds more than its share and less than two shares are free
// (its streams would soon be stopped, so its call is refused before it
// goes out rather than paid and cut).
func (l *liveShares) admit(accounts []string) error {
	if err := l.full(); err != nil {
		return err
	}
	total := l.total.Load()
	if total < l.max-2*l.share {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range accounts {
		t := l.tenants[a]
		if t == nil {
			continue
		}
		if mine := t.n.Load(); mine >= l.share {
			return fmt.Errorf("this credential's live journals hold %d bytes, past its -max-live-bytes-per-tenant share of %d, and less than two shares of -max-live-bytes are free: %w", mine, l.share, ErrStoreFull)
		}
	}
	return nil
}

// full reports ErrStoreFull while the live journals hold MaxLiveBytes.
func (l *liveShares) full() error {
	if total := l.total.Load(); total >= l.max {
		return fmt.Errorf("live journals hold %d bytes, the -max-live-bytes bound: %w", total, ErrStoreFull)
	}
	return nil
}

// enter returns the accounts' holds for a flight that begins; the
// flight's release (leave) ends them.
func (l *liveShares) enter(accounts []string) []*tenantLive {
	ts := make([]*tenantLive, len(accounts))
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, a := range accounts {
		t := l.tenants[a]
		if t == nil {
			t = &tenantLive{name: a}
			l.tenants[a] = t
		}
		t.flights++
		ts[i] = t
	}
	return ts
}

// reserve accounts n more bytes of a flight of ts: refused when they
// would pass MaxLiveBytes, or, when one of its accounts is past its
// share, leave less than one share free.
func (l *liveShares) reserve(ts []*tenantLive, n int) error {
	total := l.total.Add(int64(n))
	bound := l.max
	var mine int64
	for _, t := range ts {
		if m := t.n.Add(int64(n)); m > l.share {
			bound = l.max - l.share
			mine = max(mine, m)
		}
	}
	if total <= bound {
		return nil
	}
	l.total.Add(-int64(n))
	for _, t := range ts {
		t.n.Add(-int64(n))
	}
	if bound < l.max {
		return fmt.Errorf("this credential's live journals would hold %d bytes, past its -max-live-bytes-per-tenant share of %d, with less than one share of -max-live-bytes free: %w", mine, l.share, ErrStoreFull)
	}
	return fmt.Errorf("live journals would exceed %d bytes: %w", l.max, ErrStoreFull)
}

// leave returns the n bytes a flight of ts still held, as it ends.
func (l *liveShares) leave(ts []*tenantLive, n int) {
	l.total.Add(-int64(n))
	if len(ts) == 0 {
		return
	}
	for _, t := range ts {
		t.n.Add(-int64(n))
	}
	l.mu.Lock()
	for _, t := range ts {
		if t.flights--; t.flights == 0 {
			delete(l.tenants, t.name)
		}
	}
	l.mu.Unlock()
}
