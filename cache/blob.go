package cache

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// A committed result is kept in Redis as one compressed blob rather than
// as the stream of its events: the JSON envelope of LLM chunks repeats
// itself so much that a blob is tens of times smaller (docs/redis.md, Committed results), and
// a replay is one GET. The memory store keeps its bodies the same way.
//
// Layout: "SG" 3 (version), uvarint length of what follows once
// decompressed, the CRC-32C of the rest (4 bytes, little-endian: S2
// blocks carry no checksum, and a damaged blob must not replay as some
// other stream), then frames, each a uvarint length and an S2 block
// (klauspost/compress/s2, the block format). Decompressed, the frames
// follow on from one another: uvarint gen, uvarint head length, head
// JSON, uvarint input and output tokens, uvarint event count, the event
// end offsets as uvarint deltas, then the encoded events (or the
// non-streaming body). The events of a stream are the frames the journal
// packed them into at commit (journal.frames). Versions 1 and 2, one or
// more zstd frames, are still read.

var (
	blobMagic   = []byte{'S', 'G', 3}
	blobMagicV2 = []byte{'S', 'G', 2}
	blobMagicV1 = []byte{'S', 'G', 1}
)

var errBlob = errors.New("malformed result blob")

// Codec encodes a committed Result as a blob, and decodes one; one codec
// serves a store from any goroutine. It is part of what a store backend
// uses of this package (Backend): Memory keeps its bodies so too.
type Codec struct {
	legacy     *zstd.Decoder // for versions 1 and 2
	maxDecoded uint64
}

// NewCodec returns a codec for the results of streams of at most
// maxBytes (Limits.MaxStreamBytes); Close releases it.
func NewCodec(maxBytes int) (*Codec, error) {
	// A blob never holds more than one stream's bound, plus its ends and
	// head; the limit stops a corrupt or hostile blob from ballooning.
	maxDecoded := uint64(maxBytes)*2 + 1<<20
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(maxDecoded))
	if err != nil {
		return nil, err
	}
	return &Codec{legacy: dec, maxDecoded: maxDecoded}, nil
}

// Close releases the codec's decoder.
func (c *Codec) Close() { c.legacy.Close() }

// meta encodes what a blob holds before the events.
func (c *Codec) meta(r *Result) ([]byte, error) {
	head, err := json.Marshal(r.Head)
	if err != nil {
		return nil, err
	}
	p := make([]byte, 0, len(head)+2*len(r.Ends)+32)
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
	return p, nil
}

// Encode returns r as a blob. A result just committed from a journal is
// taken packed, as it is.
func (c *Codec) Encode(r *Result) ([]byte, error) {
	p, err := c.meta(r)
	if err != nil {
		return nil, err
	}
	// One allocation: the blocks are compressed in place (appendBlock),
	// into room for the largest each can be.
	frames := r.packed
	data := frames == nil && len(r.Data) > 0
	size := len(blobMagic) + 2*binary.MaxVarintLen64 + 4 + s2.MaxEncodedLen(len(p))
	for _, f := range frames {
		size += binary.MaxVarintLen64 + len(f)
	}
	if data {
		size += binary.MaxVarintLen64 + s2.MaxEncodedLen(len(r.Data))
	}
	out := append(make([]byte, 0, size), blobMagic...)
	out = binary.AppendUvarint(out, uint64(len(p)+r.dataSize()))
	sum := len(out)
	out = append(out, 0, 0, 0, 0)
	out = appendBlock(out, p)
	for _, f := range frames {
		out = appendFrame(out, f)
	}
	if data {
		out = appendBlock(out, r.Data)
	}
	binary.LittleEndian.PutUint32(out[sum:], crc32.Checksum(out[sum+4:], castagnoli))
	return out, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func appendFrame(out, f []byte) []byte {
	return append(binary.AppendUvarint(out, uint64(len(f))), f...)
}

// appendBlock appends src as a frame of its own, S2-compressed: the
// frame appendFrame(out, s2.Encode(nil, src)) appends, made without a
// buffer of its own when out has room for binary.MaxVarintLen64 +
// s2.MaxEncodedLen(len(src)) bytes more. The block is compressed past the
// room of the longest length, then moved up to follow its own.
func appendBlock(out, src []byte) []byte {
	at := len(out) + binary.MaxVarintLen64
	room := s2.MaxEncodedLen(len(src))
	if room < 0 || cap(out)-at < room {
		return appendFrame(out, s2.Encode(nil, src))
	}
	enc := s2.Encode(out[at:at+room], src)
	out = binary.AppendUvarint(out, uint64(len(enc)))
	n := copy(out[len(out):cap(out)], enc) // overlapping: copy moves
	return out[:len(out)+n]
}

// unframe decompresses the frames of a version 3 blob into one buffer of
// the length the blob gives, refusing one that would pass the bound.
func (c *Codec) unframe(b []byte) ([]byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > c.maxDecoded || len(b) < k+4 {
		return nil, errBlob
	}
	b = b[k:]
	if binary.LittleEndian.Uint32(b) != crc32.Checksum(b[4:], castagnoli) {
		return nil, fmt.Errorf("%w: checksum mismatch", errBlob)
	}
	dst, b := make([]byte, 0, n), b[4:]
	for len(b) > 0 {
		fl, k := binary.Uvarint(b)
		if k <= 0 || fl > uint64(len(b)-k) {
			return nil, errBlob
		}
		f := b[k : k+int(fl)]
		b = b[k+int(fl):]
		var err error
		if dst, err = appendDecoded(dst, f); err != nil {
			return nil, err
		}
	}
	if uint64(len(dst)) != n {
		return nil, errBlob
	}
	return dst, nil
}

// appendDecoded decodes the S2 block f after dst's bytes, in dst's spare
// capacity, which must hold it.
func appendDecoded(dst, f []byte) ([]byte, error) {
	dl, err := s2.DecodedLen(f)
	if err != nil || dl > cap(dst)-len(dst) {
		return nil, errBlob
	}
	if _, err := s2.Decode(dst[len(dst):len(dst)+dl], f); err != nil {
		return nil, fmt.Errorf("%w: %v", errBlob, err)
	}
	return dst[:len(dst)+dl], nil
}

// Decode returns the result a blob holds, of the key sc, unpacked; an
// error for a blob that is damaged or past the codec's bound.
func (c *Codec) Decode(b []byte, sc Scope) (*Result, error) {
	var p []byte
	var err error
	switch {
	case bytes.HasPrefix(b, blobMagic):
		if p, err = c.unframe(b[len(blobMagic):]); err != nil {
			return nil, err
		}
	case bytes.HasPrefix(b, blobMagicV2):
		b = b[len(blobMagicV2):]
		n, k := binary.Uvarint(b)
		if k <= 0 || n > c.maxDecoded {
			return nil, errBlob
		}
		p, err = c.legacy.DecodeAll(b[k:], make([]byte, 0, n))
	case bytes.HasPrefix(b, blobMagicV1):
		p, err = c.legacy.DecodeAll(b[len(blobMagicV1):], nil)
	default:
		return nil, errBlob
	}
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
