// Package cache holds what ssegate knows about idempotency keys: the
// ledger of every key's state, the live generations (journals with
// subscribers) and the committed results.
//
// The ledger and the body store are two things. The ledger is a map this
// package controls; it decides claims and knows every key's state, so a
// committed body that the bounded body store (ristretto) refused or evicted
// is known to be gone rather than silently missing. Claims and live
// journals are never kept in ristretto.
//
// Memory is the single-process store. Its Flight type is the journal that
// any store uses to fan a generation out to local subscribers. A store
// that keeps its ledger elsewhere (cache/redis) is a backend of this
// package's flights, over the interface backend.go exports for one; this
// package knows nothing of Redis.
package cache
