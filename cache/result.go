package cache

// Result is a committed answer: the head and, for a stream, the encoded
// events with their ids; for a non-streaming answer, the body.
type Result struct {
	// Scope is kept so a lookup can verify the key (ristretto keeps only
	// hashes of keys).
	Scope Scope
	Gen   uint64
	Head  Head
	Data  []byte
	Ends  []uint32
	// Usage is what the upstream reported; a replay saves that many tokens.
	Usage Usage
	// Trace is the traceparent of the generation's request (Flight.SetTrace),
	// kept in memory only: a result read back from Redis has none.
	Trace string

	// packed, for a result just committed from a journal, holds Data as
	// S2 blocks, in order (journal.frames), and Data is nil until unpack:
	// a store that keeps results compressed takes the frames as they are.
	packed [][]byte
	size   int // len(Data), also while packed
}

// dataSize returns the length of Data, packed or not.
func (r *Result) dataSize() int {
	if r.packed != nil {
		return r.size
	}
	return len(r.Data)
}

// Unpack makes Data of a result committed from a journal, whose events
// are packed until then: a store calls it before it keeps a result to
// serve.
func (r *Result) Unpack() error {
	if r.packed == nil {
		return nil
	}
	data := make([]byte, 0, r.size)
	for _, f := range r.packed {
		var err error
		if data, err = appendDecoded(data, f); err != nil {
			return err
		}
	}
	if len(data) != r.size {
		return errBlob
	}
	r.Data, r.packed = data, nil
	return nil
}

// Events returns the number of events of a streamed result.
func (r *Result) Events() int { return len(r.Ends) }

// After returns the encoded events after seq (0 for all).
func (r *Result) After(seq uint64) ([]byte, error) {
	if !r.Head.Stream {
		return r.Data, nil
	}
	if seq > uint64(len(r.Ends)) {
		return nil, ErrPosition
	}
	if seq == 0 {
		return r.Data, nil
	}
	return r.Data[r.Ends[seq-1]:], nil
}

// Cost is what the result weighs in a body store: its bytes plus a
// fixed allowance for the structure itself.
func (r *Result) Cost() int64 {
	n := int64(r.dataSize()) + 4*int64(len(r.Ends)) + 256
	for _, h := range r.Head.Header {
		n += int64(len(h.Name) + len(h.Value))
	}
	return n
}
