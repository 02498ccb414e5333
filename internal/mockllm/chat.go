package mockllm

// chat renders OpenAI Chat Completions: one chat.completion.chunk per token
// after a role chunk, a finish chunk, the usage chunk when the request set
// stream_options.include_usage, then data: [DONE].
type chat struct {
	*completion
	id           string
	fingerprint  string
	includeUsage bool
	head         []byte // `data: {"id":...,"choices":[`, shared by every chunk
	tail         []byte // what closes every chunk after its choices
}

// chatContentOpen and chatContentClose surround a token in a content chunk.
const (
	chatContentOpen  = `{"index":0,"delta":{"content":"`
	chatContentClose = `"},"logprobs":null,"finish_reason":null}`
)

func newChat(c *completion, includeUsage bool) *chat {
	d := &chat{completion: c, includeUsage: includeUsage}
	// OpenAI's ids have 29 characters after the prefix; 12 keep a content
	// chunk near 240 bytes with a short model name, which is what the
	// benchmarks are sized for, and are still unique enough (71 bits).
	d.id = c.r.id("chatcmpl-", 12, base62)
	d.fingerprint = c.r.id("fp_", 10, hexDigits)
	h := append([]byte(nil), `data: {"id":"`...)
	h = append(h, d.id...)
	h = append(h, `","object":"chat.completion.chunk","created":`...)
	h = appendInt(h, c.created)
	h = append(h, `,"model":`...)
	h = appendJSONString(h, c.model)
	h = append(h, `,"system_fingerprint":"`...)
	h = append(h, d.fingerprint...)
	h = append(h, `","choices":[`...)
	d.head = h
	if includeUsage {
		// OpenAI sends "usage":null on every chunk but the last once usage
		// was asked for.
		d.tail = []byte("],\"usage\":null}\n\n")
	} else {
		d.tail = []byte("]}\n\n")
	}
	c.overhead = len(d.head) + len(chatContentOpen) + len(chatContentClose) + len(d.tail)
	return d
}

func (d *chat) events() int {
	n := len(d.words) + 3 // role chunk, finish chunk, [DONE]
	if d.includeUsage {
		n++
	}
	return n
}

func (d *chat) finishReason() string {
	if d.cut {
		return "length"
	}
	return "stop"
}

func (d *chat) appendEvent(dst []byte, i int) []byte {
	k := len(d.words)
	switch {
	case i == 0:
		dst = append(dst, d.head...)
		dst = append(dst, `{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}`...)
		return append(dst, d.tail...)
	case i <= k:
		dst = append(dst, d.head...)
		dst = append(dst, chatContentOpen...)
		dst = d.appendToken(dst, i-1)
		dst = append(dst, chatContentClose...)
		return append(dst, d.tail...)
	case i == k+1:
		dst = append(dst, d.head...)
		dst = append(dst, `{"index":0,"delta":{},"logprobs":null,"finish_reason":"`...)
		dst = append(dst, d.finishReason()...)
		dst = append(dst, `"}`...)
		return append(dst, d.tail...)
	case i == k+2 && d.includeUsage:
		dst = append(dst, d.head...)
		dst = append(dst, "],"...)
		dst = d.appendUsage(dst)
		return append(dst, "}\n\n"...)
	default:
		return append(dst, "data: [DONE]\n\n"...)
	}
}

func (d *chat) appendUsage(dst []byte) []byte {
	dst = append(dst, `"usage":{"prompt_tokens":`...)
	dst = appendInt(dst, d.promptTokens)
	dst = append(dst, `,"completion_tokens":`...)
	dst = appendInt(dst, len(d.words))
	dst = append(dst, `,"total_tokens":`...)
	dst = appendInt(dst, d.promptTokens+len(d.words))
	return append(dst, `,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`...)
}

func (d *chat) appendError(dst []byte, _ int) []byte {
	dst = append(dst, `data: {"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}`+"\n\n"...)
	return append(dst, "data: [DONE]\n\n"...)
}

func (d *chat) appendBody(dst []byte) []byte {
	dst = append(dst, `{"id":"`...)
	dst = append(dst, d.id...)
	dst = append(dst, `","object":"chat.completion","created":`...)
	dst = appendInt(dst, d.created)
	dst = append(dst, `,"model":`...)
	dst = appendJSONString(dst, d.model)
	dst = append(dst, `,"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
	dst = d.appendText(dst)
	dst = append(dst, `","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"`...)
	dst = append(dst, d.finishReason()...)
	dst = append(dst, `"}],`...)
	dst = d.appendUsage(dst)
	dst = append(dst, `,"service_tier":"default","system_fingerprint":"`...)
	dst = append(dst, d.fingerprint...)
	return append(dst, `"}`...)
}
