package cache

import "errors"

// Errors a caller branches on.
var (
	// ErrNotFound: the store holds nothing for the scope.
	ErrNotFound = errors.New("stream not found")
	// ErrGone: the position names a generation that aborted, was replaced,
	// or whose body is no longer held.
	ErrGone = errors.New("stream gone")
	// ErrPosition: the position names the right generation but an event it
	// never had.
	ErrPosition = errors.New("position beyond the stream")
	// ErrStreamTooLarge: one generation exceeded the bytes allowed per stream.
	ErrStreamTooLarge = errors.New("stream exceeds the per-stream byte bound")
	// ErrStoreFull: the live journals together hold the byte bound, or the
	// ledger holds its maximum number of keys.
	ErrStoreFull = errors.New("store is full")
	// ErrTenantFull: the tenant holds its maximum number of keys
	// (Limits.MaxKeysPerTenant), so a new key of its is refused; other
	// tenants' new keys are not. It is not ErrStoreFull.
	ErrTenantFull = errors.New("too many keys for one tenant")
	// ErrTooManyFollowers: the flight has its maximum number of
	// subscribers (-max-followers); the store itself has room.
	ErrTooManyFollowers = errors.New("too many followers of one stream")
	// ErrConflict: the key belongs to a request with another fingerprint.
	ErrConflict = errors.New("key used with another request")
	// ErrEnded: the generation has already ended; nothing more may be added.
	ErrEnded = errors.New("generation already ended")
	// ErrUnavailable is wrapped by the errors of a store that could not
	// reach its backing service (Redis down, too slow, or refusing). The
	// proxy answers 503 store_unavailable; it is never ErrStoreFull, since
	// waiting for room would not help.
	ErrUnavailable = errors.New("store unavailable")
)
