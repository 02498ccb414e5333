//go:build !race

// The race detector adds allocations, so these checks run only without it.

package sse

import "testing"

// TestZeroAllocs is not parallel: AllocsPerRun counts the allocations of
// every goroutine, so another test running beside it would count too.
func TestZeroAllocs(t *testing.T) {
	buf := make([]byte, 0, 4096)
	chunk := Event{Data: `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741025614,"choices":[{"index":0,"delta":{"content":" joke"},"logprobs":null,"finish_reason":null}],"usage":null}`}
	role := Event{Data: `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741025614,"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}`}
	d := NewDetector(Expect{Usage: true})
	sc := NewScanner(&loop{b: []byte("event: delta\ndata: " + chunk.Data + "\n\ndata: a\ndata: b\n\n: ping\r\n\r\n")}, 0)
	req := []byte(`{"messages":[{"role":"user","content":"hi \"there\""}],"stream":true,"n":2,"stream_options":{"include_usage":true}}`)
	plain := []byte(`{"messages":[{"role":"user","content":"hi"}],"stream":false}`) // no "n", as most requests
	tests := []struct {
		name string
		fn   func()
	}{
		{"AppendEvent", func() { buf = AppendEvent(buf[:0], ID{1764403200123, 42}, "delta", "a\nb\nc") }},
		{"AppendEvent with CR", func() { buf = AppendEvent(buf[:0], ID{1, 2}, "a\rb", "a\r\nb\rc") }},
		{"AppendLineEvent", func() { buf = AppendLineEvent(buf[:0], ID{1764403200123, 42}, "delta", chunk.Data) }},
		{"AppendComment", func() { buf = AppendComment(buf[:0], "ping\nx") }},
		{"ID.Append", func() { buf = ID{1764403200123, 42}.Append(buf[:0]) }},
		{"ParseID", func() { _, _ = ParseID("1764403200123-42") }},
		{"Detector.Observe", func() { d.Observe(chunk) }},
		// After a Reset the prefix memo is empty: the whole chunk is scanned.
		{"Detector.Observe after Reset", func() { d.Reset(Expect{Usage: true}); d.Observe(chunk) }},
		// Before content, each chunk is also looked at for output.
		{"Detector.Observe preamble", func() { d.Reset(Expect{Usage: true}); d.Observe(role); d.Observe(chunk) }},
		// The reader never ends: a Next that fails has met an error, and a
		// failed Scanner would allocate nothing for doing nothing.
		{"Scanner.Next", func() {
			if !sc.Next() {
				panic(sc.Err())
			}
		}},
		{"ParseRequest without model", func() { _ = ParseRequest(req) }},
		{"ParseRequest without n", func() { _ = ParseRequest(plain) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := testing.AllocsPerRun(100, tt.fn); got != 0 {
				t.Errorf("got %v allocs; want 0", got)
			}
		})
	}
}

// loop returns b over and over, in reads of at most 100 bytes.
type loop struct {
	b []byte
	i int
}

func (r *loop) Read(p []byte) (int, error) {
	n := copy(p[:min(len(p), 100)], r.b[r.i:])
	r.i = (r.i + n) % len(r.b)
	return n, nil
}
