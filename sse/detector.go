package sse

import "github.com/tidwall/gjson"

// Expect is what the request leads a Detector to require of an OpenAI chat
// stream (the Responses and Anthropic dialects ignore it). The zero value
// expects one choice and no usage chunk.
type Expect struct {
	// N is the number of choices, indexes 0..N-1, that must each appear and
	// finish (the request's "n"). Below 1 it means 1; above MaxChoices it
	// means MaxChoices.
	N int
	// Usage says the request asked for stream_options.include_usage, so
	// the stream must carry a usage chunk.
	Usage bool
}

// Detector follows one stream and decides whether it ended cleanly, by the
// rules of the dialect it detects from the events (docs/design.md, Clean end).
//
// Use NewDetector, or Reset for reuse; the zero value is not a supported
// starting state. A Detector is not safe for concurrent use. Observe runs on
// every relayed event, so it makes one pass over each event's data and does
// not allocate in the common case.
type Detector struct {
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
	// content: an event that carries model output (or that its dialect
	// does not know) was observed; before it, the stream is a preamble.
	content bool

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

	memo prefixMemo // the previous event's leading members (fields.scan)
}

// NewDetector returns a Detector for one stream whose request expects e
// (see Request.Expect).
func NewDetector(e Expect) *Detector {
	d := &Detector{}
	d.Reset(e)
	return d
}

// Reset makes d ready for a new stream whose request expects e.
func (d *Detector) Reset(e Expect) {
	*d = Detector{n: min(max(e.N, 1), MaxChoices), usage: e.Usage}
}

// Observe feeds d the next event of the stream. Once Terminal is true it
// ignores further events: nothing after the terminal event is part of the
// stream, so a caller that reads the body on to its end (to reuse the
// connection) may go on calling Observe without changing the verdict.
func (d *Detector) Observe(ev Event) {
	if d.terminal {
		return
	}
	d.observe(ev)
	d.terminal = d.ended()
}

// ended reports whether what has been observed ends the stream (Terminal).
// An error ends it, except in a Responses stream, whose error event is
// followed by the provider's response.failed: that is its last event.
func (d *Detector) ended() bool {
	return (d.errSeen && d.dialect != DialectOpenAIResponses) || d.done || d.completed || d.failed || d.incomplete || d.stopped ||
		(d.malformed && d.dialect != DialectUnknown)
}

