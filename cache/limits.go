package cache

// Limits bound what a store holds for live generations; both stores take
// them. Zero fields take the defaults beside them.
type Limits struct {
	// MaxLiveBytes bounds the bytes of all live journals together, on this
	// process (default 256 MiB).
	MaxLiveBytes int64
	// MaxStreamBytes bounds one generation's journal (default 16 MiB).
	MaxStreamBytes int
	// MaxSubscribers bounds the local clients following one live
	// generation (default 1024).
	MaxSubscribers int
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
}
