package mockllm

import "strconv"

// responses renders OpenAI Responses: response.created,
// response.in_progress, output_item.added, content_part.added, an
// output_text.delta per token, output_text.done, content_part.done,
// output_item.done, then response.completed (response.incomplete when the
// request's max_output_tokens cut the answer, as the real API does). Every
// event carries its sequence_number, counted from 0; there is no [DONE].
type responses struct {
	*completion
	id, itemID string
	maxTokens  int    // the request's max_output_tokens; 0: none
	background bool   // the request's "background"
	deltaClose []byte // what follows a token in a delta, up to the sequence number
}

const responsesDeltaOpen = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"content_index\":0,\"delta\":\""

func newResponses(c *completion, maxTokens int) *responses {
	d := &responses{
		completion: c,
		id:         c.r.id("resp_", 50, hexDigits),
		itemID:     c.r.id("msg_", 50, hexDigits),
		maxTokens:  maxTokens,
	}
	b := append([]byte(nil), `","item_id":"`...)
	b = append(b, d.itemID...)
	b = append(b, `","logprobs":[],"output_index":0,"sequence_number":`...)
	d.deltaClose = b
	// Three digits of sequence number and the closing "}\n\n".
	c.overhead = len(responsesDeltaOpen) + len(d.deltaClose) + 3 + 3
	return d
}

func (d *responses) events() int { return len(d.words) + 8 }

// finalStatus is the status of the finished response and of its item.
func (d *responses) finalStatus() string {
	if d.cut {
		return "incomplete"
	}
	return "completed"
}

// appendEventHead appends the event and data lines up to the JSON's type.
func appendEventHead(dst []byte, name string) []byte {
	dst = append(dst, "event: "...)
	dst = append(dst, name...)
	dst = append(dst, "\ndata: {\"type\":\""...)
	dst = append(dst, name...)
	return append(dst, '"')
}

// appendEventEnd closes an event's JSON with its sequence number.
func appendEventEnd(dst []byte, seq int) []byte {
	dst = append(dst, `,"sequence_number":`...)
	dst = appendInt(dst, seq)
	return append(dst, "}\n\n"...)
}

func (d *responses) appendEvent(dst []byte, i int) []byte {
	k := len(d.words)
	switch {
	case i == 0 || i == 1:
		name := "response.created"
		if i == 1 {
			name = "response.in_progress"
		}
		dst = appendEventHead(dst, name)
		dst = append(dst, `,"response":`...)
		dst = d.appendResponse(dst, false)
	case i == 2:
		dst = appendEventHead(dst, "response.output_item.added")
		dst = append(dst, `,"item":`...)
		dst = d.appendItem(dst, false)
		dst = append(dst, `,"output_index":0`...)
	case i == 3:
		dst = appendEventHead(dst, "response.content_part.added")
		dst = append(dst, `,"content_index":0,"item_id":"`...)
		dst = append(dst, d.itemID...)
		dst = append(dst, `","output_index":0,"part":{"type":"output_text","annotations":[],"logprobs":[],"text":""}`...)
	case i < k+4:
		dst = append(dst, responsesDeltaOpen...)
		dst = d.appendToken(dst, i-4)
		dst = append(dst, d.deltaClose...)
		dst = appendInt(dst, i)
		return append(dst, "}\n\n"...)
	case i == k+4:
		dst = appendEventHead(dst, "response.output_text.done")
		dst = append(dst, `,"content_index":0,"item_id":"`...)
		dst = append(dst, d.itemID...)
		dst = append(dst, `","logprobs":[],"output_index":0,"text":"`...)
		dst = d.appendText(dst)
		dst = append(dst, '"')
	case i == k+5:
		dst = appendEventHead(dst, "response.content_part.done")
		dst = append(dst, `,"content_index":0,"item_id":"`...)
		dst = append(dst, d.itemID...)
		dst = append(dst, `","output_index":0,"part":`...)
		dst = d.appendPart(dst)
	case i == k+6:
		dst = appendEventHead(dst, "response.output_item.done")
		dst = append(dst, `,"item":`...)
		dst = d.appendItem(dst, true)
		dst = append(dst, `,"output_index":0`...)
	default:
		dst = appendEventHead(dst, "response."+d.finalStatus())
		dst = append(dst, `,"response":`...)
		dst = d.appendResponse(dst, true)
	}
	return appendEventEnd(dst, i)
}

