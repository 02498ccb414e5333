package sse

import "strings"

// fields holds the top-level members of one event's JSON data that the
// Detector looks at, as raw JSON text pointing into the event's data (nothing
// is copied). Collecting them in one pass keeps Observe linear in the event
// size, where a lookup per path would rescan the event once per path.
type fields struct {
	typ      string // "type", when a string
	object   string // "object", when a string
	errorSet bool   // an "error" member is not null, or a "type" is "error" (any duplicate counts)
	choices  string // chat: "choices", when choicesRead is false
	usage    string // chat, Anthropic message_delta: "usage"
	seq      string // Responses: "sequence_number"
	response string // Responses lifecycle events: "response"
	message  string // Anthropic message_start: "message"
	delta    string // Anthropic message_delta: "delta"
	closed   bool   // data is one JSON object, closed (walker.closed): not cut
	// The choices of "choices", read while it was scanned (scanChoices):
	// each one's index and whether its finish_reason is set. When
	// choicesRead is false the Detector walks f.choices itself.
	choicesRead bool
	nChoices    int
	// delta0 is where the first choice's delta value starts when
	// openAIChoice read that choice (choice[0]), else 0.
	delta0 int
	choice [maxReadChoices]struct {
		idx int64
		fin bool
	}
}

// maxReadChoices is how many choices scanChoices keeps; a chunk with more
// is walked again by the Detector.
const maxReadChoices = 4

// scan fills f from data when data is a JSON object; anything else leaves f
// empty, and malformed data yields the members before the fault. It walks
// the members leniently (walker), picks the Detector's keys out inline, and
// reads "choices" in the same pass (scanChoices).
//
// m remembers where the previous event's leading members ended (see
// prefixMemo): when this event starts with the same bytes, the walk
// resumes there with the state m kept instead of walking them again.
func (f *fields) scan(s string, m *prefixMemo) {
	w := walker{s: s, closer: '}'}
	record := false      // whether the leading members are to be remembered
	deepAt := -1         // where a "choices" key may extend m's prefix (prefixMemo.deep)
	typAt, objAt := 0, 0 // where the text of "type" and "object" starts, while recording
	switch {
	case m.deep > 0 && len(s) >= m.deep && s[:m.deep] == string(m.buf[:m.deep]):
		if e, ok := m.resumeDeep(f, s); ok {
			w.i, w.after = e, true // past the "choices" value
			break
		}
		w.i = m.resume(f, s) // the first choice is not as in the previous event
	case m.n > 0 && len(s) >= m.n && s[:m.n] == string(m.buf[:m.n]):
		w.i = m.resume(f, s)
		deepAt = m.n
	default:
		w = walk(s, 0, '{', false)
		record = true
	}
	for w.next() {
		key := w.name()
		if key == "choices" {
			if record {
				m.remember(f, s, w.ks, typAt, objAt)
				record, deepAt = false, w.ks
			}
			w.at(f.scanChoices(s, w.i))
			if w.ks == deepAt && !w.esc {
				m.rememberDeep(f, s)
			}
			continue
		}
		vs := w.i
		v := w.value()
		if record {
			if w.esc || !m.plain(key, v) {
				// The leading members end here: remember them, as they
				// were before this one, for the next event, which is
				// likely to repeat them.
				m.remember(f, s, w.ks, typAt, objAt)
				record = false
			} else if key == "type" {
				typAt = vs + 1
			} else if key == "object" {
				objAt = vs + 1
			}
		}
		f.member(key, v)
	}
	f.closed = w.closed()
}

// prefixMemo remembers the leading members of the previous event's data:
// its bytes up to the first member that is not plain, and what scan had
// gathered from them. Chat chunks repeat their id, object, created, model
// and system_fingerprint in every chunk of a stream, a good half of a
// content chunk, and Anthropic and Responses events start with the same
// "type" event after event; comparing those bytes with the previous
// event's costs far less than walking them.
//
// A plain member is one whose only effect on fields is through "type" and
// "object" as unescaped strings (or as no string at all): scan's state at
// the start of the next member is then the start state, plus typ, object
// and errorSet, whatever the bytes before were, so any data that begins
// with the same bytes reaches the same state there.
//
// When that first other member is "choices" and its first choice has
// OpenAI's layout (openAIChoice), the prefix goes on to the start of that
// choice's delta value (deep): up to there, the same bytes give the same
// choices array start and the same index, and the scan resumes in
// openAIChoiceRest. Should the rest not match (ok false), the scan
// resumes at the "choices" key instead (n), which always agrees.
type prefixMemo struct {
	n           int // bytes of buf in use: the prefix ends before a member's key; 0: none
	typ, object span
	errorSet    bool
	deep        int   // 0, or n and then the bytes up to the first choice's delta value
	idx         int64 // the first choice's index, when deep is set
	buf         [maxMemo]byte
}

