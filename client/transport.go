package client

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Defaults of the Transport's fields; a field's zero value means its default.
const (
	DefaultMaxAttempts   = 3
	DefaultMaxElapsed    = 30 * time.Second
	DefaultMinBackoff    = 200 * time.Millisecond
	DefaultMaxBackoff    = 5 * time.Second
	DefaultMaxRetryAfter = 10 * time.Second
	DefaultMaxBodyBuffer = 8 << 20
	DefaultMaxReconnects = 5
)

// Transport is an [http.RoundTripper] for requests to ssegate. Its zero
// value is ready to use. It is safe for concurrent use; its fields must not
// change once it is in use.
//
// For every request it
//   - sets the Idempotency-Key header: a request that has one keeps it;
//     otherwise the key pinned to its context by [WithIdempotencyKey];
//     otherwise, for a POST, a fresh random key, which the Transport's own
//     retries and resumes reuse;
//   - retries, before the response head, connection errors, 429, 500 and
//     503 answers (never another 4xx, never 502 or 504, and never an
//     answer carrying Ssegate-Outcome: unknown, whatever its status: ssegate
//     marks so every answer whose request went upstream and whose outcome
//     is unknown), with full-jitter exponential backoff
//     and Retry-After honoured, at most MaxAttempts attempts within
//     MaxElapsed; once retries are exhausted, the last answer (or error)
//     is returned as it came;
//   - resumes a keyed text/event-stream answer whose connection breaks
//     before its end: see [Transport.MaxReconnects].
type Transport struct {
	// Base makes the requests; nil means http.DefaultTransport.
	Base http.RoundTripper

	// MaxAttempts bounds the attempts of one request before its response
	// head, the first included; 0 means DefaultMaxAttempts (3), 1 turns
	// retries off.
	MaxAttempts int
	// MaxElapsed bounds the time spent on retries of one request; 0 means
	// DefaultMaxElapsed (30s).
	MaxElapsed time.Duration
	// MinBackoff and MaxBackoff shape the backoff: before retry n the
	// Transport waits a random time in [0, min(MaxBackoff, MinBackoff*2^n)).
	// 0 means DefaultMinBackoff (200ms) and DefaultMaxBackoff (5s).
	MinBackoff, MaxBackoff time.Duration
	// MaxRetryAfter bounds the wait a 429 or 503's Retry-After asks for; an
	// answer asking for longer is returned to the caller instead of being
	// retried. 0 means DefaultMaxRetryAfter (10s).
	MaxRetryAfter time.Duration
	// MaxBodyBuffer bounds the bytes of a request body kept to send it
	// again when the request has no GetBody; a larger body is sent once,
	// without retries. 0 means DefaultMaxBodyBuffer (8 MiB).
	MaxBodyBuffer int64

	// MaxReconnects bounds the reconnections of one streamed answer; 0
	// means DefaultMaxReconnects (5), a negative value turns resuming off.
	//
	// A keyed answer with Content-Type text/event-stream is read event by
	// event: its body passes on whole events only (a partial event waits
	// for its blank line). When the connection breaks before the stream's
	// end (a read error, a cut chunked body) and before a terminal event
	// ([DONE], message_stop, response.completed, response.failed,
	// response.incomplete), the body reconnects by itself with a GET of
	// the key's stream (the Ssegate-Resume-Url the answer carried, resolved
	// against the request's URL, so a path prefix in front of ssegate is
	// kept; without one, {scheme://host}/streams/{key}) with its token left
	// out, Last-Event-ID set to the id of the
	// last whole event it passed on and the original request's headers
	// (credentials included, content headers left out) and its
	// ?key= credential parameter, with backoff, and
	// goes on: the reader sees one stream with no gap and no duplicate. A
	// body that ends cleanly (the chunked body's last chunk, or the end of
	// an unframed one) is the server's end of the stream, and is passed on
	// as it came. A request that carries its own Last-Event-ID and is cut
	// before any event reconnects from that id.
	//
	// A 410 to a reconnection ends the body with [ErrStreamGone]. ssegate's
	// stream_aborted event is not passed on: the body ends, after the
	// events before it, with an [*AbortedError]. Reconnections that all
	// fail end it with an error that matches [ErrReconnectLimit] and wraps
	// the last failure.
	MaxReconnects int
}

type keyCtx struct{}

// WithIdempotencyKey returns a context that pins key to every request made
// with it through a [Transport], the retries of an SDK included, so that
// they are one intent to ssegate: a repeat joins or replays the first
// generation instead of starting another.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// IdempotencyKey returns the key pinned to ctx by [WithIdempotencyKey].
func IdempotencyKey(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtx{}).(string)
	return k, ok && k != ""
}

// NewKey returns a fresh random Idempotency-Key.
func NewKey() string {
	var b [16]byte
	crand.Read(b[:]) //nolint:errcheck // crypto/rand.Read does not fail
	return hex.EncodeToString(b[:])
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

func orDefault[T int | int64 | time.Duration](v, d T) T {
	if v == 0 {
		return d
	}
	return v
}

// fullJitter is exponential backoff with full jitter.
type fullJitter struct {
	min, max time.Duration
	n        int
}

func (b *fullJitter) Reset() { b.n = 0 }

func (b *fullJitter) NextBackOff() time.Duration {
	c := b.min << min(b.n, 30)
	if c <= 0 || c > b.max {
		c = b.max
	}
	b.n++
	return time.Duration(mrand.Int64N(int64(c) + 1))
}

func (t *Transport) backoff() *fullJitter {
	return &fullJitter{min: orDefault(t.MinBackoff, DefaultMinBackoff), max: orDefault(t.MaxBackoff, DefaultMaxBackoff)}
}

// retryStatus is a retryable answer, kept open in case it is the last.
type retryStatus struct {
	resp  *http.Response
	after *backoff.RetryAfterError // nil without Retry-After
}

func (e *retryStatus) Error() string { return "client: " + e.resp.Status }

func (e *retryStatus) Unwrap() error {
	if e.after == nil {
		return nil
	}
	return e.after
}

// retryAfter parses Retry-After (seconds or an HTTP date); ok is false when
// it is absent or unreadable.
func retryAfter(h http.Header) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(at)), true
	}
	return 0, false
}