func (d *responses) appendPart(dst []byte) []byte {
	dst = append(dst, `{"type":"output_text","annotations":[],"logprobs":[],"text":"`...)
	dst = d.appendText(dst)
	return append(dst, `"}`...)
}

// appendItem appends the output message item, empty until done.
func (d *responses) appendItem(dst []byte, done bool) []byte {
	dst = append(dst, `{"id":"`...)
	dst = append(dst, d.itemID...)
	dst = append(dst, `","type":"message","status":"`...)
	if !done {
		dst = append(dst, `in_progress","content":[]`...)
	} else {
		dst = append(dst, d.finalStatus()...)
		dst = append(dst, `","content":[`...)
		dst = d.appendPart(dst)
		dst = append(dst, ']')
	}
	return append(dst, `,"role":"assistant"}`...)
}

// appendResponse appends the response object, in progress or finished.
func (d *responses) appendResponse(dst []byte, done bool) []byte {
	dst = append(dst, `{"id":"`...)
	dst = append(dst, d.id...)
	dst = append(dst, `","object":"response","created_at":`...)
	dst = appendInt(dst, d.created)
	dst = append(dst, `,"status":"`...)
	if done {
		dst = append(dst, d.finalStatus()...)
		dst = append(dst, `","background":`...)
		dst = strconv.AppendBool(dst, d.background)
		dst = append(dst, `,"completed_at":`...)
		dst = appendInt(dst, d.created)
	} else {
		dst = append(dst, `in_progress","background":`...)
		dst = strconv.AppendBool(dst, d.background)
		dst = append(dst, `,"completed_at":null`...)
	}
	dst = append(dst, `,"error":null,"incomplete_details":`...)
	if done && d.cut {
		dst = append(dst, `{"reason":"max_output_tokens"}`...)
	} else {
		dst = append(dst, `null`...)
	}
	dst = append(dst, `,"instructions":null,"max_output_tokens":`...)
	if d.maxTokens > 0 {
		dst = appendInt(dst, d.maxTokens)
	} else {
		dst = append(dst, `null`...)
	}
	dst = append(dst, `,"model":`...)
	dst = appendJSONString(dst, d.model)
	dst = append(dst, `,"output":[`...)
	if done {
		dst = d.appendItem(dst, true)
	}
	dst = append(dst, `],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"service_tier":"default","store":true,"temperature":1.0,"text":{"format":{"type":"text"},"verbosity":"medium"},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":`...)
	if done {
		k := len(d.words)
		dst = append(dst, `{"input_tokens":`...)
		dst = appendInt(dst, d.promptTokens)
		dst = append(dst, `,"input_tokens_details":{"cached_tokens":0},"output_tokens":`...)
		dst = appendInt(dst, k)
		dst = append(dst, `,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":`...)
		dst = appendInt(dst, d.promptTokens+k)
		dst = append(dst, '}')
	} else {
		dst = append(dst, `null`...)
	}
	return append(dst, `,"user":null,"metadata":{}}`...)
}

func (d *responses) appendError(dst []byte, sent int) []byte {
	dst = appendEventHead(dst, "error")
	dst = append(dst, `,"code":"server_error","message":"The server had an error while processing your request. Sorry about that!","param":null`...)
	return appendEventEnd(dst, sent)
}

func (d *responses) appendBody(dst []byte) []byte {
	return d.appendResponse(dst, true)
}
