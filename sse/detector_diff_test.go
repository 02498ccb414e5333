package sse

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fixtureNames lists the recorded streams in testdata, without ".sse".
func fixtureNames(tb testing.TB) []string {
	tb.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "*.sse"))
	if err != nil || len(paths) == 0 {
		tb.Fatalf("fixtures: got %d, %v; want some", len(paths), err)
	}
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = strings.TrimSuffix(filepath.Base(p), ".sse")
	}
	return names
}

// BenchmarkObserve feeds every event of each recorded stream, and of
// mockStream, to a Detector (one op is one whole stream, after a Reset;
// ns/event is the cost of one Observe); BenchmarkObserveRef does the same
// with refDetector, the Detector before its walker skipped values, so that
// one run compares both.
func BenchmarkObserve(b *testing.B) {
	benchObserve(b, func(e Expect) observer { return NewDetector(e) })
}

func BenchmarkObserveRef(b *testing.B) {
	benchObserve(b, func(e Expect) observer { return refNewDetector(e) })
}

type observer interface {
	Reset(Expect)
	Observe(Event)
}

// mockStream is the stream the bench's mock upstream (internal/mockllm)
// sends for a chat request of 197 tokens: a role chunk, content chunks of
// about 220 bytes, a finish chunk, [DONE]. It is what the proxy's Detector
// sees at saturation in the bench.
func mockStream() string {
	const head = `data: {"id":"chatcmpl-3kTqPz81xVbc","object":"chat.completion.chunk","created":1743811170,"model":"gpt-4o-mini","system_fingerprint":"fp_5c1e0a8b3d","choices":[`
	const tail = "]}\n\n"
	words := []string{" the", " stream", " proxy", " token", " event", " model", " request"}
	var sb strings.Builder
	sb.WriteString(head + `{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}` + tail)
	for i := range 197 {
		sb.WriteString(head + `{"index":0,"delta":{"content":"` + words[i%len(words)] + `"},"logprobs":null,"finish_reason":null}` + tail)
	}
	sb.WriteString(head + `{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}` + tail)
	sb.WriteString("data: [DONE]\n\n")
	return sb.String()
}

func benchObserve(b *testing.B, newDetector func(Expect) observer) {
	streams := map[string]string{"mock-chat": mockStream()}
	names := []string{"mock-chat"}
	for _, name := range fixtureNames(b) {
		streams[name] = fixture(b, name)
		names = append(names, name)
	}
	for _, name := range names {
		evs := readAll(b, streams[name], 0)
		size := 0
		for _, ev := range evs {
			size += len(ev.Type) + len(ev.Data)
		}
		e := Expect{Usage: name == "openai-chat-usage"}
		b.Run(name, func(b *testing.B) {
			d := newDetector(e)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				d.Reset(e)
				for _, ev := range evs {
					d.Observe(ev)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(evs)), "ns/event")
		})
	}
}

// FuzzDetectorDifferential checks that the Detector gives the verdict of
// refDetector on every input: Terminal and Dialect after each event, and
// at the end Clean for both values of intact, Usage and LastSequence. The
// body is read as an SSE stream, and also line by line, each line the data
// of one event, so that mutations of the JSON need not keep the framing.
func FuzzDetectorDifferential(f *testing.F) {
	for _, name := range fixtureNames(f) {
		body := fixture(f, name)
		usage := name == "openai-chat-usage"
		f.Add(uint8(1), usage, []byte(body))
		if cut, ok := strings.CutSuffix(body, "data: [DONE]\n\n"); ok {
			f.Add(uint8(1), usage, []byte(cut))
		}
		for _, b := range blocks(body) {
			f.Add(uint8(2), !usage, []byte(b))
		}
	}
	// The corpus of FuzzDetector, which has the same arguments.
	paths, _ := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzDetector", "*"))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		n, usage, body, ok := parseDetectorSeed(string(b))
		if !ok {
			f.Fatalf("%s: not a FuzzDetector seed", p)
		}
		f.Add(n, usage, body)
	}
	for _, s := range []string{
		`{"object":"chat.completion.chunk","choices":[{"delta":{"content":"a\"}\\"},"index":1,"finish_reason":"stop"}]}`,
		`{"choices":[{"delta":{"content":"[{\"x\":\"]"}],"finish_reason":null,"index":0},{"index":"1"}],"usage":{"prompt_tokens":3,"completion_tokens":1e1}}`,
		`{"type":"message_delta","delta":{"stop_reason":null,"stop_reason":"end_turn"},"usage":{"output_tokens":5,"input_tokens":-1}}`,
		`{"type":"response.completed","sequence_number":1.0,"response":{"output":[{"content":[{"text":"}"}]}],"usage":{"input_tokens":2,"output_tokens":3}}}`,
		`{"type":"message_start","message":{"content":[],"usage":{"input_tokens":9,"output_tokens":1}}}`,
		`{"t\u0079pe":"error","err\u006fr":null,"choices":[{"ind\u0065x":0}]}`,
		`{"choices":[{"delta":{"content":"x"},"index":0,"finish_reason":"stop"}`,
		`{"choices":[{"delta":{"content":"x\\`,
		` { "choices" : [ { "index" : 0 , "delta" : { } , "finish_reason" : "" } ] } `,
	} {
		f.Add(uint8(1), false, []byte("data: "+s+"\n\n"))
		f.Add(uint8(1), true, []byte(s))
	}
	// Events that start like the one before (the Detector remembers the
	// previous event's leading members) and then differ.
	for _, s := range []string{
		`{"id":"a","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null}]}` + "\n" +
			`{"id":"a","object":"chat.completion.chunk","choices":[{"index":1,"delta":{"content":"\"}"},"logprobs":null,"finish_reason":"stop"}]}` + "\n" +
			`{"id":"a","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":""}],"usage":{"prompt_tokens":1}}`,
		`{"id":"a","type":"x","object":"y","model":"m","error":null}` + "\n" + `{"id":"a","type":"x","object":"y","model":"m","error":1}`,
		`{"id":"a","type":"message_start","message":{}}` + "\n" + `{"id":"a","type":"message_stop"}` + "\n" + `{"id":"a","type":"message_stop"`,
		`{"type":"error","type":"response.completed","id":1,"response":{}}` + "\n" + `{"type":"error","type":"response.completed","id":1,"sequence_number":2}`,
		`{"object":"x","t\u0079pe":"message_delta","delta":{}}` + "\n" + `{"object":"x","t\u0079pe":"message_delta","delta":{"stop_reason":"end_turn"}}`,
		`{"type":"messag\u0065_stop","choices":[]}` + "\n" + `{"type":"messag\u0065_stop","choices":[]}`,
	} {
		f.Add(uint8(2), false, []byte(s))
	}
	f.Fuzz(func(t *testing.T, n uint8, usage bool, body []byte) {
		e := Expect{N: int(n), Usage: usage}
		evs := readUntilError(body)
		compareDetectors(t, e, evs)
		evs = evs[:0]
		for line := range strings.SplitSeq(string(body), "\n") {
			evs = append(evs, Event{Data: line})
		}
		compareDetectors(t, e, evs)
	})
}

