package cache

import (
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/s2"
	"github.com/ssegate/ssegate/sse"
)

// journalBlock is the size of a journal block (after the first two, of a
// quarter and a half of it): a score of typical events. The open block
// is most of what a live journal holds; a larger one packs a little
// better (S2: 0.08 of the raw bytes at 8 KiB, 0.12 at 4 KiB, for the
// mock's stream).
const journalBlock = 4 << 10

// journal is the append-only sequence of one generation's encoded events.
// It is kept in blocks that are filled in order and never rewritten, so
// growing it never copies what it holds, and a slice handed to a reader
// stays valid while the journal grows (a pooled journal's, until that
// reader reads again: see Flight.freeLocked). An event never spans two
// blocks.
//
// A full block that every reader has read may be sealed: kept as an S2
// block (the chunks of one completion are nearly identical JSON, so a
// block packs to about a tenth), and unpacked again only for a reader
// that joins or resumes that far behind. Its flight seals only when
// memory asks for it (Limits.SealStreamBytes, SealAge, SealLiveBytes):
// a short, young stream keeps its blocks raw and costs no compression
// until its commit packs it (frames), which it does as well either way.
// A sealing journal holds its open block, and a little per sealed one.
// The store counts a journal's raw bytes against MaxLiveBytes, sealed or
// not: the bound holds whatever was sealed.
type journal struct {
	blocks [][]byte // the open (last) block; a sealed block's entry is nil
	packed [][]byte // each sealed block, compressed (nil for the open one)
	starts []int    // offset of each block's first byte in the whole journal
	ends   []uint32 // end offset in the whole journal of each event from base on
	size   int      // bytes held
	// The events before base are forgotten (recycle); event base starts
	// at offset baseOff. Both stay 0 in a journal that keeps everything.
	base, baseOff int
	// Blocks before sealed are sealed, or, with discard set, dropped: the
	// journal of a flight no one can join keeps nothing its one reader
	// has read, and reuses its memory once that reader is done with it
	// (recycle).
	sealed  int
	discard bool
	// small counts, for a discard journal, the catch-ups in a row whose
	// reads filled a quarter of its block or less (recycle).
	small int
	// pooled: the raw blocks go back to the pools once no reader holds
	// them (Flight.freeLocked); a sealed one waits in retired, from block
	// retiredAt on, until every reader has read past it again.
	pooled    bool
	retired   [][]byte
	retiredAt int
	// The sealed block unpacked last, for readers behind the open block.
	unpackedIdx int // its index + 1; 0: none
	unpacked    []byte
}

// Blocks of the three sizes room makes come from pools, and a journal
// gives its blocks back (free) once nothing can read them any more: the
// journal of a keyed stream is otherwise garbage at its end, most of the
// bytes a keyed relay allocates. Who may give them back is the flight's
// rule (Flight.freeLocked). The pools hold arrays, which go in and out of
// an interface without an allocation.
var (
	quarterBlocks = sync.Pool{New: func() any { return new([journalBlock >> 2]byte) }}
	halfBlocks    = sync.Pool{New: func() any { return new([journalBlock >> 1]byte) }}
	fullBlocks    = sync.Pool{New: func() any { return new([journalBlock]byte) }}
)

// poisonFreed, when set (PoisonFreedBlocks), has free overwrite each block
// it gives back, so that a reader that kept a slice of it reads garbage.
var poisonFreed atomic.Bool

// PoisonFreedBlocks makes every journal block given back to the pools be
// overwritten first, for tests: a reader that kept a slice of the journal
// past its Sub's Close then reads 0xEE bytes (and the race detector sees
// the write), where it would otherwise read what another stream wrote
// there later.
func PoisonFreedBlocks() { poisonFreed.Store(true) }

// newBlock returns an empty block of capacity size, from a pool when it
// is one of the sizes room makes.
func newBlock(size int) []byte {
	switch size {
	case journalBlock >> 2:
		return quarterBlocks.Get().(*[journalBlock >> 2]byte)[:0]
	case journalBlock >> 1:
		return halfBlocks.Get().(*[journalBlock >> 1]byte)[:0]
	case journalBlock:
		return fullBlocks.Get().(*[journalBlock]byte)[:0]
	}
	return make([]byte, 0, size)
}

