package cache

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache/internal/wiretest"
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
	for _, data := range []string{"", "x", wiretest.ChatChunk, strings.Repeat("y", 5000)} {
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

// Every block a journal gives back is overwritten first, in every test of
// the package: a reader that kept a slice past its Sub's Close reads
// garbage, and under -race the overwrite is a reported race.
func init() { PoisonFreedBlocks() }

// appendTenant appends n events, from seq from on, whose data names the
// tenant, so that one tenant's bytes in another's stream show; it returns
// the bytes the journal should hold for them.
func appendTenant(tb testing.TB, f *Flight, tenant string, from, n int) []byte {
	tb.Helper()
	var want []byte
	for seq := from; seq < from+n; seq++ {
		data := fmt.Sprintf(`{"tenant":%q,"seq":%d,"pad":%q}`, tenant, seq, strings.Repeat(tenant[:1], seq%97))
		id, err := f.Append("", data)
		if err != nil {
			tb.Fatalf("Append #%d: got error %v; want none", seq, err)
		}
		want = sse.AppendEvent(want, id, "", data)
	}
	return want
}

var churned atomic.Int64

// churn runs short committed streams of another tenant, whose journals
// take blocks from the pools, write them over, and give them back.
func churn(tb testing.TB, m *Memory, tenant string, n int) {
	tb.Helper()
	for range n {
		f := claim(tb, m, Scope{Tenant: tenant, Key: fmt.Sprintf("churn-%d", churned.Add(1))}, "fp")
		f.SetHead(streamHead)
		s, err := f.Subscribe(0)
		if err != nil {
			tb.Fatal(err)
		}
		appendTenant(tb, f, tenant, 1, 300)
		f.Commit(nil)
		readAll(s)
		s.Close()
	}
}

// TestJournalFreedAfterLastReader: a committed stream's blocks go back to
// the pools only once its last Sub closed. A joiner that lingers past the
// commit, holding what it read, still reads the stream whole while
// another tenant's streams reuse every block given back; a joiner and a
// resume that got the live flight before its end and subscribe only after
// its blocks went back read it whole too, from the committed result.
func TestJournalFreedAfterLastReader(t *testing.T) {
	t.Parallel()
	m := newMemory(t, Config{})
	sc := Scope{Tenant: "alpha", Key: "k"}
	f := claim(t, m, sc, "fp")
	f.SetHead(streamHead)
	owner, err := f.Subscribe(0) // the client of the request that started it
	if err != nil {
		t.Fatal(err)
	}
	slow, err := f.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	if b := begin(t, m, sc, "fp"); b.Decision != Join || b.Flight != f {
		t.Fatalf("Begin of the live key: got %v; want a join of its flight", b.Decision)
	}
	resumed, res, err := m.Attach(sc, "fp", sse.ID{Gen: f.Gen}, true)
	if err != nil || resumed != f || res != nil {
		t.Fatalf("Attach of the live key: got %p, %v, %v; want its flight", resumed, res, err)
	}
	want := appendTenant(t, f, "alpha", 1, 400)
	if len(f.j.blocks) < 4 {
		t.Fatalf("%d blocks; want a stream of several", len(f.j.blocks))
	}
	held, _ := slow.Read() // the slow joiner keeps its first span while it writes it
	if got, _ := readAll(owner); !bytes.Equal(got, want) {
		t.Fatal("the owner's client read other bytes than were journaled")
	}
	f.Commit(nil)
	owner.Close()
	if f.freed {
		t.Fatal("the journal was given back while a joiner still read it")
	}
	churn(t, m, "omega", 20)
	if !bytes.Equal(held, want[:len(held)]) {
		t.Fatal("a lingering joiner's span changed under it: its journal's blocks were reused")
	}
	rest, ended := readAll(slow)
	if got := append(held[:len(held):len(held)], rest...); !ended || !bytes.Equal(got, want) {
		t.Fatalf("the lingering joiner read %d bytes (ended %v); want the %d journaled, then the end", len(got), ended, len(want))
	}
	slow.Close()
	if !f.freed || len(f.j.blocks) != 0 {
		t.Fatalf("the journal holds %d blocks (freed %v) once its last reader closed; want them given back", len(f.j.blocks), f.freed)
	}
	if p, ended := slow.Read(); len(p) != 0 || ended {
		t.Fatalf("a closed Sub read %d bytes (ended %v); want nothing, not an end", len(p), ended)
	}
	churn(t, m, "omega", 20)
	for _, after := range []uint64{0, 1, 123, 400} {
		s, err := f.Subscribe(after) // the join or the resume, late
		if err != nil {
			t.Fatalf("Subscribe(%d) after the end: %v", after, err)
		}
		churn(t, m, "omega", 2)
		start := 0
		if after > 0 {
			start = int(f.j.ends[after-1])
		}
		if got, ended := readAll(s); !ended || !bytes.Equal(got, want[start:]) {
			t.Fatalf("a reader from %d after the end read %d bytes (ended %v); want the %d journaled after it, then the end", after, len(got), ended, len(want)-start)
		}
		s.Close()
	}
	if got, _, _ := f.WireSince(0, 400); len(got) != 400 || !bytes.Equal(bytes.Join(got, nil), want) {
		t.Fatal("WireSince of a freed journal: want every event as journaled")
	}
}

// TestJournalRecycleConcurrent runs many tenants' streams at once, each
// with its owner's client, a slow joiner that keeps every span it read
// until it closes, and a resume that got the live flight and subscribes
// once it ended; all check every byte, while the pools hand each stream's
// blocks to the next. Under -race, a block reused while a slice of it was
// still held is a reported race as well as a difference.
func TestJournalRecycleConcurrent(t *testing.T) {
	t.Parallel()
	for _, sealing := range []bool{false, true} {
		t.Run(fmt.Sprintf("sealing=%v", sealing), func(t *testing.T) {
			t.Parallel()
			var cfg Config
			if sealing { // every full block is sealed, and its memory reused, as soon as the readers allow
				cfg.SealStreamBytes = 1
			}
			recycleConcurrent(t, newMemory(t, cfg))
		})
	}
}

func recycleConcurrent(t *testing.T, m *Memory) {
	const tenants, streams, events = 6, 12, 250
	var wg sync.WaitGroup
	for ti := range tenants {
		tenant := fmt.Sprintf("%c-tenant", 'a'+ti)
		wg.Go(func() {
			for k := range streams {
				sc := Scope{Tenant: tenant, Key: fmt.Sprint(k)}
				f := claim(t, m, sc, "fp")
				f.SetHead(streamHead)
				late, _, err := m.Attach(sc, "fp", sse.ID{}, false)
				if err != nil || late != f {
					t.Errorf("Attach of the live key: %v", err)
					return
				}
				var readers sync.WaitGroup
				out := make([][]byte, 3)
				for r := range 2 {
					s, err := f.Subscribe(0)
					if err != nil {
						t.Error(err)
						return
					}
					readers.Go(func() {
						defer s.Close()
						var got bytes.Buffer
						var last []byte // written (copied) only before the next Read, as a client's write
						idle := time.NewTimer(10 * time.Second)
						defer idle.Stop()
						for {
							select {
							case <-s.C():
							case <-idle.C:
								t.Errorf("%s stream %d, reader %d: no end within 10 s", tenant, k, r)
								return
							}
							for {
								got.Write(last)
								p, ended := s.Read()
								last = p
								if r == 1 { // the slow joiner
									runtime.Gosched()
								}
								if ended {
									got.Write(last)
									out[r] = got.Bytes()
									return
								}
								if len(p) == 0 {
									break
								}
							}
						}
					})
				}
				want := appendTenant(t, f, tenant, 1, events)
				f.Commit(nil)
				readers.Go(func() {
					<-late.Done()
					s, err := late.Subscribe(0)
					if err != nil {
						t.Error(err)
						return
					}
					defer s.Close()
					out[2], _ = readAll(s)
				})
				readers.Wait()
				for r, g := range out {
					if !bytes.Equal(g, want) {
						t.Errorf("%s stream %d, reader %d: read %d bytes that differ from the %d journaled", tenant, k, r, len(g), len(want))
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// TestJournalSealedBlockHeld: a sealed block's memory goes back to the
// pools only once every reader has read again past it, so a reader that
// still holds its last span in it reads it unchanged while other streams
// reuse what was given back.
func TestJournalSealedBlockHeld(t *testing.T) {
	t.Parallel()
	m := newMemory(t, Config{Limits: Limits{SealStreamBytes: 1}})
	f := claim(t, m, Scope{Tenant: "alpha", Key: "k"}, "fp")
	f.SetHead(streamHead)
	fast, _ := f.Subscribe(0)
	slow, _ := f.Subscribe(0)
	want := appendTenant(t, f, "alpha", 1, 300)
	// The slow reader reads two spans, the first two blocks whole, and
	// still writes the second.
	first, _ := slow.Read()
	last, _ := slow.Read()
	readAll(fast)
	more := appendTenant(t, f, "alpha", 301, 100)
	if f.j.sealed < 2 || len(f.j.retired) != 1 || f.j.retiredAt != 1 {
		t.Fatalf("%d blocks sealed, %d waiting from %d; want the two the slow reader read sealed, the one it holds waiting", f.j.sealed, len(f.j.retired), f.j.retiredAt)
	}
	churn(t, m, "omega", 10)
	if !bytes.Equal(last, want[len(first):len(first)+len(last)]) {
		t.Fatal("the span the slow reader holds changed: its sealed block went back while it held it")
	}
	rest, _ := readAll(slow)
	if !bytes.Equal(rest, append(want[len(first)+len(last):], more...)) {
		t.Fatal("the slow reader read other bytes than were journaled after its span")
	}
	if len(f.j.retired) > 1 {
		t.Fatalf("%d sealed blocks wait once every reader read past them; want at most the one a reader's last span is in", len(f.j.retired))
	}
}

// TestJournalEndedBeforeItsClient: a stream that ends before its client
// subscribed (the request's goroutine had not yet taken the connection)
// keeps its blocks for that client, and gives them back once it leaves.
func TestJournalEndedBeforeItsClient(t *testing.T) {
	t.Parallel()
	m := newMemory(t, Config{})
	f := claim(t, m, Scope{Tenant: "alpha", Key: "k"}, "fp")
	f.SetHead(streamHead)
	want := appendTenant(t, f, "alpha", 1, 200)
	f.Commit(nil)
	if f.freed {
		t.Fatal("the journal was given back before its client came")
	}
	s, err := f.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	if got, ended := readAll(s); !ended || !bytes.Equal(got, want) {
		t.Fatalf("the client read %d bytes (ended %v); want the %d journaled, then the end", len(got), ended, len(want))
	}
	s.Close()
	if !f.freed {
		t.Fatal("the journal kept its blocks once its client left")
	}
}

// TestReadCapped: what a Sub reads cannot be resliced past its end, into
// the rest of its block, which for a block taken from a pool still holds
// another stream's bytes.
func TestReadCapped(t *testing.T) {
	m := newMemory(t, Config{})
	churn(t, m, "mallory", 4)
	f := claim(t, m, Scope{Tenant: "alice", Key: "capped"}, "fp")
	f.SetHead(streamHead)
	s, err := f.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	appendTenant(t, f, "alice", 1, 3)
	p, _ := s.Read()
	if len(p) == 0 || cap(p) != len(p) {
		t.Fatalf("Read: len %d cap %d; want cap == len > 0", len(p), cap(p))
	}
	appendTenant(t, f, "alice", 4, 6)
	spans, _ := s.ReadSpans(make([][]byte, 0, 4))
	if len(spans) == 0 {
		t.Fatal("ReadSpans after 6 more events: got none")
	}
	for i, sp := range spans {
		if cap(sp) != len(sp) {
			t.Fatalf("span %d: len %d cap %d; want cap == len", i, len(sp), cap(sp))
		}
	}
}
