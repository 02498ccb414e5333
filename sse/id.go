package sse

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// ID names one event of one generation: Gen identifies the generation
// (unique per key, increasing), Seq counts events from 1. Putting the
// generation into every id means an id from an aborted generation can never
// be mistaken for a position in a newer one.
type ID struct{ Gen, Seq uint64 }

// ErrInvalidID is wrapped by the error ParseID returns for text that is not
// an id; the proxy answers it with 400 invalid_last_event_id.
var ErrInvalidID = errors.New("sse: invalid event id")

// maxQuotedID bounds how much of a rejected id goes into an error message,
// since the text comes from a client header.
const maxQuotedID = 64

// IsZero reports whether id is the zero ID, which AppendEvent treats as
// "no id".
func (id ID) IsZero() bool { return id.Gen == 0 && id.Seq == 0 }

// String returns "<gen>-<seq>" in decimal, e.g. "1764403200123-42".
func (id ID) String() string { return string(id.Append(make([]byte, 0, 41))) }

// Append appends the String form of id to dst without allocating when dst
// has room (at most 41 bytes).
func (id ID) Append(dst []byte) []byte {
	dst = strconv.AppendUint(dst, id.Gen, 10)
	dst = append(dst, '-')
	return strconv.AppendUint(dst, id.Seq, 10)
}

// ParseID parses the String form strictly: ASCII digits, '-', ASCII digits,
// with no sign, no spaces, no leading zeros except in "0", and no overflow.
// Strictness makes the text form canonical, so one id has one spelling and
// ids can be compared as the clients echo them back. Anything else returns an
// error wrapping ErrInvalidID.
func ParseID(s string) (ID, error) {
	for i := 0; i < len(s); i++ {
		if s[i] != '-' {
			continue
		}
		gen, ok1 := parseUint(s[:i])
		seq, ok2 := parseUint(s[i+1:])
		if !ok1 || !ok2 {
			break
		}
		return ID{Gen: gen, Seq: seq}, nil
	}
	q := s
	if len(q) > maxQuotedID {
		q = q[:maxQuotedID] + "..."
	}
	return ID{}, fmt.Errorf("%w: %q", ErrInvalidID, q)
}

// parseUint parses canonical decimal: non-empty, digits only, no leading
// zero unless the whole text is "0", and at most math.MaxUint64.
func parseUint(s string) (uint64, bool) {
	if s == "" || (s[0] == '0' && len(s) > 1) {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}
