package mockllm

import (
	"github.com/valyala/fasthttp"
)

// provider selects whose error shape an answer uses.
type provider int

const (
	openAI provider = iota
	anthropic
)

// errorType returns the error type (and for OpenAI the code) that the
// provider sends with status.
func errorType(p provider, status int) (typ, code string) {
	if p == anthropic {
		switch status {
		case 400:
			return "invalid_request_error", ""
		case 401:
			return "authentication_error", ""
		case 403:
			return "permission_error", ""
		case 404:
			return "not_found_error", ""
		case 413:
			return "request_too_large", ""
		case 429:
			return "rate_limit_error", ""
		case 529:
			return "overloaded_error", ""
		}
		if status >= 500 {
			return "api_error", ""
		}
		return "invalid_request_error", ""
	}
	switch {
	case status == 401:
		return "invalid_request_error", "invalid_api_key"
	case status == 429:
		return "requests", "rate_limit_exceeded"
	case status >= 500:
		return "server_error", ""
	}
	return "invalid_request_error", ""
}

// writeError answers status with a JSON error body in p's shape.
func writeError(ctx *fasthttp.RequestCtx, p provider, status int, msg string) {
	typ, code := errorType(p, status)
	var b []byte
	if p == anthropic {
		b = append(b, `{"type":"error","error":{"type":"`...)
		b = append(b, typ...)
		b = append(b, `","message":`...)
		b = appendJSONString(b, msg)
		b = append(b, "}}"...)
	} else {
		b = append(b, `{"error":{"message":`...)
		b = appendJSONString(b, msg)
		b = append(b, `,"type":"`...)
		b = append(b, typ...)
		b = append(b, `","param":null,"code":`...)
		if code == "" {
			b = append(b, "null"...)
		} else {
			b = appendJSONString(b, code)
		}
		b = append(b, "}}"...)
	}
	writeJSON(ctx, status, b)
}

// writeStatusFault answers an X-Mock-Fault: status=CODE. A 429 carries
// Retry-After, as the providers send it, so retry logic has one to honour.
func writeStatusFault(ctx *fasthttp.RequestCtx, p provider, status int) {
	if status == fasthttp.StatusTooManyRequests {
		ctx.Response.Header.Set("Retry-After", "1")
	}
	msg := "mock fault: " + fasthttp.StatusMessage(status)
	if p == anthropic && status == 529 {
		msg = "Overloaded"
	}
	writeError(ctx, p, status, msg)
}

// writeContextFault answers a context-length fault as the provider says a
// prompt is too long for the model: OpenAI's 400 context_length_exceeded,
// Anthropic's 400 "prompt is too long".
func writeContextFault(ctx *fasthttp.RequestCtx, p provider) {
	writeRefusal(ctx, p, "prompt is too long: 210000 tokens > 200000 maximum",
		`{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 210000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`)
}

// writeRefusal answers 400: Anthropic's shape with message, or OpenAI's
// body as given.
func writeRefusal(ctx *fasthttp.RequestCtx, p provider, message, openAIBody string) {
	if p == anthropic {
		writeError(ctx, p, fasthttp.StatusBadRequest, message)
		return
	}
	writeJSON(ctx, fasthttp.StatusBadRequest, []byte(openAIBody))
}

// writeFilterFault answers a content-filter fault as OpenAI refuses a
// prompt its filter flagged: 400 content_filter (Anthropic: a plain 400).
func writeFilterFault(ctx *fasthttp.RequestCtx, p provider) {
	writeRefusal(ctx, p, "Output blocked by content filtering policy",
		`{"error":{"message":"The response was filtered due to the prompt triggering the content management policy.","type":"invalid_request_error","param":"prompt","code":"content_filter"}}`)
}

// writeRouteError answers a request no endpoint takes (404, 405), in a shape
// of the mock's own since no provider is known.
func writeRouteError(ctx *fasthttp.RequestCtx, status int, typ, msg string) {
	b := append([]byte(nil), `{"error":{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","message":`...)
	b = appendJSONString(b, msg)
	b = append(b, "}}"...)
	writeJSON(ctx, status, b)
}

// writeJSON answers status with the JSON body b.
func writeJSON(ctx *fasthttp.RequestCtx, status int, b []byte) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
