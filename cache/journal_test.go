package cache

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/ssegate/ssegate/sse"
)

// TestJournalSealedBlocks: full blocks that every reader has passed are
// kept packed, and every span,
// event and the whole journal read back byte for byte what was appended,
// whichever blocks they lie in and in whatever order they are read.
func TestJournalSealedBlocks(t *testing.T) {
	t.Parallel()
	var j journal
	var want []byte
	var ends []int
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 1500 {
		data := fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"%s"}}]}`,
			strings.Repeat("x", rng.IntN(200)))
		if i%500 == 499 {
			data = strings.Repeat("y", 3*journalBlock) // larger than a block
		}
		id := sse.ID{Gen: 7, Seq: uint64(i + 1)}
		if _, err := j.appendEvent(id, "", data, 1<<30); err != nil {
			t.Fatal(err)
		}
		want = sse.AppendEvent(want, id, "", data)
		ends = append(ends, len(want))
	}
	if raw := len(j.blocks) - j.sealed; raw < 2 {
		t.Fatalf("%d raw blocks before any reader passed them; want all kept raw", raw)
	}
	j.settle(len(ends)) // every reader is past them
	sealed, packedBytes := 0, 0
	for i := range j.packed {
		if j.packed[i] != nil {
			sealed++
			packedBytes += len(j.packed[i])
			if j.blocks[i] != nil {
				t.Fatalf("block %d is sealed and still held raw", i)
			}
		}
	}
	if sealed < len(j.blocks)-1 || sealed == 0 {
		t.Fatalf("%d of %d blocks sealed; want all but the open one", sealed, len(j.blocks))
	}
	if packedBytes*4 > len(want) {
		t.Fatalf("sealed blocks take %d bytes for %d raw; want under a quarter", packedBytes, len(want))
	}
	frames := j.frames()
	framed := 0
	for _, f := range frames {
		framed += len(f)
	}
	if len(frames) < 2 || framed >= packedBytes {
		t.Fatalf("%d frames of %d bytes for %d raw; want several, packed tighter than the %d bytes of sealed blocks", len(frames), framed, len(want), packedBytes)
	}
	res := &Result{packed: frames, size: j.size}
	if err := res.Unpack(); err != nil || !bytes.Equal(res.Data, want) {
		t.Fatalf("the journal's frames (what a commit stores) differ from what was appended: %v", err)
	}
	start := func(i int) int {
		if i == 0 {
			return 0
		}
		return ends[i-1]
	}
	for range 300 {
		from := rng.IntN(len(ends))
		to := from + 1 + rng.IntN(len(ends)-from)
		var got []byte
		for k := from; k < to; {
			var p []byte
			p, k = j.span(k, to)
			got = append(got, p...)
		}
		if !bytes.Equal(got, want[start(from):ends[to-1]]) {
			t.Fatalf("span(%d, %d) differs", from, to)
		}
		if ev := j.event(from); !bytes.Equal(ev, want[start(from):ends[from]]) {
			t.Fatalf("event(%d) differs", from)
		}
	}
}

// TestDetachedJournalDrops: a flight no one can join keeps only what its
// one reader has not read, and the reader still gets every event once.
func TestDetachedJournalDrops(t *testing.T) {
	t.Parallel()
	f, s := detachedStream(t)
	var want, got []byte
	for i := range 2000 {
		data := fmt.Sprintf(`{"choices":[{"index":0,"delta":{"content":"token %d"}}]}`, i)
		if _, err := f.Append("", data); err != nil {
			t.Fatal(err)
		}
		want = sse.AppendEvent(want, sse.ID{}, "", data)
		if i%7 == 0 { // the reader keeps up in batches
			for p, _ := s.Read(); len(p) > 0; p, _ = s.Read() {
				got = append(got, p...)
			}
		}
		held := 0
		for _, b := range f.j.blocks {
			held += cap(b)
		}
		if held > 2*journalBlock {
			t.Fatalf("after %d events the journal holds %d bytes of blocks; want at most two blocks", i+1, held)
		}
	}
	if len(f.j.blocks) > 2 || len(f.j.starts) > 2 {
		t.Fatalf("the journal keeps %d blocks' places; want what is not read only", len(f.j.blocks))
	}
	f.Commit(nil)
	for p, ended := s.Read(); len(p) > 0 || !ended; p, ended = s.Read() {
		got = append(got, p...)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the reader got %d bytes; want the %d appended", len(got), len(want))
	}
}

// A paced stream without a key, read event by event as the generation
// writes its client, lives in one first-size block from start to end, and
// returns to one smallRounds reads after a backlog (events before its
// client was taken over); it keeps the end offset of no event its reader
// has read.
func TestDetachedJournalRecycles(t *testing.T) {
	t.Parallel()
	f, s := detachedStream(t)
	event := func(i int) string {
		return fmt.Sprintf(`{"choices":[{"index":0,"delta":{"content":"token %d"}}]}`, i)
	}
	var want []byte
	for i := range 60 { // the backlog: nobody reads yet
		if _, err := f.Append("", event(i)); err != nil {
			t.Fatal(err)
		}
		want = sse.AppendEvent(want, sse.ID{}, "", event(i))
	}
	var got []byte
	for p, _ := s.Read(); len(p) > 0; p, _ = s.Read() {
		got = append(got, p...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the backlog read back differs")
	}
	for i := 60; i < 5000; i++ {
		if _, err := f.Append("", event(i)); err != nil {
			t.Fatal(err)
		}
		p, _ := s.Read()
		if want := sse.AppendEvent(nil, sse.ID{}, "", event(i)); !bytes.Equal(p, want) {
			t.Fatalf("event %d: read %q; want %q", i, p, want)
		}
		if p, _ := s.Read(); len(p) != 0 {
			t.Fatalf("event %d: a second read got %d bytes", i, len(p))
		}
		if got := f.Events(); got != i+1 {
			t.Fatalf("event %d: the flight counts %d events; want %d", i, got, i+1)
		}
		if len(f.j.ends) > 1 {
			t.Fatalf("event %d: the journal keeps the ends of %d events; want only the unread one", i, len(f.j.ends))
		}
		if i < 60+smallRounds {
			continue // the block grown for the backlog goes once it was mostly empty for smallRounds reads
		}
		if len(f.j.blocks) != 1 || cap(f.j.blocks[0]) != journalBlock>>2 {
			t.Fatalf("event %d: %d blocks, the open one of %d bytes; want one first-size block (%d), reused", i, len(f.j.blocks), cap(f.j.blocks[len(f.j.blocks)-1]), journalBlock>>2)
		}
	}
}

// A reader on a goroutine of its own, done with each slice before it
// reads again, never sees bytes the generation reused under it (run with
// -race: reuse must happen after the reader's next Read).
func TestDetachedJournalReuseIsSafe(t *testing.T) {
	t.Parallel()
	f, s := detachedStream(t)
	const n = 20000
	var want []byte
	for i := range n {
		want = sse.AppendEvent(want, sse.ID{}, "", strings.Repeat("x", i%300)+strconv.Itoa(i))
	}
	done := make(chan []byte)
	go func() {
		var got []byte
		for {
			<-s.C()
			for {
				p, ended := s.Read()
				got = append(got, p...) // in place, before the next Read
				if ended {
					done <- got
					return
				}
				if len(p) == 0 {
					break
				}
			}
		}
	}()
	for i := range n {
		if _, err := f.Append("", strings.Repeat("x", i%300)+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	f.Commit(nil)
	if got := <-done; !bytes.Equal(got, want) {
		t.Fatalf("the reader got %d bytes that differ from the %d appended", len(got), len(want))
	}
}

// detachedStream returns a detached flight with a stream head and its one
// reader.
func detachedStream(t *testing.T) (*Flight, *Sub) {
	t.Helper()
	f := NewDetached(1 << 30)
	f.SetHead(streamHead)
	s, err := f.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	return f, s
}

// An event made of line breaks, each one a line of its own in the
// journal, still fits the block it is encoded into: the bound that spares
// counting them holds, no block grows under an appended event (a slice
// handed to a reader would then be of memory the journal let go), and the
// journal reads back as encoded.
func TestJournalLineBreaks(t *testing.T) {
	t.Parallel()
	f, s := detachedStream(t)
	rng := rand.New(rand.NewPCG(1, 2))
	breaks := []string{"\n", "\r", "\r\n", "x", "yz"}
	var want, got []byte
	for i := range 3000 {
		var sb strings.Builder
		for range rng.IntN(400) {
			sb.WriteString(breaks[rng.IntN(len(breaks))])
		}
		data := sb.String()
		caps := make([]int, len(f.j.blocks))
		for k, b := range f.j.blocks {
			caps[k] = cap(b)
		}
		if _, err := f.Append("t\r\n", data); err != nil {
			t.Fatal(err)
		}
		for k := range caps {
			if b := f.j.blocks[k]; b != nil && cap(b) != caps[k] {
				t.Fatalf("event %d: block %d grew from %d to %d bytes under an append", i, k, caps[k], cap(b))
			}
		}
		want = sse.AppendEvent(want, sse.ID{}, "t\r\n", data)
		if i%5 == 0 {
			for p, _ := s.Read(); len(p) > 0; p, _ = s.Read() {
				got = append(got, p...)
			}
		}
	}
	for p, _ := s.Read(); len(p) > 0; p, _ = s.Read() {
		got = append(got, p...)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read back %d bytes that differ from the %d encoded", len(got), len(want))
	}
}

// AppendLine journals what Append does, for data of one line.
func TestAppendLine(t *testing.T) {
	t.Parallel()
	m := newMemory(t, Config{})
	keyed := claim(t, m, Scope{Tenant: "t", Key: "k"}, "fp")
	keyed.SetHead(streamHead)
	for _, data := range []string{"", "x", chatChunk, strings.Repeat("y", 5000)} {
		for _, typ := range []string{"", "delta", "a\rb"} {
			var a, b journal
			if _, err := a.appendEvent(sse.ID{Gen: 7, Seq: 1}, typ, data, 1<<30); err != nil {
				t.Fatal(err)
			}
			if _, err := b.appendOf(sse.ID{Gen: 7, Seq: 1}, typ, data, true, 1<<30); err != nil {
				t.Fatal(err)
			}
			if pa, pb := a.event(0), b.event(0); !bytes.Equal(pa, pb) {
				t.Errorf("%q, %q: appended one line %q; want %q", typ, data, pb, pa)
			}
		}
	}
	if _, err := keyed.AppendLine("delta", "x"); err != nil {
		t.Fatal(err)
	}
	s, _ := keyed.Subscribe(0)
	if p, _ := s.Read(); string(p) != "id: "+strconv.FormatUint(keyed.Gen, 10)+"-1\nevent: delta\ndata: x\n\n" {
		t.Errorf("AppendLine: journaled %q", p)
	}
}

// TestDetachedJournalLetsBigBlockGo: a block made for one event larger
// than any burst grows a block to is let go at the first small round
// after it, not kept for smallRounds more.
func TestDetachedJournalLetsBigBlockGo(t *testing.T) {
	j := journal{discard: true}
	if _, err := j.appendEvent(sse.ID{}, "", strings.Repeat("x", 1<<20), 1<<30); err != nil {
		t.Fatal(err)
	}
	j.recycle()
	for range 2 {
		if _, err := j.appendEvent(sse.ID{}, "", "y", 1<<30); err != nil {
			t.Fatal(err)
		}
		j.recycle()
	}
	for _, b := range j.blocks {
		if cap(b) > journalBlock {
			t.Fatalf("after two small rounds a block of %d bytes is kept; want at most %d", cap(b), journalBlock)
		}
	}
}
