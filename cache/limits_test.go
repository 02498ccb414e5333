package cache

import (
	"bytes"
	"github.com/ssegate/ssegate/cache/internal/wiretest"
	"testing"
	"time"
)

// held returns the bytes a journal holds in its raw blocks and in its
// sealed ones.
func (j *journal) held() (raw, packed int) {
	for i, b := range j.blocks {
		raw += len(b)
		packed += len(j.packed[i])
	}
	return raw, packed
}

// keepUp reads s until it has nothing left and returns what it got.
func keepUp(s *Sub) []byte {
	var got []byte
	for {
		p, _ := s.Read()
		if len(p) == 0 {
			return got
		}
		got = append(got, p...)
	}
}

// sealFixture is one flight with a subscriber that keeps up, and all it
// has read and all that was appended.
type sealFixture struct {
	t         *testing.T
	f         *Flight
	s         *Sub
	got, want []byte
	seq       int
}

func newSealFixture(t *testing.T, m *Memory, key string) *sealFixture {
	f := claim(t, m, Scope{Tenant: "t", Key: key}, "fp")
	f.SetHead(streamHead)
	s, err := f.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	return &sealFixture{t: t, f: f, s: s, seq: 1}
}

// add appends one event and reads it.
func (x *sealFixture) add() {
	x.t.Helper()
	x.want = append(x.want, appendN(x.t, x.f, x.seq, 1)...)
	x.seq++
	x.got = append(x.got, keepUp(x.s)...)
}

// fillBlock adds events until the journal has opened another block.
func (x *sealFixture) fillBlock() {
	x.t.Helper()
	for k := len(x.f.j.blocks); len(x.f.j.blocks) == k; {
		x.add()
	}
}

// allSealed fails the test unless every block but the open one is
// sealed: packed, and no longer held raw.
func (x *sealFixture) allSealed(when string) {
	x.t.Helper()
	j := x.f.j
	open := len(j.blocks) - 1
	if raw, packed := j.held(); j.sealed != open || raw != len(j.blocks[open]) || packed == 0 {
		x.t.Fatalf("%s: %d of %d blocks sealed, %d bytes raw (the open block %d), %d packed; want all but the open one sealed",
			when, j.sealed, len(j.blocks), raw, len(j.blocks[open]), packed)
	}
}

// check holds everything a reader got, from the start and from the
// middle, to every event exactly once, sealed blocks or not.
func (x *sealFixture) check() {
	x.t.Helper()
	if !bytes.Equal(x.got, x.want) {
		x.t.Fatalf("the subscriber that kept up read %d bytes; want the %d appended", len(x.got), len(x.want))
	}
	last := uint64(x.seq - 1)
	for _, after := range []uint64{0, 1, last / 3, last / 2, last - 1} {
		late, err := x.f.Subscribe(after)
		if err != nil {
			x.t.Fatal(err)
		}
		wiretest.CheckSeq(x.t, wiretest.ParseWire(x.t, keepUp(late)), x.f.Gen, after, last)
		late.Close()
	}
}

// TestSealUnderPressure: a journal that is short and young keeps its
// read blocks raw while the live journals together hold less than
// SealLiveBytes, and seals them once they hold more; the store still
// counts every journal byte raw, and the readers get every event once.
func TestSealUnderPressure(t *testing.T) {
	t.Parallel()
	m := newMemory(t, Config{Limits: Limits{MaxLiveBytes: 1 << 20, SealLiveBytes: 64 << 10, SealStreamBytes: 1 << 20}})
	x := newSealFixture(t, m, "a")
	for x.f.j.size < 24<<10 {
		x.add()
	}
	x.fillBlock()
	if raw, packed := x.f.j.held(); packed != 0 || x.f.j.sealed != 0 || raw < x.f.j.size {
		t.Fatalf("without pressure: %d blocks sealed, %d bytes packed, %d raw of %d; want none sealed", x.f.j.sealed, packed, raw, x.f.j.size)
	}

	// Another flight, which no one reads, brings the live bytes past
	// SealLiveBytes.
	g := claim(t, m, Scope{Tenant: "t", Key: "b"}, "fp")
	g.SetHead(streamHead)
	for seq := 1; m.journals.Bytes() < 64<<10; seq++ {
		appendN(t, g, seq, 1)
	}
	x.fillBlock()
	x.allSealed("under pressure")
	if got, want := m.Stats().LiveBytes, int64(x.f.j.size+g.j.size); got != want {
		t.Fatalf("live bytes: got %d; want %d, the raw bytes of both journals", got, want)
	}
	x.check()

	// Once the pressure is gone, the blocks that fill stay raw.
	g.Fail(StateFailedRetryable, "test", nil)
	sealed := x.f.j.sealed
	x.fillBlock()
	x.fillBlock()
	if x.f.j.sealed > sealed+1 { // the block that filled under pressure may seal
		t.Fatalf("after the pressure: %d blocks sealed; want at most %d", x.f.j.sealed, sealed+1)
	}
	x.check()
	if !x.f.Commit(nil) {
		t.Fatal("the body store did not keep the result")
	}
	r := begin(t, m, x.f.Scope, "fp").Result
	if p, err := r.After(0); err != nil || !bytes.Equal(p, x.want) {
		t.Fatalf("the committed result differs from what was appended (%v)", err)
	}
}