// freeBlock gives b back to its pool, when it has a pool's size; b must
// start where its memory does (a block as newBlock or make returned it).
func freeBlock(b []byte) {
	b = b[:cap(b)]
	if poisonFreed.Load() {
		for i := range b {
			b[i] = 0xEE
		}
	}
	switch len(b) {
	case journalBlock >> 2:
		quarterBlocks.Put((*[journalBlock >> 2]byte)(b))
	case journalBlock >> 1:
		halfBlocks.Put((*[journalBlock >> 1]byte)(b))
	case journalBlock:
		fullBlocks.Put((*[journalBlock]byte)(b))
	}
}

// free gives the journal's raw blocks back to the pools and keeps only
// where its events end: it reads nothing after, until refill. Its caller
// knows that no slice of it is held any more.
func (j *journal) free() {
	for i, b := range j.blocks {
		if b != nil {
			freeBlock(b)
		}
		j.blocks[i], j.packed[i] = nil, nil
	}
	for i, b := range j.retired {
		freeBlock(b)
		j.retired[i] = nil
	}
	j.retired = j.retired[:0]
	if j.unpacked != nil {
		freeBlock(j.unpacked)
	}
	j.unpackedIdx, j.unpacked = 0, nil
	j.blocks, j.packed, j.starts, j.sealed = j.blocks[:0], j.packed[:0], j.starts[:0], 0
}

// refill makes a freed journal read again, from data, the bytes it held
// (a committed result's), in one block of its own.
func (j *journal) refill(data []byte) {
	j.blocks = append(j.blocks[:0], data)
	j.packed = append(j.packed[:0], nil)
	j.starts = append(j.starts[:0], j.baseOff)
}

// packScratch holds buffers pack encodes into, so that what is packed is
// then kept at its exact size.
var packScratch = sync.Pool{New: func() any { return new([]byte) }}

// pack returns b as an S2 block. S2 rather than zstd: sealing is on the
// path of live events, and S2 packs these blocks about five times faster
// and unpacks them four times faster, for a little less compression.
func pack(b []byte) []byte {
	buf := packScratch.Get().(*[]byte)
	if n := s2.MaxEncodedLen(len(b)); cap(*buf) < n {
		*buf = make([]byte, n)
	}
	p := append([]byte(nil), s2.Encode((*buf)[:cap(*buf)], b)...)
	packScratch.Put(buf)
	return p
}

// seal packs block i, which is full.
func (j *journal) seal(i int) {
	j.packed[i] = pack(j.blocks[i])
	j.blocks[i] = nil
}

// settle seals (or drops) the full blocks that lie wholly before event
// index pos, the position of the slowest reader. A pooled journal keeps
// a sealed block's raw memory in retired until unretire gives it back.
func (j *journal) settle(pos int) {
	off := j.start(pos)
	for j.sealed < len(j.blocks)-1 && j.starts[j.sealed+1] <= off {
		switch {
		case j.discard:
			j.blocks[j.sealed] = nil
		case j.pooled:
			if len(j.retired) == 0 {
				j.retiredAt = j.sealed
			}
			j.retired = append(j.retired, j.blocks[j.sealed])
			j.seal(j.sealed)
		default:
			j.seal(j.sealed)
		}
		j.sealed++
	}
}

// unretire gives back the retired blocks that lie wholly before event
// index held, the first event a reader may still hold a slice of.
func (j *journal) unretire(held int) {
	if len(j.retired) == 0 {
		return
	}
	off, k := j.start(held), 0
	for k < len(j.retired) && j.starts[j.retiredAt+k+1] <= off {
		freeBlock(j.retired[k])
		k++
	}
	if k > 0 {
		n := copy(j.retired, j.retired[k:])
		clear(j.retired[n:])
		j.retired, j.retiredAt = j.retired[:n], j.retiredAt+k
	}
}

