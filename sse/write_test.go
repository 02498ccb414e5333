package sse

import (
	"strings"
	"testing"

	gosse "github.com/tmaxmax/go-sse"
)

func TestAppendEventWire(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		id   ID
		typ  string
		data string
		want string
	}{
		{"data only", ID{}, "", "x", "data: x\n\n"},
		{"all fields", ID{3, 4}, "delta", "x", "id: 3-4\nevent: delta\ndata: x\n\n"},
		{"empty data", ID{1, 1}, "ping", "", "id: 1-1\nevent: ping\ndata: \n\n"},
		{"multi-line", ID{}, "", "a\nb\n", "data: a\ndata: b\ndata: \n\n"},
		{"crlf", ID{}, "", "a\r\nb", "data: a\ndata: b\n\n"},
		{"lone cr", ID{}, "", "a\rb\r", "data: a\ndata: b\ndata: \n\n"},
		{"cr then lf separately", ID{}, "", "a\r\n\nb", "data: a\ndata: \ndata: b\n\n"},
		{"newline in type", ID{}, "a\nb\rc", "x", "event: a b c\ndata: x\n\n"},
		{"leading space kept", ID{}, "", " x", "data:  x\n\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(AppendEvent(nil, tt.id, tt.typ, tt.data)); got != tt.want {
				t.Errorf("got %q; want %q", got, tt.want)
			}
			if strings.ContainsAny(tt.data, "\r\n") {
				return
			}
			if got := string(AppendLineEvent(nil, tt.id, tt.typ, tt.data)); got != tt.want {
				t.Errorf("AppendLineEvent: got %q; want %q", got, tt.want)
			}
		})
	}
}

func TestAppendComment(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"ping", ": ping\n\n"},
		{"", ": \n\n"},
		{"a\nb\r\nc", ": a b  c\n\n"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got := AppendComment(nil, tt.in)
			if string(got) != tt.want {
				t.Errorf("got %q; want %q", got, tt.want)
			}
			// A comment must not produce an event.
			if evs := readAll(t, string(got)+"data: x\n\n", 0); len(evs) != 1 || evs[0].Data != "x" {
				t.Errorf("read back: got %q; want one event x", evs)
			}
		})
	}
}

// readBack parses wire with go-sse directly, so that the test does not
// depend on Read's own skipping, and returns its events and last ids.
func readBack(tb testing.TB, wire []byte) []gosse.Event {
	tb.Helper()
	var evs []gosse.Event
	for ev, err := range gosse.Read(strings.NewReader(string(wire)), &gosse.ReadConfig{MaxEventSize: 1 << 20}) {
		if err != nil {
			tb.Fatalf("go-sse Read: got error %v; want none", err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func TestAppendEventRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		id       ID
		typ      string
		data     string
		wantData string
	}{
		{"plain", ID{1, 1}, "", "hello", "hello"},
		{"typed", ID{1764403200123, 42}, "response.output_text.delta", `{"delta":"x"}`, `{"delta":"x"}`},
		{"multi-line", ID{2, 3}, "", "a\nb\nc", "a\nb\nc"},
		{"trailing newline", ID{2, 4}, "", "a\n", "a\n"},
		{"blank lines inside", ID{2, 5}, "", "a\n\n\nb", "a\n\n\nb"},
		{"crlf normalized", ID{2, 6}, "t", "a\r\nb\r\n", "a\nb\n"},
		{"cr normalized", ID{2, 7}, "t", "a\rb", "a\nb"},
		{"looks like fields", ID{2, 8}, "", "x\nevent: evil\nid: 9-9\n\ndata: y", "x\nevent: evil\nid: 9-9\n\ndata: y"},
		{"colons and spaces", ID{2, 9}, "", " : a: b ", " : a: b "},
		{"empty data with type", ID{2, 10}, "ping", "", ""},
		{"no id", ID{}, "", "x", "x"},
		{"unicode and nul", ID{3, 1}, "", "é\x00😀", "é\x00😀"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Two events back to back also checks that each one ends where it should.
			wire := AppendEvent(nil, tt.id, tt.typ, tt.data)
			wire = AppendEvent(wire, ID{9, 9}, "next", "n")
			evs := readBack(t, wire)
			if len(evs) != 2 {
				t.Fatalf("got %d events from %q; want 2", len(evs), wire)
			}
			ev := evs[0]
			if ev.Type != tt.typ || ev.Data != tt.wantData {
				t.Errorf("got type %q data %q; want type %q data %q", ev.Type, ev.Data, tt.typ, tt.wantData)
			}
			if !tt.id.IsZero() {
				id, err := ParseID(ev.LastEventID)
				if err != nil || id != tt.id {
					t.Errorf("id: got %v, %v; want %v", id, err, tt.id)
				}
			}
			if evs[1].Type != "next" || evs[1].Data != "n" || evs[1].LastEventID != "9-9" {
				t.Errorf("second event: got %+v; want next/n/9-9", evs[1])
			}
			// And through this package's Read.
			if got := readAll(t, string(wire), 0); got[0] != (Event{Type: tt.typ, Data: tt.wantData}) {
				t.Errorf("Read: got %+v; want %+v", got[0], Event{Type: tt.typ, Data: tt.wantData})
			}
		})
	}
}

func TestAppendEventFixturesRoundTrip(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"openai-chat-text", "openai-chat-usage", "openai-responses-completed", "anthropic-messages-text", "groq-chat-error-midstream"} {
		t.Run(name, func(t *testing.T) {
			in := readAll(t, fixture(t, name), 0)
			var wire []byte
			for i, ev := range in {
				wire = AppendEvent(wire, ID{1, uint64(i + 1)}, ev.Type, ev.Data)
			}
			out := readAll(t, string(wire), 0)
			if len(out) != len(in) {
				t.Fatalf("got %d events; want %d", len(out), len(in))
			}
			for i := range in {
				if out[i] != in[i] {
					t.Fatalf("event %d: got %+v; want %+v", i, out[i], in[i])
				}
			}
		})
	}
}

func BenchmarkAppendEvent(b *testing.B) {
	data := `{"id":"chatcmpl-B74aE2TDl9ZbKx2fXoVatoMDnErNm","object":"chat.completion.chunk","created":1741025614,"model":"gpt-3.5-turbo-0125","choices":[{"index":0,"delta":{"content":" joke"},"logprobs":null,"finish_reason":null}]}`
	id := ID{1764403200123, 42}
	buf := make([]byte, 0, 1024)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendEvent(buf[:0], id, "", data)
	}
}

// FuzzAppendEvent checks that any type and data survive the wire: data with
// its line breaks normalised to "\n", type with line breaks made spaces.
func FuzzAppendEvent(f *testing.F) {
	f.Add("", "a")
	f.Add("t", "a\r\nb\rc\n")
	f.Add(" x", "\n\n")
	f.Add("a\nb", "data: x\n\nid: 1")
	f.Fuzz(func(t *testing.T, typ, data string) {
		wire := AppendEvent(nil, ID{1, 2}, typ, data)
		evs := readBack(t, wire)
		if len(evs) != 1 {
			t.Fatalf("got %d events from %q; want 1", len(evs), wire)
		}
		wantType := strings.NewReplacer("\r", " ", "\n", " ").Replace(typ)
		wantData := strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(data)
		if evs[0].Type != wantType || evs[0].Data != wantData || evs[0].LastEventID != "1-2" {
			t.Fatalf("got %+v; want type %q data %q id 1-2", evs[0], wantType, wantData)
		}
	})
}
