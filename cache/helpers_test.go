package cache

import (
	"bytes"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssegate/ssegate/sse"
	gosse "github.com/tmaxmax/go-sse"
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

// wireEvent is one event as a client parses it off the wire.
type wireEvent struct {
	ID   sse.ID
	Type string
	Data string
}

// parseWire parses encoded events. The project's sse.Read gives type and
// data but drops ids (the proxy assigns its own), so ids are read with
// go-sse's reader, which sse.Read wraps, and the two parses must agree.
func parseWire(tb testing.TB, p []byte) []wireEvent {
	tb.Helper()
	var evs []wireEvent
	for ev, err := range gosse.Read(bytes.NewReader(p), &gosse.ReadConfig{MaxEventSize: 1 << 20}) {
		if err != nil {
			tb.Fatalf("go-sse Read: got error %v; want none", err)
		}
		id, err := sse.ParseID(ev.LastEventID)
		if err != nil {
			tb.Fatalf("event id %q: got error %v; want a valid id", ev.LastEventID, err)
		}
		evs = append(evs, wireEvent{ID: id, Type: ev.Type, Data: ev.Data})
	}
	i := 0
	for ev, err := range sse.Read(bytes.NewReader(p), 0) {
		if err != nil {
			tb.Fatalf("sse.Read: got error %v; want none", err)
		}
		if i >= len(evs) || ev.Type != evs[i].Type || ev.Data != evs[i].Data {
			tb.Fatalf("sse.Read event %d: got %+v; want it to match go-sse's parse", i, ev)
		}
		i++
	}
	if i != len(evs) {
		tb.Fatalf("sse.Read: got %d events; want %d", i, len(evs))
	}
	return evs
}

// checkSeq checks that evs are exactly the events gen-(after+1) ..
// gen-last, in order, each with its seq as data.
func checkSeq(tb testing.TB, evs []wireEvent, gen, after, last uint64) {
	tb.Helper()
	if got, want := uint64(len(evs)), last-after; got != want {
		tb.Fatalf("events after %d: got %d; want %d", after, got, want)
	}
	for i, ev := range evs {
		want := sse.ID{Gen: gen, Seq: after + 1 + uint64(i)}
		if ev.ID != want {
			tb.Fatalf("event %d: got id %v; want %v (gap or duplicate)", i, ev.ID, want)
		}
		if ev.Data != strconv.FormatUint(want.Seq, 10) {
			tb.Fatalf("event %v: got data %q; want %q", want, ev.Data, strconv.FormatUint(want.Seq, 10))
		}
	}
}

// follow reads s until its flight ends and returns every byte it got.
func follow(s *Sub, idle time.Duration) (got []byte, ended bool) {
	t := time.NewTimer(idle)
	defer t.Stop()
	for {
		select {
		case <-s.C():
		case <-t.C:
			return got, false
		}
		for {
			p, end := s.Read()
			got = append(got, p...)
			if end {
				return got, true
			}
			if len(p) == 0 {
				break
			}
		}
		t.Reset(idle)
	}
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

// chatChunk is a typical ~200-byte OpenAI chat/completions stream chunk.
const chatChunk = `{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk",` +
	`"created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1",` +
	`"choices":[{"index":0,"delta":{"content":" hello"},"finish_reason":null}]}`
