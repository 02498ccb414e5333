package cache

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssegate/ssegate/sse"
)

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
