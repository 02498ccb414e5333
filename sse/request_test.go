package sse

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func TestParseRequest(t *testing.T) {
	t.Parallel()
	def := Request{N: 1}
	tests := []struct {
		body string
		want Request
	}{
		{`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}`, Request{Model: "gpt-4o", Stream: true, N: 1, IncludeUsage: true}},
		{`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"n":3,"stream":true}`, Request{Model: "gpt-4o", Stream: true, N: 3}},
		{` {"stream" : true , "n" : 2 } ` + "\n", Request{Stream: true, N: 2}},
		{`{"stream":true,"stream_options":{"include_usage":false}}`, Request{Stream: true, N: 1}},
		{`{"stream":false,"stream_options":{"include_usage":true}}`, Request{N: 1, IncludeUsage: true}},
		{`{}`, def},

		// Only top-level members count.
		{`{"messages":[{"role":"user","content":"x","stream":true,"n":5,"model":"m"}],"stream_options":{"x":{"include_usage":true}}}`, def},
		{`{"messages":[{"content":"{\"stream\":true}"}]}`, def},
		{`{"metadata":{"stream":true},"model":"a"}`, Request{Model: "a", N: 1}},
		{`{"messages":[{"content":"\\\"stream\":true"}],"stream":false}`, def},

		// The last duplicate counts, as with encoding/json and Python, and
		// the first member read twice is named.
		{`{"stream":true,"stream":false}`, Request{N: 1, Duplicate: "stream"}},
		{`{"input":"x","stream":true,"background":true}`, Request{Stream: true, N: 1, Background: true}},
		{`{"stream":true,"background":"true","metadata":{"background":true}}`, Request{Stream: true, N: 1}},
		{`{"stream":true,"stream":null}`, Request{N: 1, Duplicate: "stream"}},
		{`{"stream":false,"stream":true}`, Request{Stream: true, N: 1, Duplicate: "stream"}},
		{`{"n":4,"n":"x"}`, Request{N: 1, Duplicate: "n"}},
		{`{"stream_options":{"include_usage":true,"include_usage":false}}`, Request{N: 1, Duplicate: "stream_options.include_usage"}},
		{`{"stream_options":{"include_usage":true},"stream_options":null}`, Request{N: 1, Duplicate: "stream_options"}},
		{`{"model":"a","model":"b"}`, Request{Model: "b", N: 1, Duplicate: "model"}},
		{`{"model":"x","stream":true,"mod\u0065l":"gpt-4o"}`, Request{Model: "gpt-4o", Stream: true, N: 1, Duplicate: "model"}},
		{`{"background":true,"n":2,"n":3,"background":false}`, Request{N: 3, Duplicate: "n"}},
		{`{"messages":[{"model":"a"},{"model":"b"}],"metadata":{"stream":1,"stream":2},"model":"c"}`, Request{Model: "c", N: 1}},
		{`{"model":"a","Model":"b"}`, Request{Model: "a", N: 1}},

		// Escaped keys are decoded; keys match case-sensitively.
		{`{"str\u0065am":true,"\u006e":2,"stream_options":{"include\u005fusage":true}}`, Request{Stream: true, N: 2, IncludeUsage: true}},
		{`{"Stream":true,"N":2,"MODEL":"x"}`, def},
		{`{"stream\u0000":true}`, def},

		// Values of the wrong kind.
		{`{"stream":"true","n":"2","model":7,"stream_options":{"include_usage":"true"}}`, def},
		{`{"stream":1}`, def},
		{`{"stream_options":null}`, def},
		{`{"stream_options":[{"include_usage":true}]}`, def},
		{`{"model":null}`, def},
		{`{"model":"caf\u00e9 \"x\""}`, Request{Model: `café "x"`, N: 1}},
		{`{"model":"café"}`, Request{Model: "café", N: 1}},
		{"{\"model\":\"a\xffb\"}", Request{Model: "a\uFFFDb", N: 1}},

		// n: an integer, at least 1, at most MaxChoices.
		{`{"n":1}`, def},
		{`{"n":128}`, Request{N: 128}},
		{`{"n":129}`, Request{N: 128}},
		{`{"n":100000000000}`, Request{N: 128}},
		{`{"n":0}`, def},
		{`{"n":-2}`, def},
		{`{"n":-0}`, def},
		{`{"n":2.0}`, def},
		{`{"n":2e0}`, def},
		{`{"n":99999999999999999999}`, def},
		{`{"n":null}`, def},

		// Malformed at the top level, or in a value read: the defaults.
		{`{"stream":true,"stream_options":{"include_usage":true}`, def},
		{`{"stream":true}}`, def},
		{`{"stream":true} {}`, def},
		{`{"stream":true,}`, def},
		{`{"stream":tru}`, def},
		{`{"stream":true "n":2}`, def},
		{`{"stream" true}`, def},
		{`{stream:true}`, def},
		{`{"stream":true,"n":02}`, def},
		{`{"stream":true,"n":}`, def},
		{`{"stream":true,"x":[1,2}`, def},
		{`{"stream":true,"x":"abc}`, def},
		{`{"stream":true,"stream_options":{"include_usage":true,}}`, def},
		{"{\"stream\":true,\"model\":\"a\x01\"}", def},
		{`{"stream":true,"model":"a\q"}`, def},
		{"\xef\xbb\xbf{\"stream\":true}", def},
		{`[{"stream":true}]`, def},
		{`"stream"`, def},
		{`null`, def},
		{`not json`, def},
		{``, def},
	}
	for _, tt := range tests {
		t.Run(tt.body, func(t *testing.T) {
			if got := ParseRequest([]byte(tt.body)); got != tt.want {
				t.Errorf("got %+v; want %+v", got, tt.want)
			}
		})
	}
}

