package mockllm

// messages renders Anthropic Messages: message_start, content_block_start,
// one ping, a content_block_delta per token, content_block_stop,
// message_delta with the stop reason and usage, then message_stop.
type messages struct {
	*completion
	id string
}

// The lines around a token in a content_block_delta event.
const (
	messagesDeltaOpen  = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\""
	messagesDeltaClose = "\"}}\n\n"
)

func newMessages(c *completion) *messages {
	d := &messages{completion: c, id: c.r.id("msg_01", 22, base62)}
	c.overhead = len(messagesDeltaOpen) + len(messagesDeltaClose)
	return d
}

func (d *messages) events() int { return len(d.words) + 6 }

func (d *messages) stopReason() string {
	if d.cut {
		return "max_tokens"
	}
	return "end_turn"
}

func (d *messages) appendEvent(dst []byte, i int) []byte {
	k := len(d.words)
	switch {
	case i == 0:
		dst = append(dst, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":"...)
		dst = appendJSONString(dst, d.model)
		dst = append(dst, `,"id":"`...)
		dst = append(dst, d.id...)
		dst = append(dst, `","type":"message","role":"assistant","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":`...)
		dst = appendInt(dst, d.promptTokens)
		return append(dst, `,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1,"service_tier":"standard"}}}`+"\n\n"...)
	case i == 1:
		return append(dst, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"...)
	case i == 2:
		return append(dst, "event: ping\ndata: {\"type\": \"ping\"}\n\n"...)
	case i < k+3:
		dst = append(dst, messagesDeltaOpen...)
		dst = d.appendToken(dst, i-3)
		return append(dst, messagesDeltaClose...)
	case i == k+3:
		return append(dst, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"...)
	case i == k+4:
		dst = append(dst, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\""...)
		dst = append(dst, d.stopReason()...)
		dst = append(dst, `","stop_sequence":null},"usage":{"input_tokens":`...)
		dst = appendInt(dst, d.promptTokens)
		dst = append(dst, `,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":`...)
		dst = appendInt(dst, k)
		return append(dst, "}}\n\n"...)
	default:
		return append(dst, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
	}
}

func (d *messages) appendError(dst []byte, _ int) []byte {
	dst = append(dst, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"...)
	return append(dst, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
}

func (d *messages) appendBody(dst []byte) []byte {
	dst = append(dst, `{"model":`...)
	dst = appendJSONString(dst, d.model)
	dst = append(dst, `,"id":"`...)
	dst = append(dst, d.id...)
	dst = append(dst, `","type":"message","role":"assistant","content":[{"type":"text","text":"`...)
	dst = d.appendText(dst)
	dst = append(dst, `"}],"stop_reason":"`...)
	dst = append(dst, d.stopReason()...)
	dst = append(dst, `","stop_sequence":null,"usage":{"input_tokens":`...)
	dst = appendInt(dst, d.promptTokens)
	dst = append(dst, `,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":`...)
	dst = appendInt(dst, len(d.words))
	return append(dst, `,"service_tier":"standard"}}`...)
}
