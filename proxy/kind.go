package proxy

import (
	"slices"
	"strings"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// A kind is what differs between the kinds of call the one engine makes:
// a model's generation (llmKind), a keyed MCP tool call (toolKind) and
// the relay of an MCP path's messages (rawKind). It says what an
// answer's head means (which statuses may be sent again, which leave the
// call possibly run, whether the answer goes to the client as it is),
// what a stream's events mean (judge: the end, and whether it is clean),
// how a whole body is judged, and the state a failed end leaves.
// Everything else is the engine's, the same for every kind: the attempts
// (gen.attempts: route, retries within every -retry-* bound, the retry
// budget and its metrics, fallback hand-off), the event loop (pump), the
// whole-body recorder (settle) and the delivery to clients (deliver,
// answerEnded), as httputil's ReverseProxy keeps one round trip for
// every request and lets its hooks say what differs.
//
// A kind is never written once made, and may be shared by generations.
type kind struct {
	// model: a model's generation. Only it falls back to another model,
	// heals a broken Responses stream, holds the events before its first
	// output (preamble), and is observed by the GenAI metrics and the
	// time to its first output. Without a key (an unkeyed flight, Gen
	// 0), its answer that is not an event stream goes to the client as
	// it is (gen.passRaw).
	model bool
	// raw: every answer goes to the client as it is, an event stream or
	// an error status included, never recorded and never sent again once
	// the upstream answered; the call is cancelled when its client leaves
	// (origin.answerRest).
	raw bool
	// streamOnHead: whether the answer is a stream is known only from its
	// head (an MCP POST is answered with JSON or an event stream), so an
	// event stream read on the whole-answer client goes on as a stream,
	// bounded by the upstream's silence rather than -attempt-timeout.
	streamOnHead bool
	// ranOnAnswer: a 2xx head says the call ran. A failed end after it
	// leaves commit_unknown, unless failed says otherwise.
	ranOnAnswer bool
	// repeatsAmbiguous: -retry-ambiguous may send the call again after an
	// ambiguous failure, to an upstream known to deduplicate on the key.
	repeatsAmbiguous bool
	// ambiguous reports whether an error answer with status, unmarked,
	// leaves the call possibly run: never sent again, and commit_unknown.
	ambiguous func(cfg *Config, status int) bool
	// judge returns the judge of one answer's events, for the request req.
	judge func(req sse.Request) judge
	// whole judges a whole 2xx body: the cause that makes it no result,
	// or causeNone for a result.
	whole func(body []byte) cause
	// failed is the state a failed end for c leaves, when the kind decides
	// it (ok); otherwise gen.failState's rules do.
	failed func(c cause) (state cache.State, ok bool)
	// send, when set, makes the call instead of an HTTP round trip (a
	// WebSocket turn: its frame on the connection's upstream socket), and
	// gives resp the head and body of its answer, as the upstream's Do.
	send func(g *gen, req *fasthttp.Request, resp *fasthttp.Response) error
	// once: the call is sent at most once, whatever its failure's verdict
	// (a WebSocket turn: the protocol has no way to tell a repeat apart).
	once bool
	// perCall, when set, is the histogram of the upstream calls one call
	// of the kind made, observed at its end (a model's are observed per
	// success: ssegate_upstream_attempts_per_success).
	perCall func(m *metrics) prometheus.Observer
}

// A judge reads one answer's events for what they mean to its kind: the
// end of the answer, and whether it is clean. Observe is called with
// every event, in order; the others report what was observed. It is
// used by one goroutine, the generation's. *sse.Detector is a model's.
type judge interface {
	Observe(ev sse.Event)
	// Content reports whether an event so far carried output, which ends
	// the preamble (a kind that holds none has content at once).
	Content() bool
	// Terminal reports whether the last event observed ends the answer.
	Terminal() bool
	// Clean reports whether the answer ended cleanly, and otherwise why
	// not (one of sse's Reason names); intact: the body ended with its
	// framing whole.
	Clean(intact bool) (ok bool, reason string)
	// Usage reports the tokens the upstream said it used, if it said.
	Usage() (input, output int64, ok bool)
	// ErrSeen and Dialect are a model's (sse.Detector).
	ErrSeen() bool
	Dialect() sse.Dialect
}

// The judges of the kinds.
var (
	_ judge = (*sse.Detector)(nil)
	_ judge = (*toolJudge)(nil)
)

// llmKind is a model's generation: the statuses of docs/design.md,
// Upstream retries; its stream judged by sse.Detector; an error object
// in a whole 2xx body makes it no result.
var llmKind = &kind{
	model:            true,
	repeatsAmbiguous: true,
	ambiguous: func(cfg *Config, status int) bool {
		return slices.Contains(cfg.AmbiguousStatus, status)
	},
	judge: func(req sse.Request) judge { return sse.NewDetector(req.Expect()) },
	whole: func(body []byte) cause {
		if isErrorObject(body) {
			// OpenRouter and several OpenAI-compatible servers answer a
			// failure so: relayed as it came, like a 4xx, and not stored.
			return causeErrorBody
		}
		return causeNone
	},
	failed: func(cause) (cache.State, bool) { return "", false },
}

// rawKind relays the messages of an MCP path without recording them:
// every answer as the server sent it.
var rawKind = &kind{
	raw:          true,
	streamOnHead: true,
	ambiguous:    func(*Config, int) bool { return false },
	judge:        func(req sse.Request) judge { return sse.NewDetector(req.Expect()) }, // never pumped: its answers are raw
	whole:        func([]byte) cause { return causeNone },
	failed:       func(cause) (cache.State, bool) { return "", false },
}

// toolKind is the kind of a keyed MCP tools/call whose JSON-RPC id is
// id. It is sent again only where the server certainly did not get it: a
// connect error, a pooled connection found closed before writing (their
// causes' verdict), or 429 and 503 without the outcome-unknown marker;
// any other 5xx (or 1xx, 3xx) may have run it, and so may every answer
// once its 2xx head came: commit_unknown, never sent again, -retry-
// ambiguous or not. Its answer is the server's response to the call: a
// result commits (an isError result too: the tool ran), a JSON-RPC error
// is the server's refusal, relayed and not stored (failed_terminal).
func toolKind(id []byte) *kind {
	return &kind{
		streamOnHead: true,
		ranOnAnswer:  true,
		ambiguous: func(_ *Config, status int) bool {
			if status == fasthttp.StatusTooManyRequests || status == fasthttp.StatusServiceUnavailable {
				return false
			}
			return status < 400 || status >= 500
		},
		judge: func(sse.Request) judge { return &toolJudge{id: id} },
		whole: func(body []byte) cause {
			switch {
			case !sameID(gjson.GetBytes(body, "id"), id):
				return causeNotAnEventStream
			case gjson.GetBytes(body, "result").Exists():
				return causeNone
			case gjson.GetBytes(body, "error").Exists():
				return causeErrorBody
			}
			return causeNotAnEventStream
		},
		failed: func(c cause) (cache.State, bool) {
			switch c {
			case causeErrorBody, causeErrorEvent:
				// The server's JSON-RPC error: it answered the call.
				return cache.StateFailedTerminal, true
			}
			return "", false
		},
		perCall: func(m *metrics) prometheus.Observer { return m.toolAttempts },
	}
}

// toolJudge judges the event stream of a tool call: it ends with the
// server's response to the call (a message with the call's id and no
// method; notifications and the server's own requests come before it),
// clean when that response is a result.
type toolJudge struct {
	id       []byte
	terminal bool
	result   bool
}

func (j *toolJudge) Observe(ev sse.Event) {
	if j.terminal || gjson.Get(ev.Data, "method").Exists() || !sameID(gjson.Get(ev.Data, "id"), j.id) {
		return // a notification or a request of the server's
	}
	j.terminal = true
	j.result = gjson.Get(ev.Data, "result").Exists()
}

func (j *toolJudge) Content() bool  { return true }
func (j *toolJudge) Terminal() bool { return j.terminal }

func (j *toolJudge) Clean(bool) (bool, string) {
	switch {
	case j.result:
		return true, ""
	case j.terminal:
		return false, sse.ReasonErrorEvent
	}
	return false, sse.ReasonNoTerminalEvent
}

func (j *toolJudge) Usage() (int64, int64, bool) { return 0, 0, false }
func (j *toolJudge) ErrSeen() bool               { return j.terminal && !j.result }
func (j *toolJudge) Dialect() sse.Dialect        { return 0 }

// sameID reports whether a message's id r is the call's id, as JSON
// values (sameRPCID): a server may write it back in another spelling.
func sameID(r gjson.Result, id []byte) bool {
	return r.Exists() && sameRPCID(r.Raw, string(id))
}

func isEventStream(ct string) bool {
	ct = strings.TrimSpace(strings.ToLower(ct))
	return strings.HasPrefix(ct, "text/event-stream")
}

// isErrorObject reports whether a JSON body is an error answer, whatever
// its status says: an object whose top-level "error" is set (not null), or
// whose "type" is "error" (Anthropic's), as the stream detector reads an
// event's data.
func isErrorObject(body []byte) bool {
	// gjson.ParseBytes would copy the body into a string first; nothing
	// read from v outlives this call.
	v := gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body)))
	if !v.IsObject() {
		return false
	}
	e := v.Get("error")
	return e.Exists() && e.Type != gjson.Null || v.Get("type").String() == "error"
}

// errorCode is the code of an upstream's JSON error answer: OpenAI's
// error.code, or else the error's type (Anthropic's error.type).
func errorCode(body []byte) string {
	e := gjson.GetBytes(body, "error")
	if c := e.Get("code"); c.Type == gjson.String && c.Str != "" {
		return c.Str
	}
	t := e.Get("type").String()
	if t == "invalid_request_error" && strings.HasPrefix(e.Get("message").String(), "prompt is too long") {
		return "context_length_exceeded" // Anthropic's words for it
	}
	return t
}