func TestParseRequestNil(t *testing.T) {
	t.Parallel()
	if got := ParseRequest(nil); got != (Request{N: 1}) {
		t.Errorf("got %+v; want %+v", got, Request{N: 1})
	}
}

// TestParseRequestCopiesModel: the proxy's request buffer is reused after
// the handler, so Model must not point into it.
func TestParseRequestCopiesModel(t *testing.T) {
	t.Parallel()
	body := []byte(`{"model":"gpt-4o","stream":true}`)
	r := ParseRequest(body)
	for i := range body {
		body[i] = 'x'
	}
	if r.Model != "gpt-4o" {
		t.Errorf("Model after the body changed: got %q; want %q", r.Model, "gpt-4o")
	}
}

func TestRequestExpect(t *testing.T) {
	t.Parallel()
	got := Request{Model: "m", Stream: true, N: 3, IncludeUsage: true}.Expect()
	if want := (Expect{N: 3, Usage: true}); got != want {
		t.Errorf("got %+v; want %+v", got, want)
	}
}

// bigRequest is a chat request of about size bytes: a conversation with a
// base64 image, the top-level fields after it (as clients serialise them).
func bigRequest(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"messages":[{"role":"system","content":"You are helpful.\nBe brief."},{"role":"user","content":[{"type":"text","text":"What is in this image? \"quoted\" \\ backslash"},{"type":"image_url","image_url":{"url":"data:image/png;base64,`)
	for b.Len() < size {
		b.WriteString("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg")
	}
	b.WriteString(`"}}]}],"model":"gpt-4o","n":1,"stream":true,"stream_options":{"include_usage":true}}`)
	return b.Bytes()
}

func BenchmarkParseRequest(b *testing.B) {
	for _, size := range []struct {
		name  string
		bytes int
	}{{"1KiB", 1 << 10}, {"1MiB", 1 << 20}, {"8MiB", 8 << 20}} {
		body, name := bigRequest(size.bytes), size.name
		b.Run("ParseRequest/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if r := ParseRequest(body); !r.Stream || !r.IncludeUsage {
					b.Fatalf("got %+v", r)
				}
			}
		})
		// For comparison: what a validating parse costs.
		b.Run("gjson.Valid/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if !gjson.ValidBytes(body) {
					b.Fatal("invalid")
				}
			}
		})
		b.Run("encoding-json/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var m map[string]json.RawMessage
				if err := json.Unmarshal(body, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzParseRequest compares ParseRequest with encoding/json on valid JSON,
// and checks its bounds on anything.
func FuzzParseRequest(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		body := bytes.Clone(in) // cleared below; the fuzzer's own input must stay as it is
		got := ParseRequest(body)
		if got.N < 1 || got.N > MaxChoices {
			t.Fatalf("N: got %d; want 1..%d", got.N, MaxChoices)
		}
		if again := ParseRequest(body); again != got {
			t.Fatalf("twice: got %+v, then %+v; want the same", got, again)
		}
		if json.Valid(body) {
			if want := requestByEncodingJSON(body); got != want {
				t.Fatalf("got %+v; want %+v (encoding/json)", got, want)
			}
		}
		model := strings.Clone(got.Model)
		clear(body)
		if got.Model != model {
			t.Fatalf("Model: got %q after the body was cleared; want %q (a copy)", got.Model, model)
		}
	})
}

// requestByEncodingJSON is ParseRequest's reference: encoding/json decodes
// the top level into a map, because a map matches keys exactly and keeps
// the last duplicate, as the upstreams do; a struct would match keys
// case-insensitively and let a later null leave an earlier value.
func requestByEncodingJSON(body []byte) Request {
	r := Request{N: 1}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return r
	}
	var stream bool
	if json.Unmarshal(top["stream"], &stream) == nil {
		r.Stream = stream
	}
	var background bool
	if json.Unmarshal(top["background"], &background) == nil {
		r.Background = background
	}
	var n int
	if json.Unmarshal(top["n"], &n) == nil {
		r.N = min(max(n, 1), MaxChoices)
	}
	var opts map[string]json.RawMessage
	var usage bool
	if json.Unmarshal(top["stream_options"], &opts) == nil && json.Unmarshal(opts["include_usage"], &usage) == nil {
		r.IncludeUsage = usage
	}
	var model string
	if json.Unmarshal(top["model"], &model) == nil {
		r.Model = model
	}
	r.Duplicate = duplicateByDecoder(body, top["stream_options"])
	return r
}

// duplicateByDecoder is Request.Duplicate read with encoding/json's token
// stream: the first member ParseRequest reads that appears twice at the
// top level, or else include_usage twice in the last stream_options.
func duplicateByDecoder(body []byte, opts json.RawMessage) string {
	read := map[string]bool{"model": true, "stream": true, "n": true, "stream_options": true, "background": true}
	if d := firstDuplicate(body, read); d != "" {
		return d
	}
	if firstDuplicate(opts, map[string]bool{"include_usage": true}) != "" {
		return "stream_options.include_usage"
	}
	return ""
}

// firstDuplicate returns the first key of names that the JSON object obj
// holds a second time, at its top level.
func firstDuplicate(obj []byte, names map[string]bool) string {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		key, _ := tok.(string)
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return ""
		}
		if names[key] && seen[key] {
			return key
		}
		seen[key] = true
	}
	return ""
}