// TestSealStreamBytes: without pressure, a journal keeps its read blocks
// raw until it holds SealStreamBytes, and seals them from then on.
func TestSealStreamBytes(t *testing.T) {
	t.Parallel()
	const bound = 48 << 10
	m := newMemory(t, Config{Limits: Limits{SealStreamBytes: bound}})
	x := newSealFixture(t, m, "a")
	for x.f.j.size < bound {
		if x.f.j.sealed != 0 {
			t.Fatalf("at %d bytes: %d blocks sealed; want none below %d", x.f.j.size, x.f.j.sealed, bound)
		}
		x.add()
	}
	x.fillBlock()
	x.allSealed("past the bound")
	for range 3 {
		x.fillBlock()
		x.allSealed("later")
	}
	x.check()
}

// TestSealAge: without pressure, a journal keeps its read blocks raw
// until its generation is SealAge old, and seals them from then on.
func TestSealAge(t *testing.T) {
	t.Parallel()
	clk := newClock()
	m := newMemory(t, Config{Now: clk.Now, Limits: Limits{SealAge: time.Minute}})
	x := newSealFixture(t, m, "a")
	for range 4 {
		x.fillBlock()
		clk.Advance(10 * time.Second)
	}
	if x.f.j.sealed != 0 {
		t.Fatalf("at 40s: %d blocks sealed; want none", x.f.j.sealed)
	}
	clk.Advance(20 * time.Second)
	x.fillBlock()
	x.allSealed("at a minute")
	for range 3 {
		x.fillBlock()
		x.allSealed("later")
	}
	x.check()
}

// TestSealBehindSlowReader: a reader that lags keeps the blocks it has
// not read raw, under pressure too, and then reads every event once.
func TestSealBehindSlowReader(t *testing.T) {
	t.Parallel()
	m := newMemory(t, Config{Limits: Limits{SealStreamBytes: 1}}) // seals whenever it can
	x := newSealFixture(t, m, "a")
	for range 3 {
		x.fillBlock()
	}
	from := uint64(x.seq - 1)
	slow, err := x.f.Subscribe(from)
	if err != nil {
		t.Fatal(err)
	}
	sealed := x.f.j.sealed
	for range 4 {
		x.fillBlock()
	}
	if x.f.j.sealed != sealed {
		t.Fatalf("%d blocks sealed; want %d: the slow reader has read none past them", x.f.j.sealed, sealed)
	}
	wiretest.CheckSeq(t, wiretest.ParseWire(t, keepUp(slow)), x.f.Gen, from, uint64(x.seq-1))
	slow.Close()
	x.fillBlock()
	x.allSealed("once the slow reader caught up")
	x.check()
}

// TestSealDefaults: without a SealLiveBytes, the live journals seal from
// 8 MiB together, or from half of MaxLiveBytes when that is less.
func TestSealDefaults(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ max, want int64 }{{0, 8 << 20}, {8 << 30, 8 << 20}, {4 << 20, 2 << 20}} {
		l := Limits{MaxLiveBytes: c.max}
		l.SetDefaults()
		if l.SealLiveBytes != c.want || l.SealStreamBytes != 128<<10 || l.SealAge != time.Minute {
			t.Errorf("MaxLiveBytes %d: SealLiveBytes %d, SealStreamBytes %d, SealAge %v; want %d, 128 KiB, 1m",
				c.max, l.SealLiveBytes, l.SealStreamBytes, l.SealAge, c.want)
		}
	}
}