func (d *Detector) observe(ev Event) {
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
	var f fields
	f.scan(ev.Data, &d.memo)
	if f.errorSet {
		d.errSeen = true
	}
	if !f.closed && ev.Data != "" {
		d.malformed = true
	}
	if d.dialect == DialectUnknown {
		d.dialect = detectDialect(ev.Type, &f)
	}
	if isNumber(f.seq) {
		// Tracked whatever the dialect, so that a sequence number seen before
		// the dialect was known still counts; only Responses judges it.
		n := jsonInt(f.seq)
		if d.haveSeq && n != d.lastSeq+1 {
			d.seqGap = true
		}
		d.haveSeq, d.lastSeq = true, n
	}
	if !d.content && !d.errSeen {
		d.content = d.carries(ev, &f)
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

// carries reports whether ev, which is no error, carries model output:
// every event but a dialect's preamble (Responses response.created,
// queued and in_progress; Anthropic message_start and ping; a chat chunk
// whose choices have neither a finish nor a delta member past its role).
// It runs only until the first event that does.
func (d *Detector) carries(ev Event, f *fields) bool {
	switch d.dialect {
	case DialectOpenAIResponses:
		switch t := pick(ev.Type, f.typ); t {
		case "response.created", "response.queued", "response.in_progress", "response.failed":
			return false
		}
		return true
	case DialectAnthropic:
		switch t := pick(ev.Type, f.typ); t {
		case "message_start", "ping":
			return false
		case "content_block_start":
			// A text or thinking block opens empty; a tool_use block
			// names its tool, which is output.
			b := gjson.Get(ev.Data, "content_block")
			t := b.Get("type").Str
			return (t != "text" && t != "thinking") || b.Get(t).Str != ""
		}
		return true
	}
	return chatOutput(ev.Data)
}

// pick is an event's type: its name, or its data's "type" for an unnamed one.
func pick(name, typ string) string {
	if name == "" || name == "message" {
		return typ
	}
	return name
}

// chatOutput reports whether a chat chunk carries output: a choice with a
// finish_reason, or with a delta member other than role that is set; a
// chunk without "choices" is no preamble the dialect knows.
func chatOutput(data string) bool {
	for o := walk(data, 0, '{', false); o.next(); {
		if o.name() != "choices" {
			o.value()
			continue
		}
		for a := walk(o.value(), 0, '[', false); a.next(); {
			for c := walk(a.value(), 0, '{', false); c.next(); {
				switch v := c.value(); c.name() {
				case "finish_reason", "text":
					if isSet(v) {
						return true
					}
				case "delta":
					for m := walk(v, 0, '{', false); m.next(); {
						if v := m.value(); m.name() != "role" && isSet(v) && v != "[]" {
							return true
						}
					}
				}
			}
		}
		return false
	}
	return true
}

func (d *Detector) observeChat(f *fields) {
	if f.choicesRead {
		for _, c := range f.choice[:f.nChoices] {
			d.markChoice(c.idx, c.fin)
		}
	} else {
		d.walkChoices(f.choices)
	}
	if isObject(f.usage) {
		// Usage comes once a stream, so it is read with gjson, whose rules
		// (the first of duplicate names, numbers in strings) Usage has
		// always reported by; so are Anthropic's stop_reason and usage.
		u := gjson.Parse(f.usage)
		d.usageSeen = true
		d.input = u.Get("prompt_tokens").Int()
		d.output = u.Get("completion_tokens").Int()
	}
}

// walkChoices marks the choices of a "choices" value that fields.scan did
// not read itself.
func (d *Detector) walkChoices(choices string) {
	for a := walk(choices, 0, '[', false); a.next(); {
		c := a.value()
		if !isObject(c) {
			continue
		}
		var idx int64 // an absent index means the only choice, 0
		fin := false
		for o := walk(c, 0, '{', false); o.next(); {
			switch v := o.value(); o.name() {
			case "index":
				idx = jsonInt(v)
			case "finish_reason":
				fin = isSet(v)
			}
		}
		d.markChoice(idx, fin)
	}
}

// markChoice records that choice idx appeared, and whether this chunk
// finished it. Finishing is sticky: a later chunk for the same choice with a
// null finish_reason (Azure sends content-filter annotations after the end)
// does not reopen it. An index outside 0..n-1 is a choice the request did
// not ask for, which makes the stream unclean.
func (d *Detector) markChoice(idx int64, fin bool) {
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

func (d *Detector) observeResponses(name string, f *fields) {
	// Name and data type are checked separately: should they disagree, a
	// failure signal must not be hidden by a completion signal.
	completed := is(name, f, "response.completed")
	failed := is(name, f, "response.failed")
	incomplete := is(name, f, "response.incomplete")
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

// is reports whether an event named name with fields f is of type t, by
// its name or by its data's "type".
func is(name string, f *fields, t string) bool { return name == t || f.typ == t }

func (d *Detector) observeAnthropic(name string, f *fields) {
	switch {
	case is(name, f, "message_stop"):
		d.stopped = true
	case is(name, f, "message_delta"):
		if isSet(gjson.Parse(f.delta).Get("stop_reason").Raw) {
			d.stopReason = true
		}
		// message_delta usage is cumulative; newer API versions repeat
		// input_tokens here too.
		if isObject(f.usage) {
			u := gjson.Parse(f.usage)
			d.usageSeen = true
			if v := u.Get("output_tokens"); v.Exists() {
				d.output = v.Int()
			}
			if v := u.Get("input_tokens"); v.Exists() {
				d.input = v.Int()
			}
		}
	case is(name, f, "message_start"):
		if u := gjson.Parse(f.message).Get("usage"); u.IsObject() {
			d.usageSeen = true
			d.input = u.Get("input_tokens").Int()
			d.output = u.Get("output_tokens").Int()
		}
	}
}

// Dialect returns the dialect detected so far, DialectUnknown until a
// recognisable event arrives.
func (d *Detector) Dialect() Dialect { return d.dialect }

// ErrSeen reports whether an error has been observed: an event named
// error, or data whose top-level "error" is not null or whose "type" is
// "error". Clean then answers ReasonErrorEvent.
func (d *Detector) ErrSeen() bool { return d.errSeen }

// Content reports whether an event that carries model output has been
// observed: text, reasoning, a tool call, a refusal, a finish, or an
// event the dialect does not know. The events before it (a preamble, or
// an error) gave no part of an answer.
func (d *Detector) Content() bool { return d.content }

// LastSequence returns the sequence_number of the last event observed
// that carried one (OpenAI Responses); ok is false when none did. A
// resumed Responses stream continues after it (starting_after).
func (d *Detector) LastSequence() (seq int64, ok bool) { return d.lastSeq, d.haveSeq }

// Terminal reports whether the event that ends the stream has been
// observed: data: [DONE] in a chat stream, response.completed,
// response.failed or response.incomplete, message_stop, or an error (an
// event named error, or data whose top-level "error" is not null or whose
// "type" is "error") outside a Responses stream (there the provider sends
// response.failed after its error event, and that ends the stream). It
// turns true right after Observe of that event and stays true until Reset,
// so the proxy relays and records that event and none after it.
//
// It says nothing about cleanliness: use Clean at the end of the body. A
// chat stream without [DONE] has no terminal event: its choices finishing
// does not make Terminal true, because the usage chunk may still follow;
// its end is the end of the body (Clean's intact).
func (d *Detector) Terminal() bool { return d.terminal }

// The reasons Clean gives for a stream that did not end cleanly, each a
// short snake_case word for logs, metrics and the stream_aborted code.
//
// Two of them say the stream's end was not the provider's: no_terminal_event
// (the body ended, or may have been cut, before the dialect's last event)
// and malformed_event (bytes that are not the stream its dialect sends).
// Every other reason is given only for a stream whose end the provider
// stated: its failure (an error, response.failed), or its terminal event
// ([DONE], response.completed, message_stop) after something that cannot be
// proven whole, or, for a stream of no dialect the Detector knows, the end
// of a body whose framing was intact.
const (
	ReasonErrorEvent          = "error_event"           // the provider sent an error event
	ReasonMalformedEvent      = "malformed_event"       // an event's data is not a whole JSON object
	ReasonUnknownDialect      = "unknown_dialect"       // no event told which API the stream is
	ReasonNoTerminalEvent     = "no_terminal_event"     // the body ended before the dialect's last event
	ReasonUnexpectedChoice    = "unexpected_choice"     // a choice index outside 0..N-1
	ReasonNoChoices           = "no_choices"            // a chat stream without a single choice
	ReasonMissingChoice       = "missing_choice"        // an index in 0..N-1 that never appeared
	ReasonMissingFinishReason = "missing_finish_reason" // a choice that never finished
	ReasonMissingUsage        = "missing_usage"         // include_usage was asked and no usage came
	ReasonResponseFailed      = "response_failed"       // a Responses stream that ended in response.failed
	ReasonSequenceGap         = "sequence_gap"          // a Responses sequence_number skipped
	ReasonMissingStopReason   = "missing_stop_reason"   // an Anthropic stream whose message_delta gave no stop_reason
)

// Reasons lists every reason Clean can give.
var Reasons = []string{
	ReasonErrorEvent, ReasonMalformedEvent, ReasonUnknownDialect, ReasonNoTerminalEvent,
	ReasonUnexpectedChoice, ReasonNoChoices, ReasonMissingChoice, ReasonMissingFinishReason,
	ReasonMissingUsage, ReasonResponseFailed, ReasonSequenceGap,
	ReasonMissingStopReason,
}

// Clean reports, at the end of the body, whether the stream ended cleanly.
// Call it only after the read loop ended without a read error; a read error
// is an abort whatever Clean says.
//
// intact says the body ended with its HTTP framing whole: the chunked
// terminator arrived, or Content-Length bytes were read. (A body delimited
// by closing the connection cannot say it was whole, so it is not intact.)
// It matters for an OpenAI chat stream without data: [DONE], which is
// clean when intact and otherwise complete (every choice 0..N-1 finished,
// the usage chunk arrived when asked for); several OpenAI-compatible
// servers end their streams so. Without [DONE], a chat stream that is cut
// or not complete has no stated end: no_terminal_event. It matters too for
// a stream of no known dialect: intact, its end is the upstream's
// (unknown_dialect); cut, it is not (no_terminal_event). The other
// dialects need their terminal events whatever intact says.
//
// A Responses stream that ends in response.incomplete with its events
// whole is clean: like chat's finish_reason "length", it is the model's
// answer to a bound the request set (max_output_tokens).
//
// When the stream is not clean, reason is one of Reasons.
func (d *Detector) Clean(intact bool) (ok bool, reason string) {
	if d.errSeen {
		return false, ReasonErrorEvent
	}
	if d.malformed && d.dialect != DialectUnknown {
		return false, ReasonMalformedEvent
	}
	switch d.dialect {
	case DialectOpenAIChat:
		switch {
		case !d.done && !(intact && d.complete()):
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
		case !d.completed && !d.incomplete:
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
	if !intact {
		return false, ReasonNoTerminalEvent
	}
	return false, ReasonUnknownDialect
}

// complete reports whether a chat stream has every choice 0..n-1, each
// finished, and the usage chunk when it was asked for.
func (d *Detector) complete() bool {
	return d.seen == d.want() && d.finished == d.seen && (!d.usage || d.usageSeen)
}

// want returns the choice bits 0..n-1.
func (d *Detector) want() (w [MaxChoices / 64]uint64) {
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
func (d *Detector) Usage() (input, output int64, ok bool) {
	return d.input, d.output, d.usageSeen
}
