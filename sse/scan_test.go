package sse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	gosse "github.com/tmaxmax/go-sse"
)

// cutReader returns its bytes in reads of the sizes cuts gives in turn
// (1 to 256 bytes each; all at once when cuts is empty), then end.
type cutReader struct {
	b    []byte
	cuts []byte
	i    int
	end  error
}

func (r *cutReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, r.end
	}
	n := len(r.b)
	if len(r.cuts) > 0 {
		n = 1 + int(r.cuts[r.i%len(r.cuts)])
		r.i++
	}
	n = copy(p, r.b[:min(n, len(r.b))])
	r.b = r.b[n:]
	return n, nil
}

// scanned is one event as the tests compare them, with go-sse's last id.
type scanned struct{ ID, Type, Data string }

// outcome is how a read of a stream ended: "" at its end, "too large", or
// the read error.
func outcome(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrEventTooLarge), errors.Is(err, bufio.ErrTooLong):
		return "too large"
	}
	return "read: " + errors.Unwrap(err).Error()
}

// scanAll reads every event of r with a Scanner that overwrites what it
// consumed, copying each event as it comes: a sub-slice the Scanner kept
// across events would show. Events without type or data are kept, as
// go-sse yields them.
func scanAll(r io.Reader, maxEventSize int) ([]scanned, string) {
	s := NewScanner(r, maxEventSize)
	s.keepEmpty, s.poison = true, true
	var evs []scanned
	for s.Next() {
		ev := s.Event()
		evs = append(evs, scanned{strings.Clone(s.LastEventID()), strings.Clone(ev.Type), strings.Clone(ev.Data)})
	}
	return evs, outcome(s.Err())
}

// goSSEAll reads every event of r with go-sse's Read, the reference.
func goSSEAll(r io.Reader, maxEventSize int) ([]scanned, string) {
	var evs []scanned
	for ev, err := range gosse.Read(r, &gosse.ReadConfig{MaxEventSize: maxEventSize}) {
		if err != nil {
			if errors.Is(err, bufio.ErrTooLong) {
				return evs, "too large"
			}
			return evs, "read: " + err.Error()
		}
		evs = append(evs, scanned{ev.LastEventID, ev.Type, ev.Data})
	}
	return evs, ""
}

// TestScannerShapes reads each of shapes whole, and a byte a read, which
// splits every "\r\n".
func TestScannerShapes(t *testing.T) {
	t.Parallel()
	for _, tt := range shapes {
		t.Run(tt.name, func(t *testing.T) {
			for _, cuts := range [][]byte{nil, {0}} {
				s := NewScanner(&cutReader{b: []byte(tt.in), cuts: cuts, end: io.EOF}, 0)
				s.poison = true
				var got []Event
				for s.Next() {
					ev := s.Event()
					got = append(got, Event{strings.Clone(ev.Type), strings.Clone(ev.Data)})
				}
				if err := s.Err(); err != nil {
					t.Fatalf("cuts %v: got error %v; want none", cuts, err)
				}
				if fmt.Sprint(got) != fmt.Sprint(tt.want) {
					t.Errorf("cuts %v: got %q; want %q", cuts, got, tt.want)
				}
			}
		})
	}
}

func TestScannerID(t *testing.T) {
	t.Parallel()
	in := "id: 1\ndata: a\n\nid: 2\x00\ndata: b\n\nid\n\nid: 3\nevent: e\n\n"
	got, end := scanAll(strings.NewReader(in), 0)
	want := []scanned{{"1", "", "a"}, {"1", "", "b"}, {"", "", ""}, {"3", "e", ""}}
	if fmt.Sprint(got) != fmt.Sprint(want) || end != "" {
		t.Errorf("got %q, %q; want %q", got, end, want)
	}
}

// TestScannerCRAtReadEnd: a "\r" that ends a read ends its line at once,
// so an event whose blank line is that "\r" is yielded without waiting for
// the next read, which may never come.
func TestScannerCRAtReadEnd(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe()
	defer pr.Close()
	go pw.Write([]byte("data: a\r\r")) //nolint:errcheck // the reader checks what came
	s := NewScanner(pr, 0)
	if !s.Next() || s.Event().Data != "a" {
		t.Fatalf("got %v %q; want event a", s.Err(), s.Event().Data)
	}
	go pw.Write([]byte("\ndata: b\r\n\r\n")) //nolint:errcheck // as above
	if !s.Next() || s.Event().Data != "b" {
		t.Fatalf("got %v %q; want event b", s.Err(), s.Event().Data)
	}
}

