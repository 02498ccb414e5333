package sse

import (
	"math/bits"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// This file holds a minimal JSON walker for Observe's hot path. gjson's
// ForEach fully parses every member (numbers go through ParseFloat), which
// made Observe cost ~1.2 µs per 200-byte chat chunk, about the proxy's whole
// relay cost per event. The walker only finds where values start and end;
// the few values the Detector needs are decoded afterwards. It never reads
// out of bounds and never panics on malformed input: it stops early instead.

// members calls fn with the key and raw value text of each member of the
// JSON object that s holds, in order, stopping at the first malformed spot.
// It reports whether the object was closed, with nothing but white space
// after it: a check of the object's outline (its members' values are only
// skipped), which a cut anywhere in it fails.
func members(s string, fn func(key, val string)) (closed bool) {
	i := skipSpace(s, 0)
	if i >= len(s) || s[i] != '{' {
		return false
	}
	i++
	for {
		i = skipSpace(s, i)
		if i >= len(s) || s[i] != '"' {
			return i < len(s) && s[i] == '}' && skipSpace(s, i+1) == len(s)
		}
		ke, esc := scanString(s, i)
		if ke < 0 {
			return false
		}
		key := s[i+1 : ke-1]
		if esc {
			key = gjson.Parse(s[i:ke]).Str // rare: an escaped key
		}
		i = skipSpace(s, ke)
		if i >= len(s) || s[i] != ':' {
			return false
		}
		i = skipSpace(s, i+1)
		if i >= len(s) {
			return false
		}
		ve := valueEnd(s, i)
		fn(key, s[i:ve])
		i = skipSpace(s, ve)
		if i >= len(s) || s[i] != ',' {
			return i < len(s) && s[i] == '}' && skipSpace(s, i+1) == len(s)
		}
		i++
	}
}

// elements calls fn with the raw text of each element of the JSON array
// that s holds, stopping at the first malformed spot.
func elements(s string, fn func(val string)) {
	i := skipSpace(s, 0)
	if i >= len(s) || s[i] != '[' {
		return
	}
	i++
	for {
		i = skipSpace(s, i)
		if i >= len(s) || s[i] == ']' {
			return
		}
		ve := valueEnd(s, i)
		fn(s[i:ve])
		i = skipSpace(s, ve)
		if i >= len(s) || s[i] != ',' {
			return
		}
		i++
	}
}

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
// any other kind of value.
func jsonString(raw string) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	s := raw[1 : len(raw)-1]
	if strings.IndexByte(s, '\\') >= 0 {
		s = gjson.Parse(raw).Str
	}
	return s, true
}

// jsonInt returns a raw JSON number as an int64 (0 for anything else).
func jsonInt(raw string) int64 {
	if n, err := strconv.ParseInt(raw, 10, 64); err == nil {
		return n
	}
	return gjson.Parse(raw).Int() // 1e3, 2.0, out of range: gjson's rules
}

// isNumber reports whether raw looks like a JSON number.
func isNumber(raw string) bool {
	return raw != "" && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9')
}

// isSet reports whether a raw JSON value counts as given: present, not null
// and not the empty string (some OpenAI-compatible servers send
// "finish_reason":"" on chunks that did not finish anything).
func isSet(raw string) bool { return raw != "" && raw != "null" && raw != `""` }

// isObject reports whether raw is a JSON object.
func isObject(raw string) bool { return raw != "" && raw[0] == '{' }