// maxMemo bounds the prefix a prefixMemo keeps.
const maxMemo = 256

// span is where a string lies in the prefix.
type span struct{ off, len uint16 }

func (sp span) in(s string) string { return s[sp.off : sp.off+sp.len] }

// plain reports whether member k: v may be part of the remembered prefix.
// A member with an escaped key never is (the caller checks).
func (m *prefixMemo) plain(k, v string) bool {
	switch k {
	case "type", "object":
		return v == "" || v[0] != '"' || strings.IndexByte(v, '\\') < 0
	case "choices", "error", "usage", "sequence_number", "response", "message", "delta":
		return false
	}
	return true
}

// remember keeps s[:end], and f's state there, for the next event; the
// text of f.typ and f.object, unescaped, starts at s[typAt] and s[objAt].
func (m *prefixMemo) remember(f *fields, s string, end, typAt, objAt int) {
	m.n, m.deep = 0, 0
	if end > maxMemo {
		return
	}
	m.typ = span{uint16(typAt), uint16(len(f.typ))}
	m.object = span{uint16(objAt), uint16(len(f.object))}
	m.errorSet = f.errorSet
	m.n = copy(m.buf[:], s[:end])
}

// rememberDeep extends the prefix of m, which s starts with and which ends
// at a "choices" key, to the first choice's delta value, when scanChoices
// read that choice with openAIChoice.
func (m *prefixMemo) rememberDeep(f *fields, s string) {
	m.deep = 0
	if m.n == 0 || f.delta0 == 0 || f.delta0 > maxMemo {
		return
	}
	copy(m.buf[m.n:], s[m.n:f.delta0])
	m.deep, m.idx = f.delta0, f.choice[0].idx
}

// resumeDeep sets f to the state scan has after the choices array of s,
// which starts with m's deep prefix, and returns the index past the array;
// ok is false when the array does not go on as openAIChoiceRest and
// readElements read it, and then f is to be scanned from m.n (where
// scanChoices starts the choices afresh).
func (m *prefixMemo) resumeDeep(f *fields, s string) (end int, ok bool) {
	fin, e, ok := openAIChoiceRest(s, m.deep)
	if !ok {
		return 0, false
	}
	f.addChoice(m.idx, fin)
	end = e + 1 // OpenAI sends one choice a chunk: most often the array ends here
	if e >= len(s) || s[e] != ']' {
		w := walker{s: s, i: e, strict: true, after: true, closer: ']'} // the walk of the array, past its first element
		if end, ok = f.readElements(&w); !ok {
			return 0, false
		}
	}
	f.choicesRead = true
	m.restore(f, s)
	return end, true
}

// resume sets f to the state scan had at the end of the remembered prefix,
// which s starts with, and returns that index.
func (m *prefixMemo) resume(f *fields, s string) int {
	m.restore(f, s)
	return m.n
}

