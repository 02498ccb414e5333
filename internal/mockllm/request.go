package mockllm

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// Bounds on the per-request overrides, so that a typo cannot ask the mock
// for a stream that never ends or a gigabyte event.
const (
	maxTokens      = 100_000
	maxDelay       = 10 * time.Second
	maxChunkBytes  = 1 << 20
	maxFaultEvents = 1_000_000
)

// faultKind names an X-Mock-Fault.
type faultKind int

const (
	faultNone      faultKind = iota
	faultStatus              // status=CODE
	faultReset               // reset-after=N
	faultEOF                 // eof-after=N
	faultError               // error-after=N
	faultHang                // hang
	faultHangAfter           // hang-after=N
	faultContext             // context-length: 400, the prompt is longer than the model's context
	faultFilter              // content-filter: 400, the prompt was refused by a content filter
)

// fault is one parsed X-Mock-Fault: its kind and its number (the status code
// or the events to send first).
type fault struct {
	kind faultKind
	n    int
}

// afterEvents reports whether the fault fires after n events of a stream.
func (f fault) afterEvents() bool {
	switch f.kind {
	case faultReset, faultEOF, faultError, faultHangAfter:
		return true
	}
	return false
}

// options are one request's settings: the Config's defaults with the
// X-Mock-* headers applied.
type options struct {
	tokens     int
	delay      time.Duration
	chunkBytes int
	fault      fault
}

// parseOptions applies the X-Mock-* headers of h to the defaults in cfg.
// Its errors name the header and are meant for a 400 body.
func parseOptions(cfg *Config, h *fasthttp.RequestHeader) (options, error) {
	o := options{tokens: cfg.Tokens, delay: cfg.Delay, chunkBytes: cfg.ChunkBytes}
	if o.tokens <= 0 {
		o.tokens = 16
	}
	if v := h.Peek("X-Mock-Tokens"); v != nil {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 1 || n > maxTokens {
			return o, fmt.Errorf("X-Mock-Tokens: %q is not a number in 1..%d", v, maxTokens)
		}
		o.tokens = n
	}
	if v := h.Peek("X-Mock-Delay"); v != nil {
		d, err := time.ParseDuration(string(v))
		if err != nil || d < 0 || d > maxDelay {
			return o, fmt.Errorf("X-Mock-Delay: %q is not a duration in 0..%v", v, maxDelay)
		}
		o.delay = d
	}
	if v := h.Peek("X-Mock-Chunk-Bytes"); v != nil {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 0 || n > maxChunkBytes {
			return o, fmt.Errorf("X-Mock-Chunk-Bytes: %q is not a number in 0..%d", v, maxChunkBytes)
		}
		o.chunkBytes = n
	}
	if v := h.Peek("X-Mock-Fault"); v != nil {
		f, err := parseFault(string(v))
		if err != nil {
			return o, fmt.Errorf("X-Mock-Fault: %q: %w", v, err)
		}
		o.fault = f
	}
	return o, nil
}

// parseFault parses an X-Mock-Fault value.
func parseFault(v string) (fault, error) {
	v = strings.TrimSpace(v)
	switch v {
	case "hang":
		return fault{kind: faultHang}, nil
	case "context-length":
		return fault{kind: faultContext}, nil
	case "content-filter":
		return fault{kind: faultFilter}, nil
	}
	name, arg, ok := strings.Cut(v, "=")
	if !ok {
		return fault{}, errors.New("want status=CODE, reset-after=N, eof-after=N, error-after=N, hang, hang-after=N, context-length or content-filter")
	}
	n, err := strconv.Atoi(arg)
	if err != nil {
		return fault{}, fmt.Errorf("%q is not a number", arg)
	}
	f := fault{n: n}
	switch name {
	case "status":
		if n < 400 || n > 599 {
			return fault{}, fmt.Errorf("status %d is not in 400..599", n)
		}
		f.kind = faultStatus
		return f, nil
	case "reset-after":
		f.kind = faultReset
	case "eof-after":
		f.kind = faultEOF
	case "error-after":
		f.kind = faultError
	case "hang-after":
		f.kind = faultHangAfter
	default:
		return fault{}, fmt.Errorf("unknown fault %q", name)
	}
	if n < 0 || n > maxFaultEvents {
		return fault{}, fmt.Errorf("%d events is not in 0..%d", n, maxFaultEvents)
	}
	return f, nil
}

// request holds the fields of a model request the mock acts on; the union
// of the three dialects, since each ignores the others' fields.
type request struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	Background    bool   `json:"background"` // Responses: kept for GET /v1/responses/{id}
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           int `json:"max_tokens"`
	MaxCompletionTokens int `json:"max_completion_tokens"`
	MaxOutputTokens     int `json:"max_output_tokens"`
}

// parseRequest decodes a model request body. An empty body is taken as {},
// which keeps hand-written test requests short; malformed JSON is an error,
// as it is for the real APIs.
func parseRequest(body []byte) (request, error) {
	var r request
	if len(body) == 0 {
		return r, nil
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return r, fmt.Errorf("request body is not valid JSON: %w", err)
	}
	if r.MaxTokens < 0 || r.MaxCompletionTokens < 0 || r.MaxOutputTokens < 0 {
		return r, errors.New("token limit must not be negative")
	}
	return r, nil
}
