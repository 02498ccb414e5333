package cache

import (
	"sort"
	"strings"

	"github.com/ssegate/ssegate/sse"
)

// journalBlock is the size of a journal block: a few dozen typical events.
const journalBlock = 8 << 10

// journal is the append-only sequence of one generation's encoded events.
// It is kept in blocks that are filled in order and never rewritten, so
// growing it never copies what it holds, and a slice handed to a reader
// stays valid while the journal grows. An event never spans two blocks.
type journal struct {
	blocks [][]byte // only the last has room left
	starts []int    // offset of each block's first byte in the whole journal
	ends   []uint32 // end offset of each event in the whole journal
	size   int      // bytes held
}

// room makes the last block able to take n more bytes.
func (j *journal) room(n int) {
	if k := len(j.blocks); k > 0 && cap(j.blocks[k-1])-len(j.blocks[k-1]) >= n {
		return
	}
	j.blocks = append(j.blocks, make([]byte, 0, max(journalBlock, n)))
	j.starts = append(j.starts, j.size)
}

// eventBound is an upper bound of AppendEvent's output for typ and data.
func eventBound(typ, data string) int {
	lines := 1 + strings.Count(data, "\n") + strings.Count(data, "\r")
	return len("id: ") + 41 + len("\nevent: \n") + len(typ) + len(data) + lines*len("data: \n") + 1
}

// appendEvent encodes one event at the end; it fails, leaving the journal
// as it was, when the journal would pass limit bytes.
func (j *journal) appendEvent(id sse.ID, typ, data string, limit int) (int, error) {
	j.room(eventBound(typ, data))
	b := &j.blocks[len(j.blocks)-1]
	before := len(*b)
	*b = sse.AppendEvent(*b, id, typ, data)
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

func (j *journal) events() int { return len(j.ends) }

func (j *journal) start(i int) int {
	if i == 0 {
		return 0
	}
	return int(j.ends[i-1])
}

// span returns the bytes of the events from index from on, up to index
// to, that lie in the block where event from is, and the index after the
// last of them: a reader calls again for the rest.
func (j *journal) span(from, to int) ([]byte, int) {
	if from >= to {
		return nil, from
	}
	off := j.start(from)
	bi := sort.Search(len(j.starts), func(i int) bool { return j.starts[i] > off }) - 1
	blockEnd := j.starts[bi] + len(j.blocks[bi])
	k := from
	for k < to && int(j.ends[k]) <= blockEnd {
		k++
	}
	return j.blocks[bi][off-j.starts[bi] : int(j.ends[k-1])-j.starts[bi]], k
}

// event returns the bytes of event i.
func (j *journal) event(i int) []byte {
	p, _ := j.span(i, i+1)
	return p[:len(p):len(p)]
}

// bytes returns the whole journal as one slice of its exact size.
func (j *journal) bytes() []byte {
	out := make([]byte, 0, j.size)
	for _, b := range j.blocks {
		out = append(out, b...)
	}
	return out
}
