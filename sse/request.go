package sse

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// WantsUsage reports whether a request body (JSON) asks for
// stream_options.include_usage == true, in which case an OpenAI chat stream
// without a usage chunk is not clean. Malformed JSON gives false.
//
// A body that names no include_usage, not even with an escaped letter, is
// answered without parsing it: request bodies carry whole conversations,
// and most do not ask for usage.
func WantsUsage(body []byte) bool {
	if !bytes.Contains(body, []byte("include_usage")) && !bytes.Contains(body, []byte(`\u`)) {
		return false
	}
	return gjson.ValidBytes(body) && gjson.GetBytes(body, "stream_options.include_usage").Type == gjson.True
}