// restore sets what the prefix gave f.
func (m *prefixMemo) restore(f *fields, s string) {
	f.errorSet = m.errorSet
	// Strings are stored only when they change f: a pointer stored through
	// f costs a write barrier while the GC runs, which under load is often,
	// and most prefixes have no "type" or no "object".
	if m.typ.len > 0 || f.typ != "" {
		f.typ = m.typ.in(s)
	}
	if m.object.len > 0 || f.object != "" {
		f.object = m.object.in(s)
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
// bracket matching stops at the same ']', and walkChoices' lenient walk
// sees the same elements and members.
func (f *fields) scanChoices(s string, i int) int {
	f.choicesRead, f.nChoices, f.delta0 = false, 0, 0
	if e, ok := f.readChoices(s, i); ok {
		f.choicesRead = true
		return e
	}
	e := valueEnd(s, i)
	f.choices = s[i:e]
	return e
}

// readChoices is scanChoices' strict walk; ok is false where it gives up.
func (f *fields) readChoices(s string, i int) (end int, ok bool) {
	w := walk(s, i, '[', true)
	return f.readElements(&w)
}

// readElements reads the elements of the array that w walks.
func (f *fields) readElements(w *walker) (end int, ok bool) {
	for w.next() {
		e, ok := f.readElement(w.s, w.i)
		if !ok {
			return 0, false
		}
		w.at(e)
	}
	return w.end, w.end > 0
}

// readElement reads the element of "choices" at s[i], a choice (with
// openAIChoice when it can, else readChoice) or a value that is skipped.
func (f *fields) readElement(s string, i int) (end int, ok bool) {
	if i >= len(s) {
		return 0, false
	}
	if s[i] != '{' {
		return plainValueEnd(s, i)
	}
	if f.nChoices == maxReadChoices {
		return 0, false
	}
	if idx, at, ok := openAIChoice(s, i); ok {
		if fin, e, ok := openAIChoiceRest(s, at); ok {
			if f.nChoices == 0 {
				f.delta0 = at
			}
			f.addChoice(idx, fin)
			return e, true
		}
	}
	return f.readChoice(s, i)
}

// readChoice reads the choice object starting at s[i] into the next slot
// of f.choice, and returns the index just past it. It gives up (ok false)
// on an escaped key and on a value plainValueEnd does not take.
func (f *fields) readChoice(s string, i int) (end int, ok bool) {
	var idx int64 // an absent index means the only choice, 0
	fin := false
	w := walk(s, i, '{', true)
	for w.next() {
		if w.esc {
			return 0, false
		}
		vs := w.i
		ve, ok := plainValueEnd(s, vs)
		if !ok {
			return 0, false
		}
		switch w.text {
		case "index":
			idx = jsonInt(s[vs:ve])
		case "finish_reason":
			fin = isSet(s[vs:ve])
		}
		w.at(ve)
	}
	if w.end == 0 {
		return 0, false
	}
	f.addChoice(idx, fin)
	return w.end, true
}

// openAIChoice reads the start of the choice object at s[i], up to its
// delta value (at s[delta]), when it is laid out exactly as OpenAI sends
// it, without white space; openAIChoiceRest reads the rest:
//
//	{"index":0,"delta":{...},"logprobs":null,"finish_reason":null}
//
// with a delta of {"content":"..."} or any other container, and a
// finish_reason of null or a string. Matching those bytes as they are
// costs much less than reading each key and skipping each value, and it
// reads what readChoice would: the same index and finish_reason, the same
// end. Any other layout (ok false from either) is left to readChoice.
//
// The literals are compared inline (s[i:i+n] == "..." of at most 16
// bytes compiles to a few loads; through a helper it would call memequal).
func openAIChoice(s string, i int) (idx int64, delta int, ok bool) {
	if len(s)-i < len(`{"index":`) || s[i:i+len(`{"index":`)] != `{"index":` {
		return 0, 0, false
	}
	i += len(`{"index":`)
	idx, i, ok = digits(s, i)
	if !ok || len(s)-i < len(`,"delta":`) || s[i:i+len(`,"delta":`)] != `,"delta":` {
		return 0, 0, false
	}
	return idx, i + len(`,"delta":`), true
}

// openAIChoiceRest is openAIChoice from the delta's value at s[i] on.
func openAIChoiceRest(s string, i int) (fin bool, end int, ok bool) {
	switch {
	case len(s)-i >= len(`{"content":"`) && s[i:i+len(`{"content":"`)] == `{"content":"`:
		// As containerEnd would: the key, then the string value, then the
		// closing brace.
		i, ok = stringBraceEnd(s, i+len(`{"content":`))
		if !ok {
			return false, 0, false
		}
	case i < len(s) && (s[i] == '{' || s[i] == '['):
		if i, ok = plainValueEnd(s, i); !ok {
			return false, 0, false
		}
	default:
		return false, 0, false
	}
	return openAIChoiceTail(s, i)
}

// stringBraceEnd returns the index just past the string starting at s[i]
// (a '"') and the '}' right after it, which ends a delta
// {"content":"..."} or a choice's "finish_reason":"...".
func stringBraceEnd(s string, i int) (end int, ok bool) {
	e, _ := scanString(s, i)
	if e < 0 || e >= len(s) || s[e] != '}' {
		return 0, false
	}
	return e + 1, true
}

// openAIChoiceTail is openAIChoice after the delta, at s[i].
func openAIChoiceTail(s string, i int) (fin bool, end int, ok bool) {
	if len(s)-i < len(`,"logprobs":null,"finish_reason":`) ||
		s[i:i+len(`,"logprobs":null`)] != `,"logprobs":null` ||
		s[i+len(`,"logprobs":null`):i+len(`,"logprobs":null,"fi`)] != `,"fi` ||
		s[i+len(`,"logprobs":null,"fi`):i+len(`,"logprobs":null,"finish_reason":`)] != `nish_reason":` {
		return false, 0, false
	}
	i += len(`,"logprobs":null,"finish_reason":`)
	switch {
	case len(s)-i >= len(`null}`) && s[i:i+len(`null}`)] == `null}`:
		return false, i + len(`null}`), true
	case i < len(s) && s[i] == '"':
		e, ok := stringBraceEnd(s, i)
		return ok && isSet(s[i:e-1]), e, ok
	}
	return false, 0, false
}

// digits reads the plain decimal number (at most 18 digits, so that it
// cannot overflow) at s[i]; ok is false when there is none.
func digits(s string, i int) (n int64, end int, ok bool) {
	j := i
	for ; j < len(s) && j-i < 18 && s[j] >= '0' && s[j] <= '9'; j++ {
		n = n*10 + int64(s[j]-'0')
	}
	return n, j, j > i && j-i < 18
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
