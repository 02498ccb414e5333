package cache

import (
	"sync/atomic"
	"time"
)

// Limits bound what a store holds; both stores take them. Zero fields
// take the defaults beside them.
type Limits struct {
	// MaxLiveBytes bounds the bytes of all live journals together, on this
	// process (default 256 MiB).
	MaxLiveBytes int64
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

func (l *Limits) setDefaults() {
	if l.MaxLiveBytes <= 0 {
		l.MaxLiveBytes = 256 << 20
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
