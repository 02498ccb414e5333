package proxy

import (
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/redis"
	"github.com/ssegate/ssegate/sse"
)

// Store is what the proxy needs from a store of keys. Every method is safe
// for concurrent use.
//
// Begin is the claim: among concurrent calls for one scope, exactly one
// returns cache.Miss, and its caller must end the returned Flight (Commit
// or Fail). Attach finds the live flight or committed result a resume
// reads, returning cache.ErrNotFound, cache.ErrGone, cache.ErrPosition or
// cache.ErrConflict as those errors document. Errors other than those
// mean the store itself failed.
type Store interface {
	Begin(sc cache.Scope, fingerprint string) (cache.Begun, error)
	Attach(sc cache.Scope, fingerprint string, after sse.ID, hasAfter bool) (*cache.Flight, *cache.Result, error)
	Info(sc cache.Scope) (cache.KeyInfo, bool)
}

// passiveStore is a Store that never ends a flight itself (cache.Memory):
// only its generation does. A store without it may (a Redis store fences
// a generation whose lease it lost), so a client awaiting a head watches
// the flight too (origin.attach).
type passiveStore interface {
	EndsNoFlight()
}

// The stores implement what the proxy asks of them by interface: a
// method that drifts from one fails the build here rather than an
// assertion, silently, at run time. (A Redis store is no passiveStore:
// TestPassiveStores holds that.)
var (
	_ Store        = (*cache.Memory)(nil)
	_ Store        = (*redis.Store)(nil)
	_ ToolStore    = (*cache.Memory)(nil)
	_ ToolStore    = (*redis.Store)(nil)
	_ aliasStore   = (*cache.Memory)(nil)
	_ aliasStore   = (*redis.Store)(nil)
	_ passiveStore = (*cache.Memory)(nil)
	_ pinger       = (*redis.Store)(nil)
	_ redisStore   = (*redis.Store)(nil)
)

// The metrics read a Memory store's counters through this (storeCollector).
var _ interface{ Stats() cache.Stats } = (*cache.Memory)(nil)
