package cache

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
}