// recycle, for a journal with discard set whose one reader has read all
// of it and holds none of it any more, starts the journal over in its
// open block's memory: the journal of a stream no one can join then stays
// one block however long the stream, and allocates none while its reader
// keeps up. What came since the last catch-up (a round: at saturation,
// the score of events of one upstream read) sizes the block: a round
// that did not fit one block has the next start in one that holds it
// (up to maxRound), so that a stream whose reads bring many events
// allocates once, not at every read. A block larger than the first size
// is let go when smallRounds rounds in a row filled a quarter of it or
// less (the burst, or the backlog of events before the client's
// connection was taken over, passed), or at once after a backlog past
// maxRound or when it was made for one event larger than a burst grows a
// block to (up to -max-event-bytes), so that a paced stream returns to a
// first-size block.
// Nothing of what the journal held is kept, not even where its blocks or
// events ended.
func (j *journal) recycle() {
	k := len(j.blocks)
	if !j.discard || k == 0 {
		return
	}
	b := j.blocks[k-1]
	round := j.size - j.baseOff
	j.base, j.baseOff, j.ends = j.events(), j.size, j.ends[:0]
	clear(j.blocks)
	j.blocks, j.packed, j.starts, j.sealed = j.blocks[:0], j.packed[:0], j.starts[:0], 0
	small := len(b) <= cap(b)/4
	if small && round == len(b) {
		j.small++
	} else {
		j.small = 0
	}
	switch {
	case round > len(b) && round <= maxRound: // it took more than one block
		size := journalBlock >> 2
		for size < round+round/4 {
			size *= 2
		}
		if cap(b) < size {
			b = make([]byte, 0, size)
		}
	case cap(b) > journalBlock>>2 && small && (round > maxRound || j.small >= smallRounds || cap(b) > maxRound+maxRound/4):
		j.small = 0
		return // room starts a first-size block
	}
	j.blocks = append(j.blocks, b[:0])
	j.packed = append(j.packed, nil)
	j.starts = append(j.starts, j.size)
}

// maxRound bounds the rounds a discard journal's block grows to hold
// (recycle): past it, the reader was behind, not reading a burst.
const maxRound = 3 * journalBlock

// smallRounds is how many rounds in a row that fill a quarter of a grown
// block or less let it go (recycle).
const smallRounds = 16

// block returns the bytes of block i, unpacking a sealed one.
func (j *journal) block(i int) []byte {
	if b := j.blocks[i]; b != nil {
		return b
	}
	if j.unpackedIdx != i+1 {
		b, err := s2.Decode(make([]byte, j.blockLen(i)), j.packed[i])
		if err != nil {
			panic("cache: a sealed journal block does not unpack: " + err.Error()) // it was packed here
		}
		j.unpackedIdx, j.unpacked = i+1, b
	}
	return j.unpacked
}

// blockLen is the number of bytes in block i.
func (j *journal) blockLen(i int) int {
	if i+1 < len(j.starts) {
		return j.starts[i+1] - j.starts[i]
	}
	return len(j.blocks[i])
}

// room makes the last block able to take n more bytes.
func (j *journal) room(n int) {
	if j.has(n) {
		return
	}
	k := len(j.blocks)
	// The first blocks are smaller, so that a short stream holds little.
	size := journalBlock >> max(2-k, 0)
	j.blocks = append(j.blocks, newBlock(max(size, n)))
	j.packed = append(j.packed, nil)
	j.starts = append(j.starts, j.size)
}

// has reports whether the last block can take n more bytes.
func (j *journal) has(n int) bool {
	k := len(j.blocks)
	return k > 0 && cap(j.blocks[k-1])-len(j.blocks[k-1]) >= n
}

// eventBound is an upper bound of AppendEvent's output for typ and data.
func eventBound(typ, data string) int {
	return linesBound(typ, data, 1+strings.Count(data, "\n")+strings.Count(data, "\r"))
}

// linesBound is eventBound for data of at most lines lines.
func linesBound(typ, data string, lines int) int {
	return len("id: ") + 41 + len("\nevent: \n") + len(typ) + len(data) + lines*len("data: \n") + 1
}

// appendEvent encodes one event at the end; it fails, leaving the journal
// as it was, when the journal would pass limit bytes.
func (j *journal) appendEvent(id sse.ID, typ, data string, limit int) (int, error) {
	return j.appendOf(id, typ, data, false, limit)
}

