package proxy

import (
	"context"

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
	_ stopStore    = (*redis.Store)(nil)
)

// A generation is what a stop of its tenant ends (Flight.SetStopper).
var _ cache.Stopper = (*gen)(nil)

// The metrics read a Memory store's counters through this (storeCollector).
var _ interface{ Stats() cache.Stats } = (*cache.Memory)(nil)

// pinger is a store that can tell whether it is reachable.
type pinger interface {
	Ping(ctx context.Context) error
}

// ToolStore is what MCP tool calls need of the Store besides Begin
// (cache.Memory and redis.Store have it): BeginTool holds a call whose
// outcome is unknown, Forget clears a key that is not running (DELETE
// /keys/{key}), ToolUnknowns counts the held calls. Safe for concurrent
// use; errors as Begin's.
type ToolStore interface {
	BeginTool(sc cache.Scope, fingerprint string, t cache.Tool) (cache.Begun, error)
	Forget(sc cache.Scope) error
	ToolUnknowns() int64
}

// redisStore is what the metrics read of a Redis store.
type redisStore interface {
	Stats() redis.Stats
	UnknownKeys() (int64, error)
}

// aliasStore is what a store offers for the Responses API's ids
// (responses.go): both cache stores do.
type aliasStore interface {
	SetAlias(sc cache.Scope, gen uint64, name string, base int64)
	ResolveAlias(tenant, name string) (cache.Alias, bool)
}
