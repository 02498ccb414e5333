package cache

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/ssegate/ssegate/sse"
)

func TestDetached(t *testing.T) {
	t.Parallel()
	m := newMemory(t, Config{})
	tests := []struct {
		name string
		end  func(f *Flight)
		want State
	}{
		{"commit", func(f *Flight) {
			if f.Commit(nil) {
				t.Error("Commit: got stored true; want false")
			}
		}, StateCommitted},
		{"fail", func(f *Flight) { f.Fail(StateFailedRetryable, "aborted", nil) }, StateFailedRetryable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewDetached(1 << 20)
			f.SetHead(streamHead)
			s, err := f.Subscribe(0)
			if err != nil {
				t.Fatalf("Subscribe: got %v; want none", err)
			}
			for seq := 1; seq <= 3; seq++ {
				id, err := f.Append("message", "hi")
				if err != nil || id != (sse.ID{Seq: uint64(seq)}) {
					t.Fatalf("Append: got %v, %v; want 0-%d, none", id, err, seq)
				}
			}
			p, _ := s.Read()
			if want := strings.Repeat("event: message\ndata: hi\n\n", 3); string(p) != want {
				t.Errorf("journal: got %q; want %q (no id lines)", p, want)
			}
			tt.end(f)
			<-f.Done()
			if st, _, _ := f.Outcome(); st != tt.want {
				t.Errorf("Outcome: got %s; want %s", st, tt.want)
			}
			if _, ended := s.Read(); !ended {
				t.Error("Read: got ended=false; want true")
			}
			if st := m.Stats(); st.Keys != 0 || st.Commits != 0 || st.Failed != 0 || st.LiveFlights != 0 || st.LiveBytes != 0 || len(st.ByState) != 0 {
				t.Errorf("store Stats: got %+v; want zero (no ledger trace)", st)
			}
		})
	}

	t.Run("bound", func(t *testing.T) {
		f := NewDetached(100)
		if _, err := f.Append("", strings.Repeat("x", 100)); !errors.Is(err, ErrStreamTooLarge) {
			t.Errorf("Append past maxBytes: got %v; want ErrStreamTooLarge", err)
		}
		if got := f.Events(); got != 0 {
			t.Errorf("Events: got %d; want 0", got)
		}
	})
}

// BenchmarkUnkeyedEvents is the per-event path of a stream without a key,
// the system calls left out: the mock upstream's 200 chat chunks and
// [DONE] read in place in 4 KiB reads (sse.Scanner), each event judged
// (sse.Detector) and journaled (Append), and before each read the client
// given all that was journaled since the last (ReadSpans, as the
// generation's push does). One op is one stream.
func BenchmarkUnkeyedEvents(b *testing.B) {
	const head = `data: {"id":"chatcmpl-3kTqPz81xVbc","object":"chat.completion.chunk","created":1743811170,"model":"gpt-4o-mini","system_fingerprint":"fp_5c1e0a8b3d","choices":[`
	var sb strings.Builder
	sb.WriteString(head + `{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	for i := range 198 {
		sb.WriteString(head + `{"index":0,"delta":{"content":" token` + strconv.Itoa(i%10) + `"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	}
	sb.WriteString(head + `{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}` + "\n\n" + "data: [DONE]\n\n")
	body := sb.String()
	var at [4][]byte
	var sub *Sub
	r := &pushReader{push: func() {
		for spans, _ := sub.ReadSpans(at[:0]); len(spans) > 0; spans, _ = sub.ReadSpans(at[:0]) {
		}
	}}
	sc := sse.NewScanner(nil, 1<<20)
	det := sse.NewDetector(sse.Expect{})
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		f := NewDetached(1 << 30)
		f.SetHead(streamHead)
		sub, _ = f.Subscribe(0)
		r.s = body
		sc.Reset(r)
		det.Reset(sse.Expect{})
		n := 0
		for sc.Next() {
			ev := sc.Event()
			det.Observe(ev)
			var err error
			if sc.OneLine() {
				_, err = f.AppendLine(ev.Type, ev.Data)
			} else {
				_, err = f.Append(ev.Type, ev.Data)
			}
			if err != nil {
				b.Fatal(err)
			}
			n++
		}
		if ok, why := det.Clean(true); !ok || n != 201 {
			b.Fatalf("%d events, clean %v (%s); want 201, clean", n, ok, why)
		}
		f.Commit(nil)
		r.push()
		sub.Close()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/201, "ns/event")
}

// pushReader reads s as a buffered reader does a socket, 4 KiB at a
// time, calling push before each of those reads.
type pushReader struct {
	s, buf string
	push   func()
}

func (r *pushReader) Read(p []byte) (int, error) {
	if r.buf == "" {
		if r.s == "" {
			return 0, io.EOF
		}
		r.push()
		k := min(len(r.s), 4<<10)
		r.buf, r.s = r.s[:k], r.s[k:]
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}
