package cache

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssegate/ssegate/sse"
)

// newMemory returns a store closed when the test ends.
func newMemory(tb testing.TB, cfg Config) *Memory {
	tb.Helper()
	m, err := NewMemory(cfg)
	if err != nil {
		tb.Fatalf("NewMemory: got error %v; want none", err)
	}
	tb.Cleanup(m.Close)
	return m
}

// begin calls Begin and fails the test on an error.
func begin(tb testing.TB, m *Memory, sc Scope, fp string) Begun {
	tb.Helper()
	b, err := m.Begin(sc, fp)
	if err != nil {
		tb.Fatalf("Begin(%v, %q): got error %v; want none", sc, fp, err)
	}
	return b
}

// claim calls Begin and fails the test unless it is a Miss.
func claim(tb testing.TB, m *Memory, sc Scope, fp string) *Flight {
	tb.Helper()
	b := begin(tb, m, sc, fp)
	if b.Decision != Miss || b.Flight == nil {
		tb.Fatalf("Begin(%v, %q): got %v (flight %p); want miss with a flight", sc, fp, b.Decision, b.Flight)
	}
	return b.Flight
}

// appendN appends n events whose data is their seq and returns the bytes
// the journal should hold for them.
func appendN(tb testing.TB, f *Flight, from, n int) []byte {
	tb.Helper()
	var want []byte
	for seq := from; seq < from+n; seq++ {
		data := strconv.Itoa(seq)
		id, err := f.Append("", data)
		if err != nil {
			tb.Fatalf("Append #%d: got error %v; want none", seq, err)
		}
		if id != (sse.ID{Gen: f.Gen, Seq: uint64(seq)}) {
			tb.Fatalf("Append #%d: got id %v; want %d-%d", seq, id, f.Gen, seq)
		}
		want = sse.AppendEvent(want, id, "", data)
	}
	return want
}

// clock is an injectable clock that tests move by hand.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	return c
}

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// readAll reads what s has now, over as many Reads as the journal's
// blocks take.
func readAll(s *Sub) (got []byte, ended bool) {
	for {
		p, end := s.Read()
		got = append(got, p...)
		if end || len(p) == 0 {
			return got, end
		}
	}
}

var streamHead = Head{
	Status: 200, ContentType: "text/event-stream", Stream: true,
	Header: []Header{{Name: "X-Request-Id", Value: "req_1"}},
}

// commitStream claims sc, journals n events and commits them; it returns
// the flight and the bytes it journaled.
func commitStream(tb testing.TB, m *Memory, sc Scope, fp string, n int) (*Flight, []byte) {
	tb.Helper()
	f := claim(tb, m, sc, fp)
	f.SetHead(streamHead)
	want := appendN(tb, f, 1, n)
	f.Commit(nil)
	return f, want
}

func startStream(tb testing.TB, f *Flight) {
	tb.Helper()
	f.Mark(StateExecutionStarted, 1, 200)
	f.SetHead(Head{Status: 200, ContentType: "text/event-stream", Stream: true,
		Header: []Header{{Name: "X-Request-Id", Value: "req-1"}}})
}

// waitDone waits for f to end and returns its outcome.
func waitDone(tb testing.TB, f *Flight, within time.Duration) State {
	tb.Helper()
	select {
	case <-f.Done():
	case <-time.After(within):
		tb.Fatalf("flight %d: not ended after %v", f.Gen, within)
	}
	state, _, _ := f.Outcome()
	return state
}