// appendOf is appendEvent; oneLine says data holds no line break
// (sse.AppendLineEvent).
func (j *journal) appendOf(id sse.ID, typ, data string, oneLine bool, limit int) (int, error) {
	// Counting data's lines takes two passes over it: they are spared
	// when the block has room for data made of line breaks only.
	switch {
	case oneLine:
		j.room(linesBound(typ, data, 1))
	case !j.has(linesBound(typ, data, len(data)+1)):
		j.room(eventBound(typ, data))
	}
	b := &j.blocks[len(j.blocks)-1]
	before := len(*b)
	if oneLine {
		*b = sse.AppendLineEvent(*b, id, typ, data)
	} else {
		*b = sse.AppendEvent(*b, id, typ, data)
	}
	n := len(*b) - before
	if j.size+n > limit {
		*b = (*b)[:before]
		return 0, ErrStreamTooLarge
	}
	j.size += n
	j.ends = append(j.ends, uint32(j.size))
	return n, nil
}

// appendWire adds an event that is already encoded.
func (j *journal) appendWire(wire []byte, limit int) error {
	if j.size+len(wire) > limit {
		return ErrStreamTooLarge
	}
	j.room(len(wire))
	b := &j.blocks[len(j.blocks)-1]
	*b = append(*b, wire...)
	j.size += len(wire)
	j.ends = append(j.ends, uint32(j.size))
	return nil
}

// drop undoes the last append (its bytes stay in the block, unused).
func (j *journal) drop(n int) {
	b := &j.blocks[len(j.blocks)-1]
	*b = (*b)[:len(*b)-n]
	j.size -= n
	j.ends = j.ends[:len(j.ends)-1]
}

func (j *journal) events() int { return j.base + len(j.ends) }

// start returns the offset of event i's first byte (i >= base).
func (j *journal) start(i int) int {
	if i == j.base {
		return j.baseOff
	}
	return int(j.ends[i-j.base-1])
}

// span returns the bytes of the events from index from on, up to index
// to, that lie in the block where event from is, and the index after the
// last of them: a reader calls again for the rest. Its capacity ends
// where it does: the rest of a pooled block may hold another stream's
// bytes.
func (j *journal) span(from, to int) ([]byte, int) {
	if from >= to {
		return nil, from
	}
	off := j.start(from)
	bi := sort.Search(len(j.starts), func(i int) bool { return j.starts[i] > off }) - 1
	blockEnd := j.starts[bi] + j.blockLen(bi)
	k := from
	for k < to && j.start(k+1) <= blockEnd {
		k++
	}
	b, e := off-j.starts[bi], j.start(k)-j.starts[bi]
	return j.block(bi)[b:e:e], k
}

// event returns the bytes of event i.
func (j *journal) event(i int) []byte {
	p, _ := j.span(i, i+1)
	return p
}

// commitFrame bounds the bytes one frame of a committed result packs. A
// result is packed once and kept for long, so in frames larger than the
// journal's blocks, which S2 packs much better (the mock's stream: 0.05
// of its raw bytes in 64 KiB frames, 0.12 in 4 KiB ones).
const commitFrame = 64 << 10

var frameScratch = sync.Pool{New: func() any { return new([]byte) }}

// frames returns the whole journal as S2 blocks whose contents, in order,
// are its bytes, each of up to commitFrame bytes.
func (j *journal) frames() [][]byte {
	buf := frameScratch.Get().(*[]byte)
	raw := (*buf)[:0]
	out := make([][]byte, 0, j.size/commitFrame+1)
	for i, b := range j.blocks {
		n := j.blockLen(i)
		if len(raw) > 0 && len(raw)+n > commitFrame {
			out, raw = append(out, pack(raw)), raw[:0]
		}
		if b != nil {
			raw = append(raw, b...)
			continue
		}
		var err error
		if raw, err = appendDecoded(slices.Grow(raw, n), j.packed[i]); err != nil {
			panic("cache: a sealed journal block does not unpack: " + err.Error()) // it was packed here
		}
	}
	if len(raw) > 0 {
		out = append(out, pack(raw))
	}
	*buf = raw[:0]
	frameScratch.Put(buf)
	return out
}
