// Package redis is the store of several replicas: the claim, the live
// journals, the committed results and the owner leases are kept in Redis
// (or Valkey, standalone or a Cluster), so that a request can start on
// one replica and be joined or resumed on another. Store returns the
// same Flight and Result types as cache.Memory, so the proxy cannot tell
// the stores apart.
//
// It is a store backend of package cache (cache/backend.go): its owners
// and followers are the cache.Backend of the flights it makes with
// cache.Journals, it mirrors a journal through Flight.WireSince and copies
// another replica's with Flight.AppendWire, and keeps results with
// cache.Codec; it never touches a flight's lock or fields. Its Lua
// scripts (scripts.go, quota.go) each take their arguments from one
// struct, named in locals at the script's top. docs/redis.md is the
// design.
package redis
