// Package wiretest holds what the tests of cache and cache/redis share to
// read encoded events as a client does. It does not import cache, so that
// cache's own (in-package) tests can import it, which they cannot
// storetest.
package wiretest

import (
	"bytes"
	"strconv"
	"testing"
	"time"

	"github.com/ssegate/ssegate/sse"
	gosse "github.com/tmaxmax/go-sse"
)

// ChatChunk is a typical ~200-byte OpenAI chat/completions stream chunk.
const ChatChunk = `{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk",` +
	`"created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1",` +
	`"choices":[{"index":0,"delta":{"content":" hello"},"finish_reason":null}]}`

// WireEvent is one event as a client parses it off the wire.
type WireEvent struct {
	ID   sse.ID
	Type string
	Data string
}

// ParseWire parses encoded events. The project's sse.Read gives type and
// data but drops ids (the proxy assigns its own), so ids are read with
// go-sse's reader, which sse.Read wraps, and the two parses must agree.
func ParseWire(tb testing.TB, p []byte) []WireEvent {
	tb.Helper()
	var evs []WireEvent
	for ev, err := range gosse.Read(bytes.NewReader(p), &gosse.ReadConfig{MaxEventSize: 1 << 20}) {
		if err != nil {
			tb.Fatalf("go-sse Read: got error %v; want none", err)
		}
		id, err := sse.ParseID(ev.LastEventID)
		if err != nil {
			tb.Fatalf("event id %q: got error %v; want a valid id", ev.LastEventID, err)
		}
		evs = append(evs, WireEvent{ID: id, Type: ev.Type, Data: ev.Data})
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

// CheckSeq checks that evs are exactly the events gen-(after+1) ..
// gen-last, in order, each with its seq as data.
func CheckSeq(tb testing.TB, evs []WireEvent, gen, after, last uint64) {
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

// Sub is what Follow reads: a cache.Sub.
type Sub interface {
	C() <-chan struct{}
	Read() (p []byte, ended bool)
}

// Follow reads s until its flight ends and returns every byte it got.
func Follow(s Sub, idle time.Duration) (got []byte, ended bool) {
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
