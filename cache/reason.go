package cache

// The reasons a store gives when it ends a flight itself (Flight.Fail):
// they become the ledger's reason, the log's and, after the first event,
// the stream_aborted code. The proxy has a cause for each; Reasons lets
// its test tell.
const (
	// ReasonShutdown: the store closed while a tail copied the generation.
	ReasonShutdown = "shutdown"
	// ReasonGenerationLost: the replica that ran the generation stopped,
	// or another took the generation over, before it ended.
	ReasonGenerationLost = "generation_lost"
	// ReasonStoreUnavailable: the store could not be reached for as long
	// as the generation's lease (or a claim's reply was lost).
	ReasonStoreUnavailable = "store_unavailable"
	// ReasonMaxStreamBytes: a copy of the generation outgrew the bytes
	// allowed per stream (ErrStreamTooLarge).
	ReasonMaxStreamBytes = "max_stream_bytes"
	// ReasonStoreFull: a copy of the generation found the live journals
	// full (ErrStoreFull).
	ReasonStoreFull = "store_full"
	// ReasonUncleanEnd: a copy of a failed generation lacks events its
	// owner had, so that it cannot pass for the provider's own end.
	ReasonUncleanEnd = "unclean_end"
)

// Reasons lists every reason a store gives.
var Reasons = []string{
	ReasonShutdown, ReasonGenerationLost, ReasonStoreUnavailable,
	ReasonMaxStreamBytes, ReasonStoreFull, ReasonUncleanEnd,
}
