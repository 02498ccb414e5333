package sse

import "github.com/tidwall/gjson"

// fields holds the top-level members of one event's JSON data that the
// Detector looks at, as raw JSON text pointing into the event's data (nothing
// is copied). Collecting them in one pass keeps Observe linear in the event
// size, where a lookup per path would rescan the event once per path.
type fields struct {
	typ      string // "type", when a string
	object   string // "object", when a string
	errorSet bool   // an "error" member is not null, or a "type" is "error" (any duplicate counts)
	choices  string // chat: "choices"
	usage    string // chat, Anthropic message_delta: "usage"
	seq      string // Responses: "sequence_number"
	response string // Responses lifecycle events: "response"
	message  string // Anthropic message_start: "message"
	delta    string // Anthropic message_delta: "delta"
	closed   bool   // data is one JSON object, closed (members): not cut
	// The choices of "choices", read while it was scanned (scanChoices):
	// each one's index and whether its finish_reason is set. When
	// choicesRead is false the Detector walks f.choices itself.
	choicesRead bool
	nChoices    int
	choice      [maxReadChoices]struct {
		idx int64
		fin bool
	}
}

// maxReadChoices is how many choices scanChoices keeps; a chunk with more
// is walked again by the Detector.
const maxReadChoices = 4

// scan fills f from data when data is a JSON object; anything else leaves f
// empty, and malformed data yields the members before the fault. It is
// members with the Detector's keys picked out inline, and "choices" read
// in the same pass (scanChoices).
func (f *fields) scan(s string) {
	f.closed = false
	i := skipSpace(s, 0)
	if i >= len(s) || s[i] != '{' {
		return
	}
	i++
	for {
		i = skipSpace(s, i)
		if i >= len(s) || s[i] != '"' {
			f.closed = i < len(s) && s[i] == '}' && skipSpace(s, i+1) == len(s)
			return
		}
		ke, esc := scanString(s, i)
		if ke < 0 {
			return
		}
		key := s[i+1 : ke-1]
		if esc {
			key = gjson.Parse(s[i:ke]).Str // rare: an escaped key
		}
		i = skipSpace(s, ke)
		if i >= len(s) || s[i] != ':' {
			return
		}
		i = skipSpace(s, i+1)
		if i >= len(s) {
			return
		}
		var ve int
		if key == "choices" {
			ve = f.scanChoices(s, i)
		} else {
			ve = valueEnd(s, i)
			f.member(key, s[i:ve])
		}
		i = skipSpace(s, ve)
		if i >= len(s) || s[i] != ',' {
			f.closed = i < len(s) && s[i] == '}' && skipSpace(s, i+1) == len(s)
			return
		}
		i++
	}
}

// member records one top-level member other than "choices".
func (f *fields) member(k, v string) {
	switch k {
	case "type":
		f.typ, _ = jsonString(v)
		f.errorSet = f.errorSet || f.typ == "error"
	case "object":
		f.object, _ = jsonString(v)
	case "error":
		f.errorSet = f.errorSet || v != "null"
	case "usage":
		f.usage = v
	case "sequence_number":
		f.seq = v
	case "response":
		f.response = v
	case "message":
		f.message = v
	case "delta":
		f.delta = v
	}
}

// scanChoices records the "choices" value starting at s[i] and returns
// the index just past it, as valueEnd does. When the value is an array of
// well-formed elements (objects with unescaped keys, strings, containers,
// scalars without quotes or brackets), at most maxReadChoices of them, it
// also reads each object's index and finish_reason as observeChat would,
// so that the choices are not walked again; on anything else it leaves
// that to observeChat. Both ends agree: on such an array valueEnd's
// bracket matching stops at the same ']', and elements and members see
// the same elements and members.
func (f *fields) scanChoices(s string, i int) int {
	f.choicesRead, f.nChoices = false, 0
	if e, ok := f.readChoices(s, i); ok {
		f.choices = s[i:e]
		f.choicesRead = true
		return e
	}
	e := valueEnd(s, i)
	f.choices = s[i:e]
	f.nChoices = 0
	return e
}

// readChoices is scanChoices' strict walk; ok is false where it gives up.
func (f *fields) readChoices(s string, i int) (end int, ok bool) {
	if s[i] != '[' {
		return 0, false
	}
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == ']' {
		return i + 1, true
	}
	for {
		if i >= len(s) {
			return 0, false
		}
		var e int
		if s[i] == '{' {
			if f.nChoices == maxReadChoices {
				return 0, false
			}
			if e, ok = f.readChoice(s, i); !ok {
				return 0, false
			}
		} else if e, ok = plainValueEnd(s, i); !ok {
			return 0, false
		}
		i = skipSpace(s, e)
		if i >= len(s) {
			return 0, false
		}
		switch s[i] {
		case ']':
			return i + 1, true
		case ',':
			i = skipSpace(s, i+1)
		default:
			return 0, false
		}
	}
}

// readChoice reads the choice object starting at s[i] into the next slot
// of f.choice, and returns the index just past it.
func (f *fields) readChoice(s string, i int) (end int, ok bool) {
	var idx int64 // an absent index means the only choice, 0
	fin := false
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		f.addChoice(idx, fin)
		return i + 1, true
	}
	for {
		if i >= len(s) || s[i] != '"' {
			return 0, false
		}
		ke, esc := scanString(s, i)
		if ke < 0 || esc {
			return 0, false
		}
		key := s[i+1 : ke-1]
		i = skipSpace(s, ke)
		if i >= len(s) || s[i] != ':' {
			return 0, false
		}
		i = skipSpace(s, i+1)
		if i >= len(s) {
			return 0, false
		}
		ve, ok := plainValueEnd(s, i)
		if !ok {
			return 0, false
		}
		switch key {
		case "index":
			idx = jsonInt(s[i:ve])
		case "finish_reason":
			fin = isSet(s[i:ve])
		}
		i = skipSpace(s, ve)
		if i >= len(s) {
			return 0, false
		}
		switch s[i] {
		case '}':
			f.addChoice(idx, fin)
			return i + 1, true
		case ',':
			i = skipSpace(s, i+1)
		default:
			return 0, false
		}
	}
}

func (f *fields) addChoice(idx int64, fin bool) {
	f.choice[f.nChoices].idx, f.choice[f.nChoices].fin = idx, fin
	f.nChoices++
}

// plainValueEnd is valueEnd for a value that valueEnd and containerEnd
// agree on: a whole string or container, or a scalar without a quote or
// bracket in it.
func plainValueEnd(s string, i int) (end int, ok bool) {
	switch s[i] {
	case '"':
		e := stringEnd(s, i)
		return e, e >= 0
	case '{', '[':
		e := containerEnd(s, i)
		c := s[e-1]
		return e, (c == '}' || c == ']') && e-1 > i
	case '}', ']':
		return 0, false
	}
	e := valueEnd(s, i)
	for j := i; j < e; j++ {
		if structural[s[j]] {
			return 0, false
		}
	}
	return e, e > i
}