func retryable(code int) bool { return code == http.StatusTooManyRequests || code >= 500 }

// retryableAnswer reports whether a request's answer may be asked for
// again: 429, 500 and 503, which say the request did not run (ssegate's
// capacity, shutdown and store answers are 503s). Never 502 or 504:
// ssegate answers those when the upstream's outcome is unknown, and the
// key is then free, so a repeat could be a second paid generation.
//
// An answer marked with OutcomeHeader is never retried, whatever its
// status: the request went upstream and its outcome is unknown.
func retryableAnswer(resp *http.Response) bool {
	if OutcomeUnknown(resp) {
		return false
	}
	code := resp.StatusCode
	return code == http.StatusTooManyRequests || code == http.StatusInternalServerError || code == http.StatusServiceUnavailable
}

// OutcomeHeader is the header ssegate sets, to "unknown", on every answer
// whose request went upstream and whose outcome cannot be known (the key
// is left commit_unknown): repeating it could run the request twice.
const OutcomeHeader = "Ssegate-Outcome"

// OutcomeUnknown reports whether resp carries ssegate's outcome-unknown
// marker.
func OutcomeUnknown(resp *http.Response) bool {
	return strings.EqualFold(strings.TrimSpace(resp.Header.Get(OutcomeHeader)), "unknown")
}

// RoundTrip implements [http.RoundTripper].
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	r := req.Clone(ctx)
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		if k, ok := IdempotencyKey(ctx); ok {
			key = k
		} else if r.Method == http.MethodPost {
			key = NewKey()
		}
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
	}

	getBody, once, err := t.replayable(req)
	if err != nil {
		return nil, err
	}
	attempts := orDefault(t.MaxAttempts, DefaultMaxAttempts)
	if once || (key == "" && !idempotent(r.Method)) {
		attempts = 1
	}
	maxAfter := orDefault(t.MaxRetryAfter, DefaultMaxRetryAfter)

	var last *http.Response // a retryable answer, closed before the next attempt
	n := 0
	op := func() (*http.Response, error) {
		if last != nil {
			drain(last.Body)
			last = nil
		}
		a := r
		if n > 0 || getBody != nil {
			a = r.Clone(ctx)
			if getBody != nil {
				b, err := getBody()
				if err != nil {
					return nil, backoff.Permanent(err)
				}
				a.Body = b
			}
		}
		n++
		resp, err := t.base().RoundTrip(a)
		if err != nil {
			if ctx.Err() != nil {
				return nil, backoff.Permanent(err)
			}
			return nil, err
		}
		if !retryableAnswer(resp) {
			return resp, nil
		}
		e := &retryStatus{resp: resp}
		if d, ok := retryAfter(resp.Header); ok {
			if d > maxAfter {
				return resp, nil // longer than we wait: the caller decides
			}
			e.after = &backoff.RetryAfterError{Duration: d}
		}
		last = resp
		return nil, e
	}
	resp, err := backoff.Retry(ctx, op,
		backoff.WithBackOff(t.backoff()),
		backoff.WithMaxTries(uint(max(1, attempts))),
		backoff.WithMaxElapsedTime(orDefault(t.MaxElapsed, DefaultMaxElapsed)))
	if err != nil {
		var rs *retryStatus
		if errors.As(err, &rs) {
			return rs.resp, nil // retries exhausted: the last answer as it came
		}
		if last != nil {
			drain(last.Body)
		}
		return nil, err
	}
	if key != "" && orDefault(t.MaxReconnects, DefaultMaxReconnects) > 0 &&
		resp.StatusCode/100 == 2 && isEventStream(resp.Header) {
		resp.Body = newResumeBody(t, r, key, resp.Body, resp.Header.Get(resumeHeader))
		resp.ContentLength = -1
	}
	return resp, nil
}

func idempotent(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

func isEventStream(h http.Header) bool {
	ct := strings.ToLower(strings.TrimSpace(h.Get("Content-Type")))
	return strings.HasPrefix(ct, "text/event-stream")
}

func drain(b io.ReadCloser) {
	io.CopyN(io.Discard, b, 4<<10) //nolint:errcheck // only to reuse the connection
	b.Close()
}

// replayable returns how to get the request's body again: its GetBody, or
// a copy of at most MaxBodyBuffer bytes (then req.Body is replaced, once
// reports that a larger body can only be sent once).
func (t *Transport) replayable(req *http.Request) (getBody func() (io.ReadCloser, error), once bool, err error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, false, nil
	}
	if req.GetBody != nil {
		req.Body.Close() // every attempt reads a body of its own from GetBody
		return req.GetBody, false, nil
	}
	limit := orDefault(t.MaxBodyBuffer, DefaultMaxBodyBuffer)
	buf, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		req.Body.Close()
		return nil, false, fmt.Errorf("client: reading the request body: %w", err)
	}
	if int64(len(buf)) > limit {
		rest := req.Body
		return func() (io.ReadCloser, error) {
			return struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(buf), rest), rest}, nil
		}, true, nil
	}
	req.Body.Close()
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }, false, nil
}
