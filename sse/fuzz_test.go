package sse

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func fuzzSeeds(f *testing.F) {
	for _, name := range []string{"openai-chat-text", "openai-chat-usage", "openai-responses-completed", "anthropic-messages-text", "groq-chat-error-midstream"} {
		// Small seeds: the fuzzer minimises every new interesting input, which
		// crawls on a 28 KB seed. The head and tail keep the dialect's shape.
		bs := blocks(fixture(f, name))
		seed := strings.Join(bs[:min(2, len(bs))], "") + strings.Join(bs[max(0, len(bs)-2):], "")
		if len(seed) > 2048 {
			seed = seed[len(seed)-2048:]
		}
		f.Add([]byte(seed))
	}
	for _, s := range []string{
		"", "data: a\n\n", "data: a\r\ndata: b\r\r", "event: x\n\n", "id: 1\n\n", ": c\n\ndata\n\n",
		"\xef\xbb\xbfdata: a\n\n", "data:  a\n\nevent:b\rdata:\n\n", "data: a\n\ndata: b",
		"data: {\"choices\":[{\"index\":3,\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
		"data: {\"error\":{\"a\":\"\\\"\"},\"type\":\"response.x\",\"sequence_number\":1e3}\n\n",
	} {
		f.Add([]byte(s))
	}
}

// FuzzRead feeds arbitrary bytes through Read with a small bound: it must
// not panic, every event yielded must re-encode and re-read identically, and
// the Detector must digest it.
func FuzzRead(f *testing.F) {
	fuzzSeeds(f)
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

// FuzzMembers checks the hot-path JSON walker against gjson on valid
// objects, and that it never panics on anything.
func FuzzMembers(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"b":"x\"y","c":{"d":[1,{"e":"]"}]},"f":null}`, `{"k\u0065y":true}`, `[1,2]`, `{"a":`, `{"a":"\\"}`, ` { "a" : [ ] , "b" : -1.5e3 } `} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var got []string
		members(s, func(k, v string) {
			got = append(got, k, v)
			elements(v, func(string) {})
		})
		if !gjson.Valid(s) || !gjson.Parse(s).IsObject() {
			return
		}
		var want []string
		gjson.Parse(s).ForEach(func(k, v gjson.Result) bool {
			want = append(want, k.Str, v.Raw)
			return true
		})
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
			t.Fatalf("got %q; want %q", got, want)
		}
	})
}
