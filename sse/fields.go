package sse

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
}

// scan fills f from data when data is a JSON object; anything else leaves f
// empty, and malformed data yields the members before the fault.
func (f *fields) scan(data string) {
	f.closed = members(data, func(k, v string) {
		switch k {
		case "type":
			f.typ, _ = jsonString(v)
			f.errorSet = f.errorSet || f.typ == "error"
		case "object":
			f.object, _ = jsonString(v)
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
