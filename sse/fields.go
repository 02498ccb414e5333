package sse

import "github.com/tidwall/gjson"

// fields holds the top-level members of one event's JSON data that the
// Detector looks at. Collecting them in a single pass over the object keeps
// Observe linear in the event size: gjson.Get per path would rescan the
// event once per path. The Results point into the event's data; nothing is
// copied.
type fields struct {
	typ      string       // "type", when a string
	object   string       // "object", when a string
	errorSet bool         // "error" is present and not null
	choices  gjson.Result // chat: "choices"
	usage    gjson.Result // chat, Anthropic message_delta: "usage"
	seq      gjson.Result // Responses: "sequence_number"
	response gjson.Result // Responses lifecycle events: "response"
	message  gjson.Result // Anthropic message_start: "message"
	delta    gjson.Result // Anthropic message_delta: "delta"
}

// scan fills f from data when data is a JSON object; anything else leaves f
// empty. gjson does not validate, so malformed data yields partial fields,
// never a panic.
func (f *fields) scan(data string) {
	i := 0
	for i < len(data) && isSpace(data[i]) {
		i++
	}
	if i == len(data) || data[i] != '{' {
		return
	}
	gjson.Parse(data[i:]).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "type":
			if v.Type == gjson.String {
				f.typ = v.Str
			}
		case "object":
			if v.Type == gjson.String {
				f.object = v.Str
			}
		case "error":
			if v.Exists() && v.Type != gjson.Null {
				f.errorSet = true
			}
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
		return true
	})
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// isSet reports whether a JSON value counts as given: present, not null and
// not the empty string (some OpenAI-compatible servers send
// "finish_reason":"" on chunks that did not finish anything).
func isSet(v gjson.Result) bool {
	return v.Exists() && v.Type != gjson.Null && !(v.Type == gjson.String && v.Str == "")
}
