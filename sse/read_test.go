package sse

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReadFixtures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		events    int
		firstType string
		lastType  string
		lastData  string
	}{
		{"openai-chat-text", 20, "", "", "[DONE]"},
		{"openai-chat-usage", 12, "", "", "[DONE]"},
		{"openai-responses-completed", 15, "response.created", "response.completed", ""},
		{"anthropic-messages-text", 7, "message_start", "message_stop", `{"type":"message_stop"    }`},
		{"groq-chat-error-midstream", 95, "", "error", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs := readAll(t, fixture(t, tt.name), 0)
			if len(evs) != tt.events {
				t.Fatalf("got %d events; want %d", len(evs), tt.events)
			}
			if got := evs[0].Type; got != tt.firstType {
				t.Errorf("first type: got %q; want %q", got, tt.firstType)
			}
			last := evs[len(evs)-1]
			if last.Type != tt.lastType {
				t.Errorf("last type: got %q; want %q", last.Type, tt.lastType)
			}
			if tt.lastData != "" && last.Data != tt.lastData {
				t.Errorf("last data: got %q; want %q", last.Data, tt.lastData)
			}
		})
	}
}

// shapes are streams of each shape the SSE rules give, and their events,
// for Read and the Scanner alike.
var shapes = []struct {
	name string
	in   string
	want []Event
}{
	{"multi-line data", "data: a\ndata: b\n\n", []Event{{Data: "a\nb"}}},
	{"crlf and cr line breaks", "event: x\r\ndata: a\rdata: b\r\n\r\n", []Event{{Type: "x", Data: "a\nb"}}},
	{"cr after a blank line", "data: a\r\r\ndata: b\n\n", []Event{{Data: "a"}, {Data: "b"}}},
	{"id-only and retry-only blocks skipped", "id: 7\n\nretry: 10\n\ndata: a\n\n", []Event{{Data: "a"}}},
	{"comments skipped", ": ping\n\ndata: a\n\n", []Event{{Data: "a"}}},
	{"field without colon", "data\ndata\n\nevent\ndata:x\n\n", []Event{{Data: "\n"}, {Data: "x"}}},
	{"unknown and long names ignored", "datas: a\nx: y\ndata: b\nevent:: c\n\n", []Event{{Type: ": c", Data: "b"}}},
	// go-sse dispatches a block with an event field and no data; the
	// specification would not.
	{"named event without data kept", "event: ping\n\n", []Event{{Type: "ping"}}},
	{"one leading space stripped only", "data:  a\n\n", []Event{{Data: " a"}}},
	{"type after data", "data: aaaa\nevent: t\ndata: b\ndata: c\n\n", []Event{{Type: "t", Data: "aaaa\nb\nc"}}},
	{"type between short data", "data:\nevent: tt\ndata: b\n\n", []Event{{Type: "tt", Data: "\nb"}}},
	{"last type wins", "event: a\nevent: b\ndata: x\n\ndata: y\n\n", []Event{{Type: "b", Data: "x"}, {Data: "y"}}},
	{"incomplete final event discarded", "data: a\n\ndata: b", []Event{{Data: "a"}}},
	{"final event without blank line discarded", "data: a\n\ndata: b\n", []Event{{Data: "a"}}},
	{"empty", "", nil},
	{"bom removed", "\xef\xbb\xbfdata: a\n\n", []Event{{Data: "a"}}},
	{"bom removed once", "\xef\xbb\xbf\xef\xbb\xbfdata: a\n\ndata: b\n\n", []Event{{Data: "b"}}},
	// go-sse strips it from the first line that is not blank.
	{"bom after blank lines removed", "\n\n\xef\xbb\xbfdata: a\n\n", []Event{{Data: "a"}}},
	{"bom later kept", "data: a\n\n\xef\xbb\xbfdata: b\n\n", []Event{{Data: "a"}}},
}

func TestReadShapes(t *testing.T) {
	t.Parallel()
	for _, tt := range shapes {
		t.Run(tt.name, func(t *testing.T) {
			got := readAll(t, tt.in, 0)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("got %q; want %q", got, tt.want)
			}
		})
	}
}

func TestReadTooLarge(t *testing.T) {
	t.Parallel()
	const limit = 1024
	tests := []struct {
		name    string
		in      string
		wantErr bool
	}{
		{"fits", "data: " + strings.Repeat("x", limit/2) + "\n\n", false},
		{"too large", "data: " + strings.Repeat("x", 2*limit) + "\n\n", true},
		{"too large after small", "data: a\n\ndata: " + strings.Repeat("x", 2*limit) + "\n\n", true},
		{"too large without end", "data: " + strings.Repeat("x", 2*limit), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			n := 0
			for _, e := range Read(strings.NewReader(tt.in), limit) {
				if e != nil {
					err = e
					continue
				}
				n++
			}
			if got := errors.Is(err, ErrEventTooLarge); got != tt.wantErr {
				t.Fatalf("errors.Is(%v, ErrEventTooLarge): got %v; want %v", err, got, tt.wantErr)
			}
			if tt.wantErr && !strings.Contains(err.Error(), "1024") {
				t.Errorf("error %q: got no bound in the text; want 1024", err)
			}
		})
	}
}

