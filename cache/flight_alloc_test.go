//go:build !race

package cache

import (
	"runtime"
	"strconv"
	"testing"

	"github.com/ssegate/ssegate/sse"
)

// TestReadPathAllocs holds the replay and follow paths to zero
// allocations; the race detector's instrumentation allocates, hence the
// build tag. It is not parallel: AllocsPerRun counts the allocations of
// every goroutine, so another test running beside it would count too.
func TestReadPathAllocs(t *testing.T) {
	m := newMemory(t, Config{})
	sc := Scope{Tenant: "t", Key: "k"}
	f := claim(t, m, sc, "fp")
	f.SetHead(streamHead)
	appendN(t, f, 1, 200)
	s, err := f.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	f.Commit(nil)
	r := begin(t, m, sc, "fp").Result
	tests := []struct {
		name string
		fn   func()
	}{
		{"Result.After", func() { _, _ = r.After(100) }},
		{"Sub.Read", func() { _, _ = s.Read() }},
		{"Sub.Position", func() { _ = s.Position() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := testing.AllocsPerRun(100, tt.fn); got != 0 {
				t.Errorf("got %v allocs; want 0", got)
			}
		})
	}
}

// TestDetachedBurstAllocs holds a stream without a key at saturation, where
// each upstream read brings a score of events and its client is written
// all of them before the next, to no allocation per read once the journal
// has grown a block that holds one: the bare relay's buffer, not a new
// block per read.
func TestDetachedBurstAllocs(t *testing.T) {
	const chunk = `{"id":"chatcmpl-3kTqPz81xVbc","object":"chat.completion.chunk","created":1743811170,"model":"gpt-4o-mini","system_fingerprint":"fp_5c1e0a8b3d","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}`
	f := NewDetached(1 << 30)
	f.SetHead(streamHead)
	s, err := f.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	var at [4][]byte
	read := func(burst int) {
		for range burst {
			if _, err := f.Append("", chunk); err != nil {
				t.Fatal(err)
			}
		}
		// As the origin's push: the spans, then a read that finds nothing new.
		for spans, _ := s.ReadSpans(at[:0]); len(spans) > 0; spans, _ = s.ReadSpans(at[:0]) {
		}
	}
	for _, burst := range []int{1, 18, 3, 18, 1, 18} { // the backlog, then reads of one to a score of events
		read(burst)
	}
	for _, burst := range []int{18, 2, 9} {
		if got := testing.AllocsPerRun(50, func() { read(burst) }); got != 0 {
			t.Errorf("a read of %d events: %v allocations; want 0", burst, got)
		}
	}
}

// TestKeyedStreamBytes holds what a keyed stream that commits allocates
// per event, its client reading it whole, below the event's own bytes:
// the journal's blocks, most of it before, go back to the pools when the
// client is done and the next stream takes them.
func TestKeyedStreamBytes(t *testing.T) {
	m := newMemory(t, Config{})
	const streams, events = 40, 200
	data := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"token"},"finish_reason":null}]}`
	drain := func(s *Sub) { // as a client writes it: nothing kept
		for p, _ := s.Read(); len(p) > 0; p, _ = s.Read() {
		}
	}
	run := func(k int) {
		f := claim(t, m, Scope{Tenant: "t", Key: strconv.Itoa(k)}, "fp")
		f.SetHead(streamHead)
		s, err := f.Subscribe(0)
		if err != nil {
			t.Fatal(err)
		}
		for range events {
			if _, err := f.Append("", data); err != nil {
				t.Fatal(err)
			}
			drain(s)
		}
		f.Commit(nil)
		drain(s)
		s.Close()
	}
	run(-1) // warm
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for k := range streams {
		run(k)
	}
	runtime.ReadMemStats(&after)
	perEvent := float64(after.TotalAlloc-before.TotalAlloc) / (streams * events)
	wire := len(sse.AppendEvent(nil, sse.ID{Gen: 1 << 40, Seq: 100}, "", data))
	t.Logf("%.0f bytes allocated per event of %d bytes", perEvent, wire)
	// Before the pools, the blocks alone were an event's own bytes, and
	// the whole about 290; what is left is the commit's (about 60–90).
	if perEvent > float64(wire) {
		t.Errorf("%.0f bytes allocated per event of %d; want fewer than the event's own", perEvent, wire)
	}
}
