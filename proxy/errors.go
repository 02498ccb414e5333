package proxy

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"

	"github.com/valyala/fasthttp"
)

// apiError is an error answered to the client as JSON before any byte of
// a stream went out. Its type is one of DESIGN.md's error types.
type apiError struct {
	status     int
	typ        string
	message    string
	retryAfter int // seconds; 0 for none
}

func (e *apiError) Error() string { return e.typ + ": " + e.message }

// The error types ssegate answers with. Status codes live here and only here.
func errInvalidKey(msg string) *apiError {
	return &apiError{status: fasthttp.StatusBadRequest, typ: "invalid_idempotency_key", message: msg}
}

func errInvalidLastEventID(msg string) *apiError {
	return &apiError{status: fasthttp.StatusBadRequest, typ: "invalid_last_event_id", message: msg}
}

func errNotFound(msg string) *apiError {
	return &apiError{status: fasthttp.StatusNotFound, typ: "stream_not_found", message: msg}
}

func errCredentialRequired() *apiError {
	return &apiError{status: fasthttp.StatusUnauthorized, typ: "credential_required",
		message: "keyed requests, resumes and key lookups must carry a credential (Authorization, x-api-key, api-key, x-goog-api-key or the key query parameter): -anonymous-keys is deny"}
}

func errInFlight() *apiError {
	return &apiError{status: fasthttp.StatusConflict, typ: "idempotency_in_flight",
		message: "a request with this Idempotency-Key is still in flight; retry later", retryAfter: 1}
}

func errGone(msg string) *apiError {
	return &apiError{status: fasthttp.StatusGone, typ: "stream_gone", message: msg}
}

func errTooLarge(msg string) *apiError {
	return &apiError{status: fasthttp.StatusRequestEntityTooLarge, typ: "request_too_large", message: msg}
}

func errInvalidResumeToken() *apiError {
	return &apiError{status: fasthttp.StatusForbidden, typ: "invalid_resume_token",
		message: "the resume token is not valid for this stream, or has expired"}
}

func errConflict() *apiError {
	return &apiError{status: fasthttp.StatusUnprocessableEntity, typ: "idempotency_conflict",
		message: "this Idempotency-Key was used with a different request (method, path, query or body)"}
}

func errUpstream(msg string) *apiError {
	return &apiError{status: fasthttp.StatusBadGateway, typ: "upstream_error", message: msg}
}

func errUpstreamTimeout(msg string) *apiError {
	return &apiError{status: fasthttp.StatusGatewayTimeout, typ: "upstream_timeout", message: msg}
}

func errCapacity(msg string) *apiError {
	return &apiError{status: fasthttp.StatusServiceUnavailable, typ: "capacity_exceeded", message: msg, retryAfter: 1}
}

type errorBody struct {
	Error errorFields `json:"error"`
}

type errorFields struct {
	Type    string `json:"type"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
}

// writeError answers e as JSON and logs it.
func (p *Proxy) writeError(ctx *fasthttp.RequestCtx, e *apiError, attrs ...any) {
	fillError(&ctx.Response, e)
	p.logRefused(e, string(ctx.Method()), string(ctx.Path()), attrs...)
}

// fillError makes resp the JSON answer of e.
func fillError(resp *fasthttp.Response, e *apiError) {
	resp.Reset()
	resp.SetStatusCode(e.status)
	resp.Header.SetContentType("application/json")
	if e.retryAfter > 0 {
		resp.Header.Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	b, _ := json.Marshal(errorBody{Error: errorFields{Type: e.typ, Message: e.message}})
	resp.SetBody(b)
}

func (p *Proxy) logRefused(e *apiError, method, path string, attrs ...any) {
	level := slog.LevelInfo
	if e.status >= 500 {
		level = slog.LevelWarn
	}
	p.log.Log(context.Background(), level, "request refused", append([]any{
		"status", e.status, "type", e.typ, "msg", e.message, "method", method, "path", path,
	}, attrs...)...)
}

// abortEvent is the data of the event that ends an aborted stream.
func abortEvent(code, message string) string {
	b, _ := json.Marshal(errorBody{Error: errorFields{Type: "stream_aborted", Code: code, Message: message}})
	return string(b)
}