func TestScannerTooLarge(t *testing.T) {
	t.Parallel()
	const limit = 1024
	tests := []struct {
		name    string
		in      string
		events  int
		wantErr bool
	}{
		{"fits", "data: " + strings.Repeat("x", limit/2) + "\n\n", 1, false},
		{"exactly", "data: " + strings.Repeat("x", limit-8) + "\n\n", 1, false},
		{"one over", "data: " + strings.Repeat("x", limit-7) + "\n\n", 0, true},
		{"too large", "data: " + strings.Repeat("x", 2*limit) + "\n\n", 0, true},
		{"too large after small", "data: a\n\ndata: " + strings.Repeat("x", 2*limit) + "\n\n", 1, true},
		{"too large without end", "data: " + strings.Repeat("x", 2*limit), 0, true},
		{"blank lines count", strings.Repeat("\n", limit) + "data: a\n\n", 0, true},
		{"many small fit", strings.Repeat("data: "+strings.Repeat("x", 200)+"\n\n", 20), 20, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, cuts := range [][]byte{nil, {99, 3, 250}} {
				got, end := scanAll(&cutReader{b: []byte(tt.in), cuts: cuts, end: io.EOF}, limit)
				if len(got) != tt.events || (end == "too large") != tt.wantErr {
					t.Errorf("cuts %v: got %d events, %q; want %d, error %v", cuts, len(got), end, tt.events, tt.wantErr)
				}
				ref, refEnd := goSSEAll(&cutReader{b: []byte(tt.in), cuts: cuts, end: io.EOF}, limit)
				if len(ref) != len(got) || refEnd != end {
					t.Errorf("cuts %v: go-sse got %d events, %q; the Scanner %d, %q", cuts, len(ref), refEnd, len(got), end)
				}
			}
		})
	}
	s := NewScanner(strings.NewReader("data: "+strings.Repeat("x", 2*limit)+"\n\n"), limit)
	if s.Next() || !errors.Is(s.Err(), ErrEventTooLarge) || !strings.Contains(s.Err().Error(), "1024") {
		t.Errorf("got %v; want ErrEventTooLarge naming 1024", s.Err())
	}
}

