package sse

import (
	"math/bits"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// This file holds the package's one JSON walker, for its two readers of
// JSON: ParseRequest walks a request body strictly, the Detector walks each
// event's data leniently, on its hot path. Neither parses the values it
// skips (gjson's ForEach did, which made Observe cost ~1.2 µs per 200-byte
// chat chunk, about the proxy's whole relay cost per event): the walker
// only finds where values start and end, and the few values a reader needs
// are decoded afterwards. It never reads out of bounds and never panics on
// malformed input: it stops early instead.

// A walker reads the members of one JSON object, or the elements of one
// array, in order, as bufio.Scanner reads lines: each call of next moves
// to the next one, past the opening bracket or the comma before it, and
// reads an object member's key and colon; the caller then reads the value
// at w.i (value, or its own reading and at). Each member costs one call,
// which matters on the Detector's hot path.
//
// A strict walk stops at a comma before the closing bracket, and its
// reader checks each value it takes (ParseRequest with delimited, the
// Detector's fast reading of "choices" with plainValueEnd); a lenient one
// (the rest of the Detector) takes a trailing comma and only delimits
// values. Neither looks inside a string or a nested container beyond
// finding its end.
type walker struct {
	s      string
	i      int    // where the next member or element, or the separator before it, is read
	end    int    // just past the closing bracket once next met it; 0 while not, or at a fault
	ks     int    // where the current member's key starts (its opening quote)
	text   string // the key's text between its quotes
	esc    bool   // the key holds an escape (see name)
	strict bool   // no comma before the closing bracket
	after  bool   // a member or element was read: a comma or the closing bracket comes next
	closer byte   // '}' or ']'
}

// walk returns a walker of the object or array (open is '{' or '[') that
// starts, after white space, at s[i]. When there is none, its next reports
// false at once.
func walk(s string, i int, open byte, strict bool) walker {
	i = skipSpace(s, i)
	if i >= len(s) || s[i] != open {
		return walker{}
	}
	return walker{s: s, i: i + 1, strict: strict, closer: open + 2} // '{'+2 is '}', '['+2 is ']'
}

// next moves to the next member or element and reports whether there is
// one, at w.i (for a member, its value: key and name give its key). It is
// false at the closing bracket, which sets end, and at a fault, which
// leaves end 0.
func (w *walker) next() bool {
	s, i := w.s, skipSpace(w.s, w.i)
	if w.after {
		if i >= len(s) || s[i] != ',' {
			if i < len(s) && s[i] == w.closer {
				w.end = i + 1
			}
			return false
		}
		i = skipSpace(s, i+1)
		if w.strict && i < len(s) && s[i] == w.closer {
			return false
		}
	} else {
		w.after = true
	}
	if i >= len(s) {
		return false
	}
	if s[i] == w.closer {
		w.end = i + 1
		return false
	}
	if w.closer == ']' {
		w.i = i
		return true
	}
	// A member: its key and the colon after it.
	if s[i] != '"' {
		return false
	}
	ke, esc := scanString(s, i)
	if ke < 0 {
		return false
	}
	j := skipSpace(s, ke)
	if j >= len(s) || s[j] != ':' {
		return false
	}
	j = skipSpace(s, j+1)
	if j >= len(s) {
		return false
	}
	w.ks, w.text, w.esc, w.i = i, s[i+1:ke-1], esc, j
	return true
}

// key returns the current member's key as it stands, with its quotes.
func (w *walker) key() string { return w.s[w.ks : w.ks+len(w.text)+2] }

// name returns the name the current member's key stands for, decoded as
// jsonString decodes.
func (w *walker) name() string {
	if w.esc {
		return w.unescaped()
	}
	return w.text
}

// unescaped is name for a key that holds an escape, a rare one. It is kept
// out of line so that name, on the hot path, inlines.
//
//go:noinline
func (w *walker) unescaped() string { return unescape(w.key()) }

// value returns the value at w.i, as valueEnd delimits it, and moves past
// it.
func (w *walker) value() string {
	v := w.s[w.i:valueEnd(w.s, w.i)]
	w.i += len(v)
	return v
}

// at moves past a value that the caller read itself, up to s[e].
func (w *walker) at(e int) { w.i = e }

// closed reports whether the walk ended at the closing bracket with
// nothing but white space after it: for data that should be one object,
// a check of its outline, which a cut anywhere in it fails.
func (w *walker) closed() bool { return w.end > 0 && skipSpace(w.s, w.end) == len(w.s) }

func skipSpace(s string, i int) int {
	if i < len(s) && s[i] > ' ' {
		return i // the common case, without a loop, so that it inlines
	}
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	return i
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// stringEnd returns the index just past the JSON string starting at s[i]
// (a '"'), or -1 when it is not terminated. It looks at 8 bytes at a time
// for a quote or a backslash (a backslash and the byte it escapes are
// passed over), which keeps the strings the Detector only skips (ids,
// content) cheap.
func stringEnd(s string, i int) int {
	e, _ := scanString(s, i)
	return e
}

// scanString is stringEnd that also reports whether the string holds an
// escape.
func scanString(s string, i int) (end int, esc bool) {
	j := i + 1
	for {
		for j+8 <= len(s) {
			x := load64(s, j)
			if m := byteIs(x, '"') | byteIs(x, '\\'); m != 0 {
				j += bits.TrailingZeros64(m) / 8
				break
			}
			j += 8
		}
		for j < len(s) && s[j] != '"' && s[j] != '\\' {
			j++
		}
		if j >= len(s) {
			return -1, esc
		}
		if s[j] == '"' {
			return j + 1, esc
		}
		esc = true
		j += 2 // the backslash and the byte it escapes
	}
}

// load64 returns s[j:j+8] as a little-endian word.
func load64(s string, j int) uint64 {
	s = s[j : j+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// byteIs returns a word whose lowest set bit is the high bit of the first
// byte of x that equals c (bits for later bytes may be wrong), or 0 when
// none does.
func byteIs(x uint64, c byte) uint64 {
	x ^= lsb * uint64(c)
	return (x - lsb) &^ x & msb
}

// valueEnd returns the index just past the JSON value starting at s[i]
// (not whitespace), or len(s) when it runs off the end.
func valueEnd(s string, i int) int {
	switch s[i] {
	case '"':
		if e := stringEnd(s, i); e >= 0 {
			return e
		}
		return len(s)
	case '{', '[':
		return containerEnd(s, i)
	}
	for j := i; j < len(s); j++ {
		switch s[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j
		}
	}
	return len(s)
}

// structural marks the bytes that matter to containerEnd.
var structural = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}

// containerEnd returns the index just past the object or array starting
// at s[i], matching brackets of either kind outside strings (what is
// inside is not checked), or len(s) when it runs off the end. Strings are
// skipped with stringEnd, the bytes between them 8 at a time.
func containerEnd(s string, i int) int {
	depth := 0
	j := i
	for {
		for j+8 <= len(s) {
			x := load64(s, j)
			// '[' and ']' are '{' and '}' without the 0x20 bit.
			y := x | lsb*0x20
			if m := byteIs(x, '"') | byteIs(y, '{') | byteIs(y, '}'); m != 0 {
				j += bits.TrailingZeros64(m) / 8
				break
			}
			j += 8
		}
		for j < len(s) && !structural[s[j]] {
			j++
		}
		if j >= len(s) {
			return len(s)
		}
		switch s[j] {
		case '"':
			e := stringEnd(s, j)
			if e < 0 {
				return len(s)
			}
			j = e
			continue
		case '{', '[':
			depth++
		default: // '}', ']'
			depth--
			if depth == 0 {
				return j + 1
			}
		}
		j++
	}
}

// jsonString returns the text of a raw JSON string value; ok is false for
// any other kind of value. It is the Detector's lenient reading, a view of
// raw; ParseRequest's stringValue is the strict one, a copy.
func jsonString(raw string) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	s := raw[1 : len(raw)-1]
	if strings.IndexByte(s, '\\') >= 0 {
		s = unescape(raw)
	}
	return s, true
}

// unescape decodes a raw JSON string that holds an escape, as gjson does:
// the Detector's reading of strings since it was written, which
// FuzzDetectorDifferential holds it to.
func unescape(raw string) string { return gjson.Parse(raw).Str }

// jsonInt returns a raw JSON number as an int64 (0 for anything else).
func jsonInt(raw string) int64 {
	if n, ok := intLiteral(raw); ok {
		return n
	}
	return gjson.Parse(raw).Int() // 1e3, 2.0, out of range: gjson's rules
}

// intLiteral parses a raw JSON value that is an integer literal (no
// fraction, no exponent) fitting an int64; anything else is not ok. A
// value that is not there is told before ParseInt, whose error for it
// would be an allocation on every request that leaves "n" out.
func intLiteral(raw string) (int64, bool) {
	if raw == "" {
		return 0, false
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	return n, err == nil
}

// isNumber reports whether raw looks like a JSON number (its first byte);
// isNumberLiteral is the strict check.
func isNumber(raw string) bool {
	return raw != "" && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9')
}

// isSet reports whether a raw JSON value counts as given: present, not null
// and not the empty string (some OpenAI-compatible servers send
// "finish_reason":"" on chunks that did not finish anything).
func isSet(raw string) bool { return raw != "" && raw != "null" && raw != `""` }

// isObject reports whether raw is a JSON object.
func isObject(raw string) bool { return raw != "" && raw[0] == '{' }
