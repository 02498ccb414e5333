package cache

import (
	"errors"
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
