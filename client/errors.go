package client

import (
	"errors"
	"fmt"
)

// ErrStreamGone ends a body whose reconnection got 410 stream_gone: the
// generation its Last-Event-ID names is gone (aborted, replaced or
// expired). Start over without Last-Event-ID.
var ErrStreamGone = errors.New("client: stream_gone: the stream's generation is gone")

// ErrReconnectLimit is matched by the error that ends a body after
// MaxReconnects reconnections failed; it also wraps the last failure.
var ErrReconnectLimit = errors.New("client: reconnections exhausted")

// AbortedError ends a body that got ssegate's stream_aborted event
// (event: error, data {"error":{"type":"stream_aborted","code":...}}): the
// generation failed after it started, and nothing of it is stored. The
// event itself is not passed on.
type AbortedError struct {
	Code    string // the cause, e.g. upstream_read_error
	Message string
}

func (e *AbortedError) Error() string {
	return fmt.Sprintf("client: stream_aborted (%s): %s", e.Code, e.Message)
}

// ResumeError ends a body whose reconnection got an answer other than a
// stream, 204, 410 or a retryable status (e.g. 401, 404).
type ResumeError struct {
	StatusCode int
	Body       string // the start of the answer's body
}

func (e *ResumeError) Error() string {
	return fmt.Sprintf("client: resume answered %d: %s", e.StatusCode, e.Body)
}
