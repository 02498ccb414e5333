package sse

// This file keeps refDetector, the Detector as it was before its walker
// learnt to skip the values it does not need: FuzzDetectorDifferential
// checks that both give the same verdict on every input.
//
// Only the logic that rewrite replaced is copied here, in its old form:
// the scan of an event's top-level members (refScan, which shares only
// fields.member's switch), observe, which calls it, observeChat's walk of
// the choices, and the JSON walker under them (refMembers, refElements,
// refSkipSpace, refStringEnd, refValueEnd).
// refElements reads as elements still does, but it is kept because it
// calls the old refValueEnd. Everything else the rewrite left as it was,
// so refDetector uses the package's: it embeds a Detector for its state,
// Clean, markChoice and the Responses and Anthropic rules (the prefix
// memo stays unused), and fills the package's fields for detectDialect,
// with the package's value helpers (jsonString, jsonInt, isSet, ...).

import (
	"strings"

	"github.com/tidwall/gjson"
)

// refDetector is a Detector that observes each event as the Detector did
// before the rewrite.
type refDetector struct{ Detector }

// refNewDetector returns a refDetector for one stream whose request expects
// e (see Request.Expect).
func refNewDetector(e Expect) *refDetector {
	d := &refDetector{}
	d.Reset(e)
	return d
}

// Observe is Detector.Observe with refDetector's observe.
func (d *refDetector) Observe(ev Event) {
	if d.terminal {
		return
	}
	d.observe(ev)
	d.terminal = d.ended()
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
	var f fields
	refScan(&f, ev.Data)
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

func (d *refDetector) observeChat(f *fields) {
	refElements(f.choices, func(c string) {
		if !isObject(c) {
			return
		}
		var idx int64 // an absent index means the only choice, 0
		fin := false
		refMembers(c, func(k, v string) {
			switch k {
			case "index":
				idx = jsonInt(v)
			case "finish_reason":
				fin = isSet(v)
			}
		})
		d.markChoice(idx, fin)
	})
	if isObject(f.usage) {
		u := gjson.Parse(f.usage)
		d.usageSeen = true
		d.input = u.Get("prompt_tokens").Int()
		d.output = u.Get("completion_tokens").Int()
	}
}

// refScan fills f from data when data is a JSON object; anything else
// leaves f empty, and malformed data yields the members before the fault.
// It is the old scan: every member through refMembers, "choices" kept for
// observeChat to walk, the others recorded by fields.member, which holds
// the old scan's switch unchanged.
func refScan(f *fields, data string) {
	f.closed = refMembers(data, func(k, v string) {
		if k == "choices" {
			f.choices = v
			return
		}
		f.member(k, v)
	})
}

// The old JSON walker. It only finds where values start and end, never
// reads out of bounds and never panics on malformed input: it stops early
// instead.

// refMembers calls fn with the key and raw value text of each member of the
// JSON object that s holds, in order, stopping at the first malformed spot.
// It reports whether the object was closed, with nothing but white space
// after it: a check of the object's outline (its members' values are only
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
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	return i
}

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
