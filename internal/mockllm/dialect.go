package mockllm

// dialect renders one answer in one provider's wire format. Implementations
// precompute what repeats in every content event, so that streaming a token
// is a few appends into a reused buffer and allocates nothing.
type dialect interface {
	// events is the number of events in a clean stream, the terminal one
	// included.
	events() int
	// appendEvent appends event i (0 <= i < events()), SSE framing included.
	appendEvent(dst []byte, i int) []byte
	// appendError appends the in-stream error that ends a stream after sent
	// events, with whatever the provider sends after it.
	appendError(dst []byte, sent int) []byte
	// appendBody appends the non-streaming JSON answer.
	appendBody(dst []byte) []byte
}
