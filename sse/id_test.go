package sse

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

func TestParseID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want ID
		ok   bool
	}{
		{"1764403200123-42", ID{1764403200123, 42}, true},
		{"1-1", ID{1, 1}, true},
		{"0-0", ID{}, true},
		{"0-7", ID{0, 7}, true},
		{"18446744073709551615-18446744073709551615", ID{math.MaxUint64, math.MaxUint64}, true},
		{"", ID{}, false},
		{"1", ID{}, false},
		{"1-", ID{}, false},
		{"-1", ID{}, false},
		{"-", ID{}, false},
		{"a-1", ID{}, false},
		{"1-a", ID{}, false},
		{"01-1", ID{}, false},
		{"1-01", ID{}, false},
		{"00-1", ID{}, false},
		{"18446744073709551616-1", ID{}, false},
		{"1-18446744073709551616", ID{}, false},
		{"99999999999999999999-1", ID{}, false},
		{" 1-2", ID{}, false},
		{"1-2 ", ID{}, false},
		{"1 -2", ID{}, false},
		{"+1-2", ID{}, false},
		{"1-+2", ID{}, false},
		{"1--2", ID{}, false},
		{"1-2-3", ID{}, false},
		{"1_2", ID{}, false},
		{"１-2", ID{}, false}, // fullwidth digit
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseID(tt.in)
			if tt.ok {
				if err != nil {
					t.Fatalf("got error %v; want %v", err, tt.want)
				}
				if got != tt.want {
					t.Fatalf("got %v; want %v", got, tt.want)
				}
				if s := got.String(); s != tt.in {
					t.Errorf("String: got %q; want %q", s, tt.in)
				}
				return
			}
			if !errors.Is(err, ErrInvalidID) {
				t.Fatalf("got %v, %v; want an error wrapping ErrInvalidID", got, err)
			}
		})
	}
}

func TestIDString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		id   ID
		want string
		zero bool
	}{
		{ID{}, "0-0", true},
		{ID{1764403200123, 42}, "1764403200123-42", false},
		{ID{0, 1}, "0-1", false},
		{ID{math.MaxUint64, 0}, "18446744073709551615-0", false},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.id.String(); got != tt.want {
				t.Errorf("String: got %q; want %q", got, tt.want)
			}
			if got := string(tt.id.Append([]byte("x"))); got != "x"+tt.want {
				t.Errorf("Append: got %q; want %q", got, "x"+tt.want)
			}
			if got := tt.id.IsZero(); got != tt.zero {
				t.Errorf("IsZero: got %v; want %v", got, tt.zero)
			}
		})
	}
}

func TestParseIDErrorBounded(t *testing.T) {
	t.Parallel()
	long := make([]byte, 10000)
	for i := range long {
		long[i] = 'x'
	}
	_, err := ParseID(string(long))
	if err == nil || len(err.Error()) > 200 {
		t.Errorf("got error of %d bytes; want a bounded error", len(err.Error()))
	}
}

func BenchmarkIDAppend(b *testing.B) {
	id := ID{1764403200123, 42}
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = id.Append(buf[:0])
	}
}

func BenchmarkParseID(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseID("1764403200123-42"); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzParseID checks the round trip and compares ParseID with strconv.
func FuzzParseID(f *testing.F) {
	for _, s := range []string{"1-1", "0-0", "01-1", "-1", "1-", "+1-2", "18446744073709551615-1", "18446744073709551616-1", " 1-2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseID(s)
		if err == nil {
			if got := id.String(); got != s {
				t.Fatalf("String: got %q; want %q", got, s)
			}
		} else if !errors.Is(err, ErrInvalidID) {
			t.Fatalf("got error %v; want one wrapping ErrInvalidID", err)
		}
		want := false
		if g, q, ok := strings.Cut(s, "-"); ok {
			want = canonicalUint(g) && canonicalUint(q)
		}
		if (err == nil) != want {
			t.Fatalf("ParseID(%q): got err %v; want ok=%v", s, err, want)
		}
	})
}

func canonicalUint(s string) bool {
	n, err := strconv.ParseUint(s, 10, 64)
	return err == nil && strconv.FormatUint(n, 10) == s
}
