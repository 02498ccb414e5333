package sse

import "github.com/tidwall/gjson"

// WantsUsage reports whether a request body (JSON) asks for
// stream_options.include_usage == true, in which case an OpenAI chat stream
// without a usage chunk is not clean. Malformed JSON gives false.
func WantsUsage(body []byte) bool {
	return gjson.ValidBytes(body) && gjson.GetBytes(body, "stream_options.include_usage").Type == gjson.True
}

// WantsStream reports whether a request body (JSON) has "stream": true, that
// is whether the answer will be an event stream. Malformed JSON gives false.
func WantsStream(body []byte) bool {
	return gjson.ValidBytes(body) && gjson.GetBytes(body, "stream").Type == gjson.True
}