func compareDetectors(t *testing.T, e Expect, evs []Event) {
	t.Helper()
	d, r := NewDetector(e), refNewDetector(e)
	for i, ev := range evs {
		d.Observe(ev)
		r.Observe(ev)
		if d.Terminal() != r.Terminal() || d.Dialect() != r.Dialect() {
			t.Fatalf("after event %d %+v: got Terminal %v, Dialect %v; want %v, %v", i, ev, d.Terminal(), d.Dialect(), r.Terminal(), r.Dialect())
		}
	}
	for _, intact := range []bool{false, true} {
		ok, why := d.Clean(intact)
		wok, wwhy := r.Clean(intact)
		if ok != wok || why != wwhy {
			t.Fatalf("Clean(%v): got %v %q; want %v %q", intact, ok, why, wok, wwhy)
		}
	}
	in, out, u := d.Usage()
	win, wout, wu := r.Usage()
	if in != win || out != wout || u != wu {
		t.Fatalf("Usage: got %d %d %v; want %d %d %v", in, out, u, win, wout, wu)
	}
	seq, ok := d.LastSequence()
	wseq, wok := r.LastSequence()
	if seq != wseq || ok != wok {
		t.Fatalf("LastSequence: got %d %v; want %d %v", seq, ok, wseq, wok)
	}
}

// parseDetectorSeed reads a FuzzDetector corpus file (go test fuzz v1:
// byte, bool, []byte).
func parseDetectorSeed(s string) (n uint8, usage bool, body []byte, ok bool) {
	lines := strings.SplitN(strings.TrimSpace(s), "\n", 4)
	if len(lines) != 4 || lines[0] != "go test fuzz v1" {
		return 0, false, nil, false
	}
	arg := func(line, typ string) (string, bool) {
		v, found := strings.CutPrefix(line, typ+"(")
		v, found2 := strings.CutSuffix(v, ")")
		return v, found && found2
	}
	b, ok1 := arg(lines[1], "byte")
	u, ok2 := arg(lines[2], "bool")
	p, ok3 := arg(lines[3], "[]byte")
	if !ok1 || !ok2 || !ok3 {
		return 0, false, nil, false
	}
	var err error
	if b, err = strconv.Unquote(b); err != nil || len(b) != 1 {
		return 0, false, nil, false
	}
	if usage, err = strconv.ParseBool(u); err != nil {
		return 0, false, nil, false
	}
	if p, err = strconv.Unquote(p); err != nil {
		return 0, false, nil, false
	}
	return b[0], usage, []byte(p), true
}

// TestPrefixMemo: on the bench mock's stream, every content chunk after
// the first resumes from the previous chunk's prefix, down into the first
// choice, and the verdict is still refDetector's.
func TestPrefixMemo(t *testing.T) {
	t.Parallel()
	evs := readAll(t, mockStream(), 0)
	d := NewDetector(Expect{})
	for i, ev := range evs[:len(evs)-1] {
		d.Observe(ev)
		if d.memo.deep == 0 || ev.Data[:d.memo.deep] != string(d.memo.buf[:d.memo.deep]) {
			t.Fatalf("after event %d: deep prefix %d, %q; want the chunk up to its delta", i, d.memo.deep, d.memo.buf[:d.memo.deep])
		}
	}
	compareDetectors(t, Expect{}, evs)
}
