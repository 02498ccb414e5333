//go:build !race

package cache

import "testing"

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
