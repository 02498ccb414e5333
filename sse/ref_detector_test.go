package sse

// This file keeps the Detector as it was before its walker learnt to skip
// the values it does not need (refDetector): FuzzDetectorDifferential
// checks that both give the same verdict on every input.

import (
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// refDetector follows one stream and decides whether it ended cleanly, by the
// rules of the dialect it detects from the events (docs/design.md, Clean end).
//
// Use refNewDetector, or Reset for reuse; the zero value is not a supported
// starting state. A refDetector is not safe for concurrent use. Observe runs on
// every relayed event, so it makes one pass over each event's data and does
// not allocate in the common case.
type refDetector struct {
	dialect Dialect
	n       int  // Expect.N, within 1..MaxChoices
	usage   bool // Expect.Usage
	errSeen bool // an error event or error object
	// malformed: an event whose data is not a whole JSON object (cut
	// inside it, say). It counts once the dialect is known, since every
	// dialect's events are JSON; in a stream of no known dialect (not an
	// LLM's) it means nothing.
	malformed bool
	terminal  bool // the terminal event was observed; later events are ignored

	// OpenAI chat/completions.
	done           bool                    // data: [DONE]
	seen, finished [MaxChoices / 64]uint64 // bit i: choice index i appeared / had a finish_reason
	unexpected     bool                    // a choice index outside 0..n-1

	// OpenAI Responses.
	completed, failed, incomplete bool
	haveSeq, seqGap               bool
	lastSeq                       int64

	// Anthropic.
	stopped, stopReason bool // message_stop seen; a non-null stop_reason seen

	usageSeen     bool
	input, output int64
}

// refNewDetector returns a refDetector for one stream whose request expects e
// (see Request.Expect).
func refNewDetector(e Expect) *refDetector {
	d := &refDetector{}
	d.Reset(e)
	return d
}

// Reset makes d ready for a new stream whose request expects e.
func (d *refDetector) Reset(e Expect) {
	*d = refDetector{n: min(max(e.N, 1), MaxChoices), usage: e.Usage}
}

// Observe feeds d the next event of the stream. Once Terminal is true it
// ignores further events: nothing after the terminal event is part of the
// stream, so a caller that reads the body on to its end (to reuse the
// connection) may go on calling Observe without changing the verdict.
func (d *refDetector) Observe(ev Event) {
	if d.terminal {
		return
	}
	d.observe(ev)
	d.terminal = d.errSeen || d.done || d.completed || d.failed || d.incomplete || d.stopped ||
		(d.malformed && d.dialect != DialectUnknown)
}

func (d *refDetector) observe(ev Event) {
	if ev.Type == "error" {
		d.errSeen = true
	}
	if ev.Data == "[DONE]" {
		// Only chat/completions ends this way. A Responses or Anthropic
		// upstream (or a gateway in front of one) that adds it anyway is
		// tolerated: their own terminal events decide.
		if d.dialect == DialectUnknown {
			d.dialect = DialectOpenAIChat
		}
		if d.dialect == DialectOpenAIChat {
			d.done = true
		}
		return
	}
	var f refFields
	f.scan(ev.Data)
	if f.errorSet {
		d.errSeen = true
	}
	if !f.closed && ev.Data != "" {
		d.malformed = true
	}
	if d.dialect == DialectUnknown {
		d.dialect = refDetectDialect(ev.Type, &f)
	}
	if refIsNumber(f.seq) {
		// Tracked whatever the dialect, so that a sequence number seen before
		// the dialect was known still counts; only Responses judges it.
		n := refJsonInt(f.seq)
		if d.haveSeq && n != d.lastSeq+1 {
			d.seqGap = true
		}
		d.haveSeq, d.lastSeq = true, n
	}
	switch d.dialect {
	case DialectUnknown, DialectOpenAIChat:
		// Also while unknown: some OpenAI-compatible servers omit "object",
		// and then only [DONE] names the dialect, after the choices went by.
		d.observeChat(&f)
	case DialectOpenAIResponses:
		d.observeResponses(ev.Type, &f)
	case DialectAnthropic:
		d.observeAnthropic(ev.Type, &f)
	}
}

func (d *refDetector) observeChat(f *refFields) {
	refElements(f.choices, func(c string) {
		if !refIsObject(c) {
			return
		}
		var idx int64 // an absent index means the only choice, 0
		fin := false
		refMembers(c, func(k, v string) {
			switch k {
			case "index":
				idx = refJsonInt(v)
			case "finish_reason":
				fin = refIsSet(v)
			}
		})
		d.markChoice(idx, fin)
	})
	if refIsObject(f.usage) {
		u := gjson.Parse(f.usage)
		d.usageSeen = true
		d.input = u.Get("prompt_tokens").Int()
		d.output = u.Get("completion_tokens").Int()
	}
}

// markChoice records that choice idx appeared, and whether this chunk
// finished it. Finishing is sticky: a later chunk for the same choice with a
// null finish_reason (Azure sends content-filter annotations after the end)
// does not reopen it. An index outside 0..n-1 is a choice the request did
// not ask for, which makes the stream unclean.
func (d *refDetector) markChoice(idx int64, fin bool) {
	if idx < 0 || idx >= int64(d.n) {
		d.unexpected = true
		return
	}
	w, bit := idx/64, uint64(1)<<(idx%64)
	d.seen[w] |= bit
	if fin {
		d.finished[w] |= bit
	}
}

func (d *refDetector) observeResponses(name string, f *refFields) {
	// Name and data type are checked separately: should they disagree, a
	// failure signal must not be hidden by a completion signal.
	is := func(s string) bool { return name == s || f.typ == s }
	completed, failed, incomplete := is("response.completed"), is("response.failed"), is("response.incomplete")
	if !completed && !failed && !incomplete {
		return
	}
	d.completed = d.completed || completed
	d.failed = d.failed || failed
	d.incomplete = d.incomplete || incomplete
	if u := gjson.Parse(f.response).Get("usage"); u.IsObject() {
		d.usageSeen = true
		d.input = u.Get("input_tokens").Int()
		d.output = u.Get("output_tokens").Int()
	}
}

func (d *refDetector) observeAnthropic(name string, f *refFields) {
	is := func(s string) bool { return name == s || f.typ == s }
	switch {
	case is("message_stop"):
		d.stopped = true
	case is("message_delta"):
		if refIsSet(gjson.Parse(f.delta).Get("stop_reason").Raw) {
			d.stopReason = true
		}
		// message_delta usage is cumulative; newer API versions repeat
		// input_tokens here too.
		if refIsObject(f.usage) {
			u := gjson.Parse(f.usage)
			d.usageSeen = true
			if v := u.Get("output_tokens"); v.Exists() {
				d.output = v.Int()
			}
			if v := u.Get("input_tokens"); v.Exists() {
				d.input = v.Int()
			}
		}
	case is("message_start"):
		if u := gjson.Parse(f.message).Get("usage"); u.IsObject() {
			d.usageSeen = true
			d.input = u.Get("input_tokens").Int()
			d.output = u.Get("output_tokens").Int()
		}
	}
}

// Dialect returns the dialect detected so far, DialectUnknown until a
// recognisable event arrives.
func (d *refDetector) Dialect() Dialect { return d.dialect }

// LastSequence returns the sequence_number of the last event observed
// that carried one (OpenAI Responses); ok is false when none did. A
// resumed Responses stream continues after it (starting_after).
func (d *refDetector) LastSequence() (seq int64, ok bool) { return d.lastSeq, d.haveSeq }

// Terminal reports whether the event that ends the stream has been
// observed: data: [DONE] in a chat stream, response.completed,
// response.failed or response.incomplete, message_stop, or an error (an
// event named error, or data whose top-level "error" is not null or whose
// "type" is "error"). It turns true right after Observe of that event and
// stays true until Reset, so the proxy relays and records that event and
// none after it.
//
// It says nothing about cleanliness: use Clean at the end of the body. A
// chat stream without [DONE] has no terminal event: its choices finishing
// does not make Terminal true, because the usage chunk may still follow;
// its end is the end of the body (Clean's intact).
func (d *refDetector) Terminal() bool { return d.terminal }

// Clean reports, at the end of the body, whether the stream ended cleanly.
// Call it only after the read loop ended without a read error; a read error
// is an abort whatever Clean says.
//
// intact says the body ended with its HTTP framing whole: the chunked
// terminator arrived, or Content-Length bytes were read. (A body delimited
// by closing the connection cannot say it was whole, so it is not intact.)
// It matters only for an OpenAI chat stream without data: [DONE], which is
// clean when intact and otherwise complete (every choice 0..N-1 finished,
// the usage chunk arrived when asked for); several OpenAI-compatible
// servers end their streams so. The other dialects need their terminal
// events whatever intact says.
//
// When the stream is not clean, reason is one of Reasons.
func (d *refDetector) Clean(intact bool) (ok bool, reason string) {
	if d.errSeen {
		return false, ReasonErrorEvent
	}
	if d.malformed && d.dialect != DialectUnknown {
		return false, ReasonMalformedEvent
	}
	switch d.dialect {
	case DialectOpenAIChat:
		switch {
		case !d.done && !intact:
			return false, ReasonNoTerminalEvent
		case d.unexpected:
			return false, ReasonUnexpectedChoice
		case d.seen == [len(d.seen)]uint64{}:
			return false, ReasonNoChoices
		case d.seen != d.want():
			return false, ReasonMissingChoice
		case d.finished != d.seen:
			return false, ReasonMissingFinishReason
		case d.usage && !d.usageSeen:
			return false, ReasonMissingUsage
		}
		return true, ""
	case DialectOpenAIResponses:
		switch {
		case d.failed:
			return false, ReasonResponseFailed
		case d.incomplete:
			return false, ReasonResponseIncomplete
		case !d.completed:
			return false, ReasonNoTerminalEvent
		case d.seqGap:
			return false, ReasonSequenceGap
		}
		return true, ""
	case DialectAnthropic:
		switch {
		case !d.stopped:
			return false, ReasonNoTerminalEvent
		case !d.stopReason:
			return false, ReasonMissingStopReason
		}
		return true, ""
	}
	return false, ReasonUnknownDialect
}

// want returns the choice bits 0..n-1.
func (d *refDetector) want() (w [MaxChoices / 64]uint64) {
	for i := range w {
		switch k := d.n - 64*i; {
		case k >= 64:
			w[i] = ^uint64(0)
		case k > 0:
			w[i] = uint64(1)<<k - 1
		}
	}
	return w
}

// Usage returns the token counts the upstream reported: chat usage
// prompt_tokens/completion_tokens, Responses usage input_tokens/output_tokens,
// Anthropic message_start input_tokens and message_delta output_tokens. ok is
// false when no usage was seen.
func (d *refDetector) Usage() (input, output int64, ok bool) {
	return d.input, d.output, d.usageSeen
}

// refFields holds the top-level refMembers of one event's JSON data that the
// refDetector looks at, as raw JSON text pointing into the event's data (nothing
// is copied). Collecting them in one pass keeps Observe linear in the event
// size, where a lookup per path would rescan the event once per path.
type refFields struct {
	typ      string // "type", when a string
	object   string // "object", when a string
	errorSet bool   // an "error" member is not null, or a "type" is "error" (any duplicate counts)
	choices  string // chat: "choices"
	usage    string // chat, Anthropic message_delta: "usage"
	seq      string // Responses: "sequence_number"
	response string // Responses lifecycle events: "response"
	message  string // Anthropic message_start: "message"
	delta    string // Anthropic message_delta: "delta"
	closed   bool   // data is one JSON object, closed (refMembers): not cut
}

// scan fills f from data when data is a JSON object; anything else leaves f
// empty, and malformed data yields the refMembers before the fault.
func (f *refFields) scan(data string) {
	f.closed = refMembers(data, func(k, v string) {
		switch k {
		case "type":
			f.typ, _ = refJsonString(v)
			f.errorSet = f.errorSet || f.typ == "error"
		case "object":
			f.object, _ = refJsonString(v)
		case "error":
			f.errorSet = f.errorSet || v != "null"
		case "choices":
			f.choices = v
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
	})
}

// This file holds a minimal JSON walker for Observe's hot path. gjson's
// ForEach fully parses every member (numbers go through ParseFloat), which
// made Observe cost ~1.2 µs per 200-byte chat chunk, about the proxy's whole
// relay cost per event. The walker only finds where values start and end;
// the few values the refDetector needs are decoded afterwards. It never reads
// out of bounds and never panics on malformed input: it stops early instead.

// refMembers calls fn with the key and raw value text of each member of the
// JSON object that s holds, in order, stopping at the first malformed spot.
// It reports whether the object was closed, with nothing but white space
// after it: a check of the object's outline (its refMembers' values are only
// skipped), which a cut anywhere in it fails.
func refMembers(s string, fn func(key, val string)) (closed bool) {
	i := refSkipSpace(s, 0)
	if i >= len(s) || s[i] != '{' {
		return false
	}
	i++
	for {
		i = refSkipSpace(s, i)
		if i >= len(s) || s[i] != '"' {
			return i < len(s) && s[i] == '}' && refSkipSpace(s, i+1) == len(s)
		}
		ke := refStringEnd(s, i)
		if ke < 0 {
			return false
		}
		key := s[i+1 : ke-1]
		if strings.IndexByte(key, '\\') >= 0 {
			key = gjson.Parse(s[i:ke]).Str // rare: an escaped key
		}
		i = refSkipSpace(s, ke)
		if i >= len(s) || s[i] != ':' {
			return false
		}
		i = refSkipSpace(s, i+1)
		if i >= len(s) {
			return false
		}
		ve := refValueEnd(s, i)
		fn(key, s[i:ve])
		i = refSkipSpace(s, ve)
		if i >= len(s) || s[i] != ',' {
			return i < len(s) && s[i] == '}' && refSkipSpace(s, i+1) == len(s)
		}
		i++
	}
}

// refElements calls fn with the raw text of each element of the JSON array
// that s holds, stopping at the first malformed spot.
func refElements(s string, fn func(val string)) {
	i := refSkipSpace(s, 0)
	if i >= len(s) || s[i] != '[' {
		return
	}
	i++
	for {
		i = refSkipSpace(s, i)
		if i >= len(s) || s[i] == ']' {
			return
		}
		ve := refValueEnd(s, i)
		fn(s[i:ve])
		i = refSkipSpace(s, ve)
		if i >= len(s) || s[i] != ',' {
			return
		}
		i++
	}
}

func refSkipSpace(s string, i int) int {
	for i < len(s) && refIsSpace(s[i]) {
		i++
	}
	return i
}

func refIsSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// refStringEnd returns the index just past the JSON string starting at s[i]
// (a '"'), or -1 when it is not terminated.
func refStringEnd(s string, i int) int {
	j := i + 1
	for {
		k := strings.IndexByte(s[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		// The quote is escaped when an odd number of backslashes precede it.
		n := 0
		for p := j - 1; p > i && s[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return j + 1
		}
		j++
	}
}

// refValueEnd returns the index just past the JSON value starting at s[i]
// (not whitespace), or len(s) when it runs off the end.
func refValueEnd(s string, i int) int {
	switch s[i] {
	case '"':
		if e := refStringEnd(s, i); e >= 0 {
			return e
		}
		return len(s)
	case '{', '[':
		depth := 0
		for j := i; j < len(s); j++ {
			switch s[j] {
			case '"':
				e := refStringEnd(s, j)
				if e < 0 {
					return len(s)
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(s)
	}
	for j := i; j < len(s); j++ {
		switch s[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j
		}
	}
	return len(s)
}

// refJsonString returns the text of a raw JSON string value; ok is false for
// any other kind of value.
func refJsonString(raw string) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	s := raw[1 : len(raw)-1]
	if strings.IndexByte(s, '\\') >= 0 {
		s = gjson.Parse(raw).Str
	}
	return s, true
}

// refJsonInt returns a raw JSON number as an int64 (0 for anything else).
func refJsonInt(raw string) int64 {
	if n, err := strconv.ParseInt(raw, 10, 64); err == nil {
		return n
	}
	return gjson.Parse(raw).Int() // 1e3, 2.0, out of range: gjson's rules
}

// refIsNumber reports whether raw looks like a JSON number.
func refIsNumber(raw string) bool {
	return raw != "" && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9')
}

// refIsSet reports whether a raw JSON value counts as given: present, not null
// and not the empty string (some OpenAI-compatible servers send
// "finish_reason":"" on chunks that did not finish anything).
func refIsSet(raw string) bool { return raw != "" && raw != "null" && raw != `""` }

// refIsObject reports whether raw is a JSON object.
func refIsObject(raw string) bool { return raw != "" && raw[0] == '{' }

// refDetectDialect names the dialect one event belongs to, from its event name
// and the top-level refFields of its data, or DialectUnknown. The [DONE]
// sentinel is handled by the caller.
func refDetectDialect(name string, f *refFields) Dialect {
	for _, s := range [2]string{name, f.typ} {
		switch {
		case strings.HasPrefix(s, "message_"), strings.HasPrefix(s, "content_block_"):
			return DialectAnthropic
		case strings.HasPrefix(s, "response."):
			return DialectOpenAIResponses
		}
	}
	if f.object == "chat.completion.chunk" || f.object == "text_completion" {
		return DialectOpenAIChat
	}
	return DialectUnknown
}
