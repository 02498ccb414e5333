package proxy

import (
	"math/big"
	"strings"
)

// JSON-RPC ids are JSON values, and a server may write back the id of a
// request in another spelling than the caller's: 1 as 1.0 or 1e0 (a
// server that holds ids as floats), "A" as "\u0041" (one that escapes
// what it need not). The response is the request's all the same, so ids
// are compared as values: numbers by value (exactly, big integers
// included, never through a float64), strings after unescaping, and a
// number never equals a string. Whatever a server wrote, each caller is
// then answered under its own id as it spelled it (toolCaller.message).

// sameRPCID reports whether the JSON-RPC ids a and b, each one JSON
// value as written, are the same id. Anything but a number or a string
// (null, true, an object) is the same id only when written the same.
func sameRPCID(a, b string) bool {
	a, b = strings.TrimSpace(a), strings.TrimSpace(b)
	if a == b {
		return a != ""
	}
	if a == "" || b == "" {
		return false
	}
	switch {
	case a[0] == '"' && b[0] == '"':
		sa, ok := unquoteID(a)
		if !ok {
			return false
		}
		sb, ok := unquoteID(b)
		return ok && sa == sb
	case numberStart(a[0]) && numberStart(b[0]):
		na, ok := parseIDNumber(a)
		if !ok {
			return false
		}
		nb, ok := parseIDNumber(b)
		return ok && na.equal(nb)
	}
	return false
}

func numberStart(c byte) bool { return c == '-' || c >= '0' && c <= '9' }

// idNumber is a JSON number by value: (-1)^neg × 0.digits × 10^exp, with
// digits free of leading and trailing zeros (none at all for zero, which
// is never negative).
type idNumber struct {
	neg    bool
	digits string
	exp    *big.Int // nil for zero
}

func (n idNumber) equal(m idNumber) bool {
	if n.neg != m.neg || n.digits != m.digits {
		return false
	}
	if n.exp == nil || m.exp == nil {
		return n.exp == nil && m.exp == nil
	}
	return n.exp.Cmp(m.exp) == 0
}

// parseIDNumber reads s, which must be exactly one JSON number
// (RFC 8259 §6), by value; its exponent may have any number of digits.
func parseIDNumber(s string) (idNumber, bool) {
	var n idNumber
	i := 0
	if i < len(s) && s[i] == '-' {
		n.neg = true
		i++
	}
	intStart := i
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	default:
		return n, false
	}
	intPart := s[intStart:i]
	frac := ""
	if i < len(s) && s[i] == '.' {
		i++
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == start {
			return n, false
		}
		frac = s[start:i]
	}
	exp := new(big.Int)
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		start := i
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		digitsStart := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == digitsStart {
			return n, false
		}
		if _, ok := exp.SetString(s[start:i], 10); !ok {
			return n, false
		}
	}
	if i != len(s) {
		return n, false
	}
	// The value is intPart.frac × 10^exp = 0.(intPart frac) × 10^(exp+len(intPart)).
	all := intPart + frac
	lead := 0
	for lead < len(all) && all[lead] == '0' {
		lead++
	}
	digits := strings.TrimRight(all[lead:], "0")
	if digits == "" {
		return idNumber{}, true // zero, -0 included
	}
	n.digits = digits
	n.exp = exp.Add(exp, big.NewInt(int64(len(intPart)-lead)))
	return n, true
}

// unquoteID reads s, which must be exactly one JSON string, to the
// sequence of code points it stands for. Unlike encoding/json, it keeps
// a lone surrogate escape as itself (in WTF-8) rather than turning it,
// and every other, into U+FFFD: "\ud800" and "\udbff" are two ids.
// Bytes that are not UTF-8 are kept as they are.
func unquoteID(s string) (string, bool) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", false
	}
	s = s[1 : len(s)-1]
	if strings.IndexByte(s, '\\') < 0 {
		for i := 0; i < len(s); i++ {
			if s[i] < 0x20 || s[i] == '"' {
				return "", false
			}
		}
		return s, true
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c < 0x20 || c == '"':
			return "", false
		case c != '\\':
			b = append(b, c)
			i++
			continue
		}
		if i+1 >= len(s) {
			return "", false
		}
		switch e := s[i+1]; e {
		case '"', '\\', '/':
			b = append(b, e)
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r, ok := hex4(s, i+2)
			if !ok {
				return "", false
			}
			i += 6
			if r >= 0xd800 && r < 0xdc00 && i+1 < len(s) && s[i] == '\\' && s[i+1] == 'u' {
				if lo, ok := hex4(s, i+2); ok && lo >= 0xdc00 && lo < 0xe000 {
					r = 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00)
					i += 6
				}
			}
			b = appendCodePoint(b, r)
			continue
		default:
			return "", false
		}
		i += 2
	}
	return string(b), true
}

// hex4 reads the four hex digits at s[i:].
func hex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r rune
	for _, c := range []byte(s[i : i+4]) {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// appendCodePoint appends r in UTF-8, a surrogate as well (WTF-8), which
// utf8.AppendRune would turn into U+FFFD.
func appendCodePoint(b []byte, r rune) []byte {
	switch {
	case r < 0x80:
		return append(b, byte(r))
	case r < 0x800:
		return append(b, 0xc0|byte(r>>6), 0x80|byte(r)&0x3f)
	case r < 0x10000:
		return append(b, 0xe0|byte(r>>12), 0x80|byte(r>>6)&0x3f, 0x80|byte(r)&0x3f)
	}
	return append(b, 0xf0|byte(r>>18), 0x80|byte(r>>12)&0x3f, 0x80|byte(r>>6)&0x3f, 0x80|byte(r)&0x3f)
}
