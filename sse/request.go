package sse

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"
)

// MaxChoices bounds Request.N and Expect.N. It is OpenAI's own limit on
// "n"; a larger n is read as MaxChoices, so an upstream that does send more
// choices is judged unclean (a choice index >= N), never stored.
const MaxChoices = 128

// Request holds what the proxy acts on in a JSON request body, all from
// top-level members: a "stream" or "n" nested inside "messages" (or
// anywhere below the top level) does not count.
type Request struct {
	// Model is the top-level "model" string, "" when absent or not a string.
	// It is the client's text, unbounded in length: bound it before using it
	// as a metrics label.
	Model string
	// Stream is true when "stream" is the JSON value true.
	Stream bool
	// N is "n", the number of choices asked for: 1 when absent, null, not
	// a JSON integer (2.0 and 2e0 are not, as with encoding/json into an
	// int) or below 1; at most MaxChoices.
	N int
	// IncludeUsage is true when "stream_options" is an object whose
	// "include_usage" is the JSON value true.
	IncludeUsage bool
	// Background is true when "background" is the JSON value true (OpenAI
	// Responses: the provider keeps the response, and its stream can be
	// resumed).
	Background bool
	// Duplicate names the first member read here that the body holds more
	// than once ("model", "stream", "n", "stream_options", "background",
	// or "stream_options.include_usage"), escaped spellings included; ""
	// when none is. The fields above then hold the last one, as
	// encoding/json and Python's json read it, but an upstream's parser
	// may take the first, so the proxy refuses such a body rather than
	// act on a member the upstream may not read (or rewrite one it does
	// not use).
	Duplicate string
}

// Expect returns what a Detector should require of the stream that answers
// r.
func (r Request) Expect() Expect { return Expect{N: r.N, Usage: r.IncludeUsage} }

// requestKeys are the member names ParseRequest reads; maxEscapedKey is the
// longest raw key (quotes included) that can still decode to one of them,
// every ASCII letter taking at most 6 bytes as \uXXXX.
const maxEscapedKey = 2 + 6*len("stream_options")

// ParseRequest reads the Request fields of a JSON request body. A body that
// is not a JSON object gives the defaults, Request{N: 1}; so does one found
// malformed (see below). When a member appears twice the last one counts, as
// with encoding/json and Python's json module, which is what the upstreams
// run. Keys match exactly, escapes decoded ("str\u0065am" is "stream"); they
// do not match case-insensitively as encoding/json into a struct would,
// since the upstreams do not either.
//
// ParseRequest runs on every request, and bodies carry whole conversations
// and base64 images (megabytes), so it does not validate the whole body. It
// walks the top-level object strictly (keys, colons, commas, the closing
// brace, nothing but whitespace after it, scalars checked exactly) and
// fully checks the values it reads, but only delimits the values it skips:
// a string by its closing quote, an array or object by its matching bracket.
// That costs about one memchr per string instead of a check of every byte:
// 0.1 ms for an 8 MiB body holding a base64 image, against 6 ms for
// gjson.Valid and 55 ms for encoding/json (BenchmarkParseRequest). The walk
// is the package's JSON walker (walker), which the Detector runs leniently.
// It is still correct where it matters: a body whose fault hides inside a
// skipped value (say, a control character in a message) is not JSON, so the
// upstream rejects it with a 4xx, which the proxy relays and never stores;
// no stream is judged by what was read from it. On well-formed JSON the
// result is exactly what encoding/json gives for these members
// (FuzzParseRequest checks it).
//
// The body is not retained: Model is a copy.
func ParseRequest(body []byte) Request {
	// A string view of body, not a copy: the walk only reads, and nothing
	// that points into it outlives this call.
	s := unsafe.String(unsafe.SliceData(body), len(body))
	var model, stream, n, opts, background string // the last raw value of each member
	dup := ""
	set := func(p *string, name, val string) {
		if *p != "" && dup == "" {
			dup = name
		}
		*p = val
	}
	w := walk(s, 0, '{', true)
	for w.next() {
		val := w.value()
		if !delimited(val) {
			return Request{N: 1}
		}
		switch name := memberName(w.key()); name {
		case "model":
			set(&model, name, val)
		case "stream":
			set(&stream, name, val)
		case "n":
			set(&n, name, val)
		case "stream_options":
			set(&opts, name, val)
		case "background":
			set(&background, name, val)
		}
	}
	if !w.closed() {
		return Request{N: 1}
	}
	r := Request{Stream: stream == "true", N: 1, Background: background == "true", Duplicate: dup}
	if v, ok := intLiteral(n); ok && int64(int(v)) == v {
		r.N = int(min(max(v, 1), MaxChoices))
	}
	if opts != "" && opts[0] == '{' {
		// The only value read below the top level, so the only one
		// checked whole; gjson's check costs less than encoding/json's.
		if !gjson.Valid(opts) {
			return Request{N: 1}
		}
		var usage string
		for w := walk(opts, 0, '{', true); w.next(); {
			if val := w.value(); memberName(w.key()) == "include_usage" {
				if usage != "" && r.Duplicate == "" {
					r.Duplicate = "stream_options.include_usage"
				}
				usage = val
			}
		}
		r.IncludeUsage = usage == "true"
	}
	if model != "" && model[0] == '"' {
		m, ok := stringValue(model)
		if !ok {
			return Request{N: 1}
		}
		r.Model = m
	}
	return r
}

// memberName returns the name a raw JSON key (quotes included) stands for,
// or "" when it cannot be one that ParseRequest reads.
func memberName(key string) string {
	name := key[1 : len(key)-1]
	if strings.IndexByte(name, '\\') < 0 {
		return name
	}
	if len(key) > maxEscapedKey {
		return ""
	}
	var s string
	if json.Unmarshal([]byte(key), &s) != nil {
		return ""
	}
	return s
}

// stringValue decodes a raw JSON string value into a fresh string, as
// encoding/json does (invalid UTF-8 becomes U+FFFD); ok is false when raw
// is not a valid JSON string.
func stringValue(raw string) (string, bool) {
	inner := raw[1 : len(raw)-1]
	if strings.IndexByte(inner, '\\') < 0 && utf8.ValidString(inner) && !hasControl(inner) {
		return strings.Clone(inner), true
	}
	var s string
	if json.Unmarshal([]byte(raw), &s) != nil {
		return "", false
	}
	return s, true
}

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 {
			return true
		}
	}
	return false
}

// delimited reports whether raw, as valueEnd cut it, can be a JSON value:
// a string or container closed by its own kind of delimiter, or an exact
// scalar (true, false, null, a number).
func delimited(raw string) bool {
	if raw == "" {
		return false
	}
	switch c, last := raw[0], raw[len(raw)-1]; c {
	case '"':
		return len(raw) >= 2 && last == '"' && stringEnd(raw, 0) == len(raw)
	case '{':
		return last == '}'
	case '[':
		return last == ']'
	case 't':
		return raw == "true"
	case 'f':
		return raw == "false"
	case 'n':
		return raw == "null"
	}
	return isNumberLiteral(raw)
}

// isNumberLiteral reports whether s is exactly a JSON number.
func isNumberLiteral(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		i = skipDigits(s, i)
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		j := i + 1
		if i = skipDigits(s, j); i == j {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		j := i
		if i = skipDigits(s, i); i == j {
			return false
		}
	}
	return i == len(s)
}

// skipDigits returns the index of the first byte from s[i] on that is not
// a decimal digit.
func skipDigits(s string, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}