func TestReadDefaultBoundAboveGoSSEDefault(t *testing.T) {
	t.Parallel()
	// go-sse alone stops at 64 KiB; a Responses response.completed is bigger.
	big := "data: " + strings.Repeat("x", 200<<10) + "\n\n"
	evs := readAll(t, big, 0)
	if len(evs) != 1 || len(evs[0].Data) != 200<<10 {
		t.Fatalf("got %d events; want 1 of %d bytes", len(evs), 200<<10)
	}
}

// TestReadError: a read error ends Read, and the Scanner, with that error
// after the events before it.
func TestReadError(t *testing.T) {
	t.Parallel()
	readers := map[string]func(r io.Reader) ([]string, error){
		"Read": func(r io.Reader) (got []string, err error) {
			for ev, e := range Read(r, 0) {
				if e != nil {
					err = e
					continue
				}
				got = append(got, ev.Data)
			}
			return got, err
		},
		"Scanner": func(r io.Reader) (got []string, err error) {
			s := NewScanner(r, 0)
			for s.Next() {
				got = append(got, s.Event().Data)
			}
			if s.Next() {
				t.Errorf("Scanner: Next after the error: got true; want false")
			}
			return got, s.Err()
		},
	}
	for name, read := range readers {
		got, err := read(io.MultiReader(strings.NewReader("data: a\n\ndata: b"), iotest.ErrReader(io.ErrUnexpectedEOF)))
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: got error %v; want io.ErrUnexpectedEOF", name, err)
		}
		if fmt.Sprint(got) != "[a]" {
			t.Errorf("%s: got events %q; want [a]", name, got)
		}
	}
}

func TestReadStopEarly(t *testing.T) {
	t.Parallel()
	n := 0
	for range Read(strings.NewReader("data: a\n\ndata: b\n\n"), 0) {
		n++
		break
	}
	if n != 1 {
		t.Errorf("got %d iterations; want 1", n)
	}
}

// openAIStream is 200 OpenAI chat chunks and [DONE], as read from memory
// by the reader benchmarks.
func openAIStream() string {
	chunk := `{"id":"chatcmpl-B74aE2TDl9ZbKx2fXoVatoMDnErNm","object":"chat.completion.chunk","created":1741025614,"model":"gpt-3.5-turbo-0125","choices":[{"index":0,"delta":{"content":" joke"},"logprobs":null,"finish_reason":null}]}`
	var sb strings.Builder
	for range 200 {
		sb.WriteString("data: " + chunk + "\n\n")
	}
	sb.WriteString("data: [DONE]\n\n")
	return sb.String()
}

func BenchmarkRead(b *testing.B) {
	body := openAIStream()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		for _, err := range Read(strings.NewReader(body), 0) {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}

// fuzzSeeds gives add the seeds of the fuzz targets that read streams.
func fuzzSeeds(f *testing.F, add func(seed []byte)) {
	for _, name := range []string{"openai-chat-text", "openai-chat-usage", "openai-responses-completed", "anthropic-messages-text", "groq-chat-error-midstream"} {
		// Small seeds: the fuzzer minimises every new interesting input, which
		// crawls on a 28 KB seed. The head and tail keep the dialect's shape.
		bs := blocks(fixture(f, name))
		seed := strings.Join(bs[:min(2, len(bs))], "") + strings.Join(bs[max(0, len(bs)-2):], "")
		if len(seed) > 2048 {
			seed = seed[len(seed)-2048:]
		}
		add([]byte(seed))
	}
	for _, s := range []string{
		"", "data: a\n\n", "data: a\r\ndata: b\r\r", "event: x\n\n", "id: 1\n\n", ": c\n\ndata\n\n",
		"\xef\xbb\xbfdata: a\n\n", "data:  a\n\nevent:b\rdata:\n\n", "data: a\n\ndata: b",
		"data: {\"choices\":[{\"index\":3,\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
		"data: {\"error\":{\"a\":\"\\\"\"},\"type\":\"response.x\",\"sequence_number\":1e3}\n\n",
	} {
		add([]byte(s))
	}
}

// FuzzRead feeds arbitrary bytes through Read with a small bound: it must
// not panic, every event yielded must re-encode and re-read identically, and
// the Detector must digest it.
func FuzzRead(f *testing.F) {
	fuzzSeeds(f, func(seed []byte) { f.Add(seed) })
	f.Fuzz(func(t *testing.T, in []byte) {
		d := NewDetector(Expect{Usage: true})
		var evs []Event
		for ev, err := range Read(strings.NewReader(string(in)), 512) {
			if err != nil {
				break
			}
			if ev.Type == "" && ev.Data == "" {
				t.Fatalf("got an empty event; want it skipped")
			}
			evs = append(evs, ev)
			d.Observe(ev)
		}
		d.Terminal()
		d.Clean(false)
		d.Clean(true)
		d.Usage()
		var wire []byte
		for i, ev := range evs {
			wire = AppendEvent(wire, ID{7, uint64(i + 1)}, ev.Type, ev.Data)
		}
		got := readAll(t, string(wire), 1<<20)
		if len(got) != len(evs) {
			t.Fatalf("re-read: got %d events; want %d", len(got), len(evs))
		}
		for i := range evs {
			if got[i] != evs[i] {
				t.Fatalf("event %d: got %+v; want %+v", i, got[i], evs[i])
			}
		}
	})
}