// TestScannerNoProgress: a reader that keeps returning nothing ends the
// scan, as it ends bufio.Scanner's.
func TestScannerNoProgress(t *testing.T) {
	t.Parallel()
	s := NewScanner(readerFunc(func([]byte) (int, error) { return 0, nil }), 0)
	if s.Next() || !errors.Is(s.Err(), io.ErrNoProgress) {
		t.Errorf("got %v; want io.ErrNoProgress", s.Err())
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestScannerLargeEvent: one event far larger than the first buffer, read
// in small pieces, is searched once, not once a read.
func TestScannerLargeEvent(t *testing.T) {
	t.Parallel()
	data := strings.Repeat("y", 256<<10)
	in := "event: big\ndata: " + data + "\ndata: z\n\ndata: after\n\n"
	got, end := scanAll(&cutReader{b: []byte(in), cuts: []byte{255, 17}, end: io.EOF}, 0)
	if end != "" || len(got) != 2 || got[0].Type != "big" || got[0].Data != data+"\nz" || got[1].Data != "after" {
		t.Fatalf("got %d events, %q; want the big one and after", len(got), end)
	}
}

// TestScannerLinear: a 4 MiB event read 256 bytes at a time is searched
// once, not once a read: searched again on every read it would take tens
// of gigabytes of scanning, minutes, where once takes milliseconds.
func TestScannerLinear(t *testing.T) {
	t.Parallel()
	data := strings.Repeat("z", 4<<20)
	in := []byte("data: " + data + "\n\n")
	start := time.Now()
	s := NewScanner(&cutReader{b: in, cuts: []byte{255}, end: io.EOF}, 8<<20)
	if !s.Next() || len(s.Event().Data) != len(data) {
		t.Fatalf("got %v; want the event", s.Err())
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v; want well under 10s", took)
	}
}

func TestScannerFixtures(t *testing.T) {
	t.Parallel()
	for _, name := range fixtureNames(t) {
		t.Run(name, func(t *testing.T) {
			in := fixture(t, name)
			want, wantEnd := goSSEAll(strings.NewReader(in), 0)
			for _, cuts := range [][]byte{nil, {0}, {6, 200, 31}} {
				got, end := scanAll(&cutReader{b: []byte(in), cuts: cuts, end: io.EOF}, 0)
				if fmt.Sprint(got) != fmt.Sprint(want) || end != wantEnd {
					t.Errorf("cuts %v: got %d events, %q; want go-sse's %d, %q", cuts, len(got), end, len(want), wantEnd)
				}
			}
		})
	}
}

// FuzzScanner holds the Scanner to go-sse's Read on the same bytes, cut
// into reads by cuts, with a bound (0: a large one) and an end that is a
// clean EOF or a cut body: the same events, the same last ids, the same
// end, and the same verdict of a Detector fed each side's events as they
// come. The one departure allowed is the bound's: go-sse may count the
// "\n" of a "\r\n" that its reads split (Scanner's doc).
func FuzzScanner(f *testing.F) {
	fuzzSeeds(f, func(seed []byte) { f.Add(seed, []byte{}, uint16(0), false) })
	f.Add([]byte("data: a\r\r\ndata: bb\r\n\r\n"), []byte{7, 0}, uint16(9), true)
	f.Add([]byte("event: e\ndata: 12345\ndata: 6\n\n\n\ndata: x\n\n"), []byte{3}, uint16(20), false)
	f.Fuzz(func(t *testing.T, in, cuts []byte, bound uint16, cut bool) {
		limit := 1 << 20
		if bound > 0 {
			limit = 1 + int(bound)%2048
		}
		end := io.EOF
		if cut {
			end = io.ErrUnexpectedEOF
		}
		dg, dw := NewDetector(Expect{Usage: true}), NewDetector(Expect{Usage: true})
		s := NewScanner(&cutReader{b: in, cuts: cuts, end: end}, limit)
		s.keepEmpty, s.poison = true, true
		var got []scanned
		for s.Next() {
			ev := s.Event()
			if ev.Type != "" || ev.Data != "" {
				dg.Observe(ev)
			}
			if s.OneLine() == strings.ContainsAny(ev.Data, "\r\n") {
				t.Fatalf("OneLine %v for data %q", s.OneLine(), ev.Data)
			}
			if s.OneLine() && !bytes.Equal(AppendLineEvent(nil, ID{}, ev.Type, ev.Data), AppendEvent(nil, ID{}, ev.Type, ev.Data)) {
				t.Fatalf("AppendLineEvent of %q differs from AppendEvent's", ev.Data)
			}
			got = append(got, scanned{strings.Clone(s.LastEventID()), strings.Clone(ev.Type), strings.Clone(ev.Data)})
		}
		gotEnd := outcome(s.Err())
		want, wantEnd := goSSEAll(&cutReader{b: in, cuts: cuts, end: end}, limit)
		for _, e := range want {
			if e.Type != "" || e.Data != "" {
				dw.Observe(Event{e.Type, e.Data})
			}
		}
		if fmt.Sprint(got) == fmt.Sprint(want) && gotEnd == wantEnd {
			gc, gr := dg.Clean(true)
			wc, wr := dw.Clean(true)
			if gc != wc || gr != wr || dg.Content() != dw.Content() {
				t.Fatalf("Detector: got %v %q; want %v %q as on go-sse's events", gc, gr, wc, wr)
			}
			return
		}
		if k := len(want); wantEnd == "too large" && len(got) >= k && fmt.Sprint(got[:k]) == fmt.Sprint(want) {
			// The bound's departure: with one byte more, go-sse goes on
			// past the event it refused as the Scanner did, to the next
			// event or to the same end.
			more, moreEnd := goSSEAll(&cutReader{b: in, cuts: cuts, end: end}, limit+1)
			if len(got) > k && len(more) > k && more[k] == got[k] && fmt.Sprint(more[:k]) == fmt.Sprint(want) {
				return
			}
			if len(got) == k && fmt.Sprint(more) == fmt.Sprint(got) && moreEnd == gotEnd {
				return
			}
		}
		t.Fatalf("got %q, end %q; want go-sse's %q, end %q", got, gotEnd, want, wantEnd)
	})
}

func BenchmarkScanner(b *testing.B) {
	chat := openAIStream()
	big := "data: " + strings.Repeat("x", 256<<10) + "\n\n"
	for _, bc := range []struct {
		name   string
		body   string
		events int
		read   int
	}{
		{"openai-201", chat, 201, 4 << 10},
		{"256KiB-in-4KiB", big, 1, 4 << 10},
	} {
		b.Run(bc.name+"/scanner", func(b *testing.B) {
			s := NewScanner(nil, 0)
			r, body := &pieces{}, []byte(bc.body)
			b.ReportAllocs()
			for b.Loop() {
				r.b, r.n = body, bc.read
				s.Reset(r)
				n := 0
				for s.Next() {
					n++
				}
				if n != bc.events || s.Err() != nil {
					b.Fatalf("got %d events, %v", n, s.Err())
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*bc.events), "ns/event")
		})
		b.Run(bc.name+"/go-sse", func(b *testing.B) {
			r, body := &pieces{}, []byte(bc.body)
			b.ReportAllocs()
			for b.Loop() {
				r.b, r.n = body, bc.read
				n := 0
				for _, err := range Read(r, 0) {
					if err != nil {
						b.Fatal(err)
					}
					n++
				}
				if n != bc.events {
					b.Fatalf("got %d events", n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*bc.events), "ns/event")
		})
	}
}

// pieces returns its bytes at most n a read.
type pieces struct {
	b []byte
	n int
}

func (r *pieces) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b[:min(r.n, len(r.b))])
	r.b = r.b[n:]
	return n, nil
}
