package cache

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/klauspost/compress/zstd"
)

// A committed result is kept in Redis as one compressed blob rather than
// as the stream of its events: the JSON envelope of LLM chunks repeats
// itself so much that a blob is tens of times smaller (REDIS.md §1), and
// a replay is one GET.
//
// Layout: "SG" 2 (version), uvarint length of what follows once
// decompressed, then zstd frames of: uvarint gen, uvarint head length,
// head JSON, uvarint input and output tokens, uvarint event count, the
// event end offsets as uvarint deltas, then the encoded events (or the
// non-streaming body). The events of a stream are the journal's own
// packed blocks, one frame each; zstd frames decode to the concatenation
// of their contents. Version 1 (one frame, no length) is still read. The
// memory store keeps its bodies the same way.

var (
	blobMagic   = []byte{'S', 'G', 2}
	blobMagicV1 = []byte{'S', 'G', 1}
)

var errBlob = errors.New("malformed result blob")

// blobCodec compresses and decompresses blobs. zstd's EncodeAll and
// DecodeAll are safe for concurrent use, so one codec serves the store.
type blobCodec struct {
	enc        *zstd.Encoder
	dec        *zstd.Decoder
	maxDecoded uint64
}

func newBlobCodec(maxBytes int, level zstd.EncoderLevel) (*blobCodec, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(level), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	// A blob never holds more than one stream's bound, plus its ends and
	// head; the limit stops a corrupt or hostile blob from ballooning.
	maxDecoded := uint64(maxBytes)*2 + 1<<20
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(maxDecoded))
	if err != nil {
		return nil, err
	}
	return &blobCodec{enc: enc, dec: dec, maxDecoded: maxDecoded}, nil
}

func (c *blobCodec) close() {
	c.enc.Close()
	c.dec.Close()
}

func (c *blobCodec) encode(r *Result) ([]byte, error) {
	head, err := json.Marshal(r.Head)
	if err != nil {
		return nil, err
	}
	p := make([]byte, 0, len(r.Data)+len(head)+2*len(r.Ends)+32) // Data is nil while packed
	p = binary.AppendUvarint(p, r.Gen)
	p = binary.AppendUvarint(p, uint64(len(head)))
	p = append(p, head...)
	p = binary.AppendUvarint(p, uint64(max(r.Usage.Input, 0)))
	p = binary.AppendUvarint(p, uint64(max(r.Usage.Output, 0)))
	p = binary.AppendUvarint(p, uint64(len(r.Ends)))
	prev := uint32(0)
	for _, e := range r.Ends {
		p = binary.AppendUvarint(p, uint64(e-prev))
		prev = e
	}
	out := append([]byte(nil), blobMagic...)
	out = binary.AppendUvarint(out, uint64(len(p)+r.dataSize()))
	if r.packed != nil {
		// The events as the journal packed them.
		out = c.enc.EncodeAll(p, out)
		for _, f := range r.packed {
			out = append(out, f...)
		}
		return out, nil
	}
	p = append(p, r.Data...)
	return c.enc.EncodeAll(p, out), nil
}

func (c *blobCodec) decode(b []byte, sc Scope) (*Result, error) {
	var dst []byte
	switch {
	case bytes.HasPrefix(b, blobMagic):
		b = b[len(blobMagic):]
		n, k := binary.Uvarint(b)
		if k <= 0 || n > c.maxDecoded {
			return nil, errBlob
		}
		// Sized at once: growing it frame by frame would copy it over
		// and over.
		dst, b = make([]byte, 0, n), b[k:]
	case bytes.HasPrefix(b, blobMagicV1):
		b = b[len(blobMagicV1):]
	default:
		return nil, errBlob
	}
	p, err := c.dec.DecodeAll(b, dst)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBlob, err)
	}
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			return 0, false
		}
		p = p[n:]
		return v, true
	}
	r := &Result{Scope: sc}
	var ok bool
	if r.Gen, ok = next(); !ok {
		return nil, errBlob
	}
	hl, ok := next()
	if !ok || hl > uint64(len(p)) {
		return nil, errBlob
	}
	if err := json.Unmarshal(p[:hl], &r.Head); err != nil {
		return nil, fmt.Errorf("%w: head: %v", errBlob, err)
	}
	p = p[hl:]
	in, ok1 := next()
	out, ok2 := next()
	if !ok1 || !ok2 {
		return nil, errBlob
	}
	r.Usage = Usage{Input: int64(in), Output: int64(out)}
	n, ok := next()
	if !ok || n > uint64(len(p)) {
		return nil, errBlob
	}
	if n > 0 {
		r.Ends = make([]uint32, n)
	}
	end := uint64(0)
	for i := range r.Ends {
		d, ok := next()
		if !ok {
			return nil, errBlob
		}
		end += d
		r.Ends[i] = uint32(end)
	}
	if end > uint64(len(p)) || (n > 0 && end != uint64(len(p))) {
		return nil, errBlob
	}
	r.Data = p
	return r, nil
}
