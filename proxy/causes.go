package proxy

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/ssegate/ssegate/sse"
	"github.com/valyala/fasthttp"
)

// A cause is one way a request or a stream ends without a whole answer:
// a request refused before any upstream work, an attempt that failed, or
// a stream cut after its first event. Its row in causes says everything
// the proxy does about it:
//
//   - name: the metric label, the log field "reason", the ledger's reason
//     (GET /keys/{key}), and the code of the stream_aborted event;
//   - refusal: the decision counted for a request refused for it before
//     any decision was taken (decisionNone where it ends a request already
//     counted by its decision);
//   - verdict: whether an attempt that failed so, before the first event,
//     may be repeated (upstream.Verdict); final for causes that are no attempt's;
//   - state: the key state a generation ends in when the cause ends it
//     before its first event (an abort after the first event always
//     leaves failed_retryable, except where the store ends the generation
//     and says so: generation_lost, fenced, store_unavailable; and any
//     failed end is commit_unknown once an ambiguous attempt was repeated:
//     gen.failState);
//   - status, typ, retry, msg: the JSON error answered before the first
//     byte (docs/design.md, Errors); an upstream's own error answer is
//     relayed as it came, and its row's answer is for one whose body could
//     not be read;
//   - abort: the stream_aborted message after the first byte ("" where
//     the cause cannot come after it);
//   - relayEnd: the stream ended as the provider stated it, and what
//     reached its clients is the provider's whole word: its own failure
//     (an error event or member, response.failed), or an answer whole for
//     what the request asked that cannot be proven whole otherwise (a
//     choice the request did not ask for, a missing usage chunk or
//     stop_reason, a stream of no known dialect). Such a stream is relayed
//     as it came, its terminal event included, and ends there: no
//     stream_aborted follows, and it is not stored
//     (ssegate_cache_skipped_total{reason}). stream_aborted is for the
//     ends the provider did not state (a cut, a silence, a bound, bytes
//     that are not a stream) and for a terminal event that would pass a
//     half answer for a whole one (a [DONE] with a choice of n unfinished
//     or missing, a response.completed after a sequence gap), which is
//     not relayed;
//   - fallback: when every attempt for a model ended so, the next model of
//     its -fallback rule is tried: the upstream said the model did not run
//     the request, or could not be asked;
//   - byStatus: the upstream's own error answer: its reason is
//     upstream_status_N, N the upstream's status, and it ends the flight in
//     the row's state even after the head, since it is the whole answer.
//
// Adding a cause is one constant and one row; TestCauseTable checks that
// every cause has a row, that names are unique, and that every reason the
// detector (sse.Reasons) and the stores (cache.Reasons) give has its row.
type cause uint8

const (
	causeNone cause = iota

	// The request, refused before any upstream work.
	causeInvalidKey
	causeInvalidLastEventID
	causeInvalidStartingAfter
	causeCredentialRequired
	causeInvalidResumeToken
	causeMethodNotAllowed
	causeStreamNotFound
	causeKeyNotFound
	causeStreamEnded
	causeAdminNotFound
	causeInFlight
	causeGone
	causeConflict
	causeBodyTooLarge
	causeHeadersTooLarge
	causeRequestTimeout
	causeMalformedRequest
	causeTooManyCredentials

	// Bounds, and the store.
	causeMaxStreams
	causeMaxFollowers
	causeTenantFull
	causeStoreFull
	causeStoreUnavailable
	causeMaxStreamBytes
	causeMaxEventBytes
	causeMaxStreamDuration

	// The proxy and its replicas.
	causeShutdown
	causeClientGone
	causeGenerationLost
	causeFenced
	causeCancelled // the tenant stopped the generation (stop.go)

	// The upstream, before its answer's head.
	causeUpstreamUnavailable
	causeConnectError
	causeStaleConnection
	causeUpstreamTimeout
	causeUpstreamReset

	// The upstream's answer.
	causeUpstreamRefused // a 4xx other than 429: the client's request, refused
	causeUpstreamFailed  // 429 or 5xx
	causeNotAnEventStream
	causeUnframedBody
	causeErrorBody // a 2xx whose JSON body is an error object
	causeUpstreamIdleTimeout
	causeUpstreamReadError
	causeHealRefused // a background Responses stream's resume, refused by the upstream
	// An ssegate upstream's stream_aborted before any other event: its
	// word that the outcome is unknown, as its marker is (final: never
	// repeated, -retry-ambiguous or not, since its key may now be free).
	causeUpstreamAborted

	// The stream's end, as sse.Detector judges it.
	causeErrorEvent
	causeMalformedEvent
	causeUnknownDialect
	causeNoTerminalEvent
	causeUnexpectedChoice
	causeNoChoices
	causeMissingChoice
	causeMissingFinishReason
	causeMissingUsage
	causeResponseFailed
	causeSequenceGap
	causeMissingStopReason
	causeUncleanEnd // a reason of a store or replica this proxy does not know

	// A Responses WebSocket's refusals (ws.go), answered with an error
	// frame (apiError.wsFrame), or at the handshake.
	causeWSMaxConns
	causeWSMaxTurns
	causeWSBinaryFrame
	causeWSNotJSON
	causeWSUnknownFrame
	causeWSEmptyCreate
	causeWSUpstreamGone

	numCauses
)

type causeRow struct {
	name     string
	refusal  decision
	verdict  upstream.Verdict
	state    cache.State
	status   int
	typ      string
	retry    int // Retry-After seconds, 0 for none
	msg      string
	abort    string
	relayEnd bool
	fallback bool
	byStatus bool
}

// Shorthands of the table's columns.
const (
	s400, s401, s403, s404, s408 = fasthttp.StatusBadRequest, fasthttp.StatusUnauthorized, fasthttp.StatusForbidden, fasthttp.StatusNotFound, fasthttp.StatusRequestTimeout
	s409, s410, s413, s422, s431 = fasthttp.StatusConflict, fasthttp.StatusGone, fasthttp.StatusRequestEntityTooLarge, fasthttp.StatusUnprocessableEntity, fasthttp.StatusRequestHeaderFieldsTooLarge
	s502, s503, s504             = fasthttp.StatusBadGateway, fasthttp.StatusServiceUnavailable, fasthttp.StatusGatewayTimeout

	retryable = cache.StateFailedRetryable
	terminal  = cache.StateFailedTerminal
	unknown   = cache.StateCommitUnknown

	tUpstream    = "upstream_error"
	tTimeout     = "upstream_timeout"
	tCapacity    = "capacity_exceeded"
	tInvalid     = "invalid_request"
	notSentAgain = "; its outcome is unknown, and it was not sent again"
	notAStream   = "the upstream answered, but not with a valid event stream" + notSentAgain
)

// causes is the table of causes: the only place a status, an error type, a
// stream_aborted code or a failed key state is chosen.
var causes = [numCauses]causeRow{
	causeInvalidKey:           {name: "invalid_idempotency_key", refusal: decisionInvalid, status: s400, typ: "invalid_idempotency_key", msg: "the Idempotency-Key is not valid"},
	causeInvalidLastEventID:   {name: "invalid_last_event_id", refusal: decisionInvalid, status: s400, typ: "invalid_last_event_id", msg: "Last-Event-ID cannot be resumed"},
	causeInvalidStartingAfter: {name: "invalid_starting_after", refusal: decisionInvalid, status: s400, typ: tInvalid, msg: "starting_after cannot be resumed"},
	causeCredentialRequired:   {name: "credential_required", refusal: decisionDenied, status: s401, typ: "credential_required", msg: "keyed requests, resumes and key lookups must carry a credential (Authorization, x-api-key, api-key, x-goog-api-key or the key query parameter): -anonymous-keys is deny"},
	causeInvalidResumeToken:   {name: "invalid_resume_token", refusal: decisionInvalid, status: s403, typ: "invalid_resume_token", msg: "the resume token is not valid for this stream, or has expired"},
	causeMethodNotAllowed:     {name: "method_not_allowed", refusal: decisionInvalid, status: fasthttp.StatusMethodNotAllowed, typ: tInvalid, msg: "/streams/{key} answers GET, HEAD and DELETE only, and never goes upstream"},
	causeStreamNotFound:       {name: "stream_not_found", status: s404, typ: "stream_not_found", msg: "no stream is known under this key for this credential"},
	causeKeyNotFound:          {name: "key_not_found", status: s404, typ: "key_not_found", msg: "no key is known under this name for this credential"},
	causeStreamEnded:          {name: "stream_ended", status: s409, typ: "stream_ended", msg: "the key's generation is not running: there is nothing to stop"},
	causeAdminNotFound:        {name: "not_found", status: s404, typ: "not_found", msg: "the admin listener serves /metrics, /healthz and /readyz"},
	causeInFlight:             {name: "idempotency_in_flight", status: s409, typ: "idempotency_in_flight", retry: 1, msg: "a request with this Idempotency-Key is still in flight; retry later"},
	causeGone:                 {name: "stream_gone", status: s410, typ: "stream_gone", msg: "the stream asked for is no longer held; start over without Last-Event-ID"},
	causeConflict:             {name: "idempotency_conflict", status: s422, typ: "idempotency_conflict", msg: "this Idempotency-Key was used with a different request (method, path, query or body)"},
	causeBodyTooLarge:         {name: "request_too_large", refusal: decisionInvalid, status: s413, typ: "request_too_large", msg: "the request body exceeds -max-body"},
	causeHeadersTooLarge:      {name: "headers_too_large", refusal: decisionInvalid, status: s431, typ: tInvalid, msg: "request headers too large"},
	causeRequestTimeout:       {name: "request_timeout", refusal: decisionInvalid, status: s408, typ: tInvalid, msg: "request not read within its time"},
	causeMalformedRequest:     {name: "malformed_request", refusal: decisionInvalid, status: s400, typ: tInvalid, msg: "malformed request"},
	causeTooManyCredentials:   {name: "too_many_credentials", refusal: decisionInvalid, status: s400, typ: tInvalid, msg: "the request carries more distinct credential values (Authorization, x-api-key, api-key, x-goog-api-key, ?key=) than -max-credentials"},

	causeMaxStreams:        {name: "max_streams", refusal: decisionRefused, state: retryable, status: s503, typ: tCapacity, retry: 1, msg: "the bound on upstream calls in progress (-max-streams) is reached"},
	causeMaxFollowers:      {name: "max_followers", status: s503, typ: tCapacity, retry: 1, msg: "this stream has its maximum number of followers"},
	causeTenantFull:        {name: "tenant_full", refusal: decisionRefused, status: s503, typ: tCapacity, retry: 1, msg: "this credential holds -max-keys-per-tenant keys; its new keys are refused until some of its keys expire"},
	causeStoreFull:         {name: cache.ReasonStoreFull, refusal: decisionRefused, state: retryable, status: s503, typ: tCapacity, retry: 1, msg: "the store is full", abort: "the proxy's live journals are full"},
	causeStoreUnavailable:  {name: cache.ReasonStoreUnavailable, refusal: decisionRefused, state: unknown, status: s503, typ: "store_unavailable", retry: 1, msg: "the idempotency store failed", abort: "the store holding this generation became unreachable"},
	causeMaxStreamBytes:    {name: cache.ReasonMaxStreamBytes, state: retryable, status: s502, typ: tUpstream, msg: "the upstream answer exceeded -max-stream-bytes", abort: "the stream exceeded the proxy's per-stream byte bound"},
	causeMaxEventBytes:     {name: "max_event_bytes", state: retryable, status: s502, typ: tUpstream, msg: "an upstream event exceeded -max-event-bytes", abort: "an upstream event exceeded the proxy's event size bound"},
	causeMaxStreamDuration: {name: "max_stream_duration", state: retryable, status: s504, typ: tTimeout, msg: "the upstream call exceeded -max-stream-duration", abort: "the stream exceeded the proxy's stream duration bound"},

	causeShutdown:       {name: cache.ReasonShutdown, state: retryable, status: s503, typ: "shutting_down", retry: 1, msg: "the proxy is shutting down", abort: "the proxy is shutting down"},
	causeClientGone:     {name: "client_gone", state: retryable, status: s502, typ: tUpstream, msg: "the client went away", abort: "the client went away"},
	causeGenerationLost: {name: cache.ReasonGenerationLost, state: unknown, status: s502, typ: tUpstream, msg: "the replica that ran this generation stopped; retry the request", abort: "the replica that ran this generation stopped; retry the request"},
	causeCancelled:      {name: "cancelled", state: cache.StateCancelled, status: s409, typ: "stream_cancelled", msg: "the key's generation was stopped by its tenant, and the key is held so that a repeat does not pay for another; DELETE /keys/{key} frees it", abort: "the generation was stopped by its tenant"},
	causeFenced:         {name: "fenced", state: unknown, status: s502, typ: tUpstream, msg: "another replica took this generation over; retry the request", abort: "another replica took this generation over"},

	causeUpstreamUnavailable: {name: "upstream_unavailable", state: retryable, status: s503, typ: "upstream_unavailable", retry: 1, msg: "every upstream has a circuit open for this model or its host after repeated failures", fallback: true},
	causeConnectError:        {name: "connect_error", verdict: upstream.Safe, state: retryable, status: s502, typ: tUpstream, msg: "the upstream failed before answering (connect_error)", fallback: true},
	causeStaleConnection:     {name: "stale_connection", verdict: upstream.Safe, state: retryable, status: s502, typ: tUpstream, msg: "the upstream failed before answering (stale_connection)", fallback: true},
	causeUpstreamTimeout:     {name: "upstream_timeout", verdict: upstream.Ambiguous, state: unknown, status: s504, typ: tTimeout, msg: "the upstream took the request and did not answer within -head-timeout (a streaming request) or -attempt-timeout (any other)" + notSentAgain},
	causeUpstreamReset:       {name: "upstream_reset", verdict: upstream.Ambiguous, state: unknown, status: s502, typ: tUpstream, msg: "the upstream connection failed after the request was sent (upstream_reset)" + notSentAgain + ": a repeat could be a second paid generation"},

	causeUpstreamRefused:     {name: "upstream_refused", state: terminal, status: s502, typ: tUpstream, msg: "the upstream's error answer could not be read whole", byStatus: true},
	causeUpstreamFailed:      {name: "upstream_failed", state: retryable, status: s502, typ: tUpstream, msg: "the upstream's error answer could not be read whole", fallback: true, byStatus: true},
	causeNotAnEventStream:    {name: "not_an_event_stream", verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: notAStream},
	causeErrorBody:           {name: "error_body", state: retryable, status: s502, typ: tUpstream, msg: "the upstream answered 2xx with an error object"},
	causeUnframedBody:        {name: "unframed_body", state: retryable, status: s502, typ: tUpstream, msg: "the upstream answer ended where its connection closed and is not the whole JSON its Content-Type says" + notSentAgain},
	causeUpstreamIdleTimeout: {name: "upstream_idle_timeout", verdict: upstream.Ambiguous, state: unknown, status: s504, typ: tTimeout, msg: "the upstream answered a head and then nothing within -upstream-idle-timeout (or its answer stopped before its end, silent past it or -attempt-timeout)" + notSentAgain, abort: "the upstream went silent"},
	causeHealRefused:         {name: "heal_refused", verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: "the upstream connection failed mid-stream and the upstream refused to resume the stream", abort: "the upstream connection failed mid-stream, and the upstream refused to resume it"},
	causeUpstreamAborted:     {name: "upstream_aborted", state: unknown, status: s502, typ: tUpstream, msg: "the upstream (an ssegate) ended its stream with stream_aborted before any other event" + notSentAgain, abort: "the upstream ended its stream with stream_aborted"},
	causeUpstreamReadError:   {name: "upstream_read_error", verdict: upstream.Ambiguous, state: unknown, status: s502, typ: tUpstream, msg: "the upstream connection failed after the request was sent (upstream_read_error)" + notSentAgain + ": a repeat could be a second paid generation", abort: "the upstream connection failed mid-stream"},

	causeErrorEvent:          {name: sse.ReasonErrorEvent, verdict: upstream.Safe, state: retryable, status: s502, typ: tUpstream, msg: "the upstream failed before answering (error_event)", abort: "the upstream sent an error event", relayEnd: true, fallback: true},
	causeMalformedEvent:      {name: sse.ReasonMalformedEvent, verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: notAStream, abort: "an upstream event was not the whole JSON object its dialect sends"},
	causeUnknownDialect:      {name: sse.ReasonUnknownDialect, verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: notAStream, abort: "the upstream stream is of no dialect the proxy knows", relayEnd: true},
	causeNoTerminalEvent:     {name: sse.ReasonNoTerminalEvent, verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: notAStream, abort: "the upstream stream ended before its last event"},
	causeUnexpectedChoice:    {name: sse.ReasonUnexpectedChoice, verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: notAStream, abort: "the upstream stream has a choice the request did not ask for", relayEnd: true},
	causeNoChoices:           {name: sse.ReasonNoChoices, verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: notAStream, abort: "the upstream stream ended without a choice"},
	causeMissingChoice:       {name: sse.ReasonMissingChoice, verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: notAStream, abort: "the upstream stream ended without every choice the request asked for"},
	causeMissingFinishReason: {name: sse.ReasonMissingFinishReason, verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: notAStream, abort: "the upstream stream ended with a choice unfinished"},
	causeMissingUsage:        {name: sse.ReasonMissingUsage, verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: notAStream, abort: "the upstream stream ended without the usage the request asked for", relayEnd: true},
	causeResponseFailed:      {name: sse.ReasonResponseFailed, verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: notAStream, abort: "the upstream response failed", relayEnd: true},
	causeSequenceGap:         {name: sse.ReasonSequenceGap, verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: notAStream, abort: "the upstream stream skipped events"},
	causeMissingStopReason:   {name: sse.ReasonMissingStopReason, verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: notAStream, abort: "the upstream message ended without a stop reason", relayEnd: true},
	causeUncleanEnd:          {name: cache.ReasonUncleanEnd, verdict: upstream.Ambiguous, state: retryable, status: s502, typ: tUpstream, msg: notAStream, abort: "the upstream stream did not end cleanly"},

	causeWSMaxConns:     {name: "max_ws_connections", refusal: decisionRefused, status: s503, typ: tCapacity, retry: 1, msg: "the bound on Responses WebSocket connections (-ws-max-conns) is reached"},
	causeWSMaxTurns:     {name: "max_turns", status: s503, typ: tCapacity, msg: "this connection sent -ws-max-turns turns: open a new one"},
	causeWSBinaryFrame:  {name: "invalid_frame", status: s400, typ: tInvalid, msg: "binary frames are not accepted: send JSON text frames"},
	causeWSNotJSON:      {name: "invalid_json", status: s400, typ: tInvalid, msg: "the frame is not a JSON object"},
	causeWSUnknownFrame: {name: "unknown_frame_type", status: s400, typ: tInvalid, msg: "only response.create frames are accepted"},
	causeWSEmptyCreate:  {name: "empty_create", status: s400, typ: tInvalid, msg: "response.create has no body"},
	causeWSUpstreamGone: {name: "upstream_socket_closed", status: s502, typ: tUpstream, msg: "the upstream WebSocket of this connection is closed"},
}

// byName finds a cause by its name: the ledger and the flights hold names,
// and a store may report a cause of its own (cache.Reasons).
var byName = func() map[string]cause {
	m := make(map[string]cause, numCauses)
	for c := causeNone + 1; c < numCauses; c++ {
		m[causes[c].name] = c
	}
	return m
}()

// causeOf returns the cause a flight or the ledger names reason:
// upstream_status_N for the upstream's own error answers, and
// causeUncleanEnd for a name this proxy does not know.
func causeOf(reason string) cause {
	if c, ok := byName[reason]; ok {
		return c
	}
	if s, ok := strings.CutPrefix(reason, "upstream_status_"); ok {
		if n, err := strconv.Atoi(s); err == nil {
			return upstreamStatus(n)
		}
	}
	return causeUncleanEnd
}

// upstreamStatus is the cause of an upstream's error answer with status.
func upstreamStatus(status int) cause {
	if status >= 400 && status < 500 && status != fasthttp.StatusTooManyRequests {
		return causeUpstreamRefused
	}
	return causeUpstreamFailed
}

func (c cause) String() string { return causes[c].name }

// reason is the name a flight and the ledger record for c; an upstream's
// error answer is named with its status.
func (c cause) reason(status int) string {
	if causes[c].byStatus {
		return "upstream_status_" + strconv.Itoa(status)
	}
	return causes[c].name
}

// err is the answer of c before the first byte: the table's message,
// followed by detail when the caller knows more of what happened.
func (c cause) err(detail string) *apiError {
	r := &causes[c]
	msg := r.msg
	if detail != "" {
		msg += ": " + detail
	}
	return &apiError{cause: c, status: r.status, typ: r.typ, message: msg, retryAfter: r.retry}
}

// abortMessage is the stream_aborted message of c after the first byte.
func (c cause) abortMessage() string {
	if m := causes[c].abort; m != "" {
		return m
	}
	return causes[causeUncleanEnd].abort + " (" + causes[c].name + ")"
}

// relayEnd reports whether a stream found unclean for reason ended as the
// provider stated it: relayed to its terminal event, with no stream_aborted
// after it (causeRow.relayEnd).
func relayEnd(reason string) bool { return causes[causeOf(reason)].relayEnd }

// endFrame is what ends a stream whose flight ended in state for reason:
// nothing after a committed one or one the provider ended itself
// (relayEnd), the stream_aborted event otherwise.
func endFrame(state cache.State, reason string) []byte {
	if state == cache.StateCommitted || relayEnd(reason) {
		return nil
	}
	return abortFrame(reason)
}

// failedAnswer is the answer to a client whose flight ended with no
// answer to relay (state, reason): no head came, or the head of an answer
// that is not an event stream and whose body could not be read whole. A
// flight that ended commit_unknown gets the outcome-unknown answer
// (unknownErr), whatever ended it.
func failedAnswer(state cache.State, reason string) *apiError {
	c := causeOf(reason)
	if state == cache.StateCommitUnknown || c.sentUnknown() {
		return c.unknownErr()
	}
	return c.err("")
}

// sentUnknown reports whether a flight that failed for c before any byte
// reached its clients had its request written upstream, with no word from
// the upstream that it did not run it: a failure the proxy does not repeat
// (an ambiguous verdict: a timeout, a reset, an answer that is no valid
// stream), or an answer the proxy cut or could not take whole (its bounds,
// a body cut where its connection closed). The upstream may have run the
// request, and billed it, even where the key is left free
// (failed_retryable): a repeat by a client or an ssegate in front must be
// a decision, not an automatic retry, so the answer carries the marker.
func (c cause) sentUnknown() bool {
	switch c {
	case causeUnframedBody, causeMaxStreamBytes, causeMaxEventBytes, causeMaxStreamDuration, causeUpstreamAborted:
		return true
	}
	return causes[c].verdict == upstream.Ambiguous
}

// unknownErr is the answer of c once the request was sent upstream and
// no answer can be known (the key is left commit_unknown): 504
// upstream_timeout where the cause is a timeout, 502 upstream_error
// otherwise, marked with outcomeHeader and without Retry-After, whatever
// the cause's own answer before any call would be (503 store_unavailable,
// shutting_down, upstream_unavailable): those say "try again", and a
// repeat could be a second paid generation.
func (c cause) unknownErr() *apiError {
	e := c.err("")
	if e.status != s504 {
		e.status, e.typ = s502, tUpstream
	} else {
		e.typ = tTimeout
	}
	if !strings.Contains(e.message, "outcome is unknown") {
		e.message += "; the request was sent upstream" + notSentAgain
	}
	e.retryAfter, e.unknown = 0, true
	return e
}

// wsFrame is e as a Responses WebSocket answers it on lane (none: ""):
// an error event, {"type":"error","error":{"type","code","message"}},
// whose code is the cause's name, or commit_unknown when the turn was
// sent upstream and its outcome is unknown.
func (e *apiError) wsFrame(lane string) []byte {
	code := causes[e.cause].name
	if e.unknown {
		code = string(cache.StateCommitUnknown)
	}
	b := []byte(`{"type":"error"`)
	if lane != "" {
		b = append(b, `,"stream_id":`...)
		b = append(b, jsonQuote(lane)...)
	}
	b = append(b, `,"error":{"type":`...)
	b = append(b, jsonQuote(e.typ)...)
	b = append(b, `,"code":`...)
	b = append(b, jsonQuote(code)...)
	b = append(b, `,"message":`...)
	b = append(b, jsonQuote(e.message)...)
	return append(b, "}}"...)
}

// abortFrame is the event that ends a stream whose flight ended
// uncommitted for reason.
func abortFrame(reason string) []byte {
	return sse.AppendEvent(nil, sse.ID{}, "error", abortEvent(reason, causeOf(reason).abortMessage()))
}

// A decision is what the proxy made of a request: the decision log's
// "decision" and the label of ssegate_requests_total. Its row in decisions
// is everything the log and the metrics know of it; adding one is a
// constant, a row, and its line in docs/metrics.md (TestDecisionsDocumented).
type decision uint8

const (
	decisionNone decision = iota // not counted (causeRow.refusal)
	decisionMiss
	decisionHit
	decisionJoin
	decisionResume
	decisionHead
	decisionConflict
	decisionInFlight
	decisionGone
	decisionInvalid
	decisionRefused
	decisionDenied
	decisionRelay
	decisionUnprotected
	decisionUnknown
	decisionCancelled

	numDecisions
)

type decisionRow struct {
	label string
	note  string // what the label does not say, for the metric's help
	// suppressed: answered without a new upstream generation, and so
	// counted by ssegate_duplicates_suppressed_total too.
	suppressed bool
}

// decisions is the table of decisions.
var decisions = [numDecisions]decisionRow{
	decisionMiss:        {label: "miss"},
	decisionHit:         {label: "hit", suppressed: true},
	decisionJoin:        {label: "join", suppressed: true},
	decisionResume:      {label: "resume", suppressed: true},
	decisionHead:        {label: "head", note: "HEAD of a stream"},
	decisionConflict:    {label: "conflict"},
	decisionInFlight:    {label: "in_flight"},
	decisionGone:        {label: "gone"},
	decisionInvalid:     {label: "invalid"},
	decisionRefused:     {label: "refused", note: "a bound"},
	decisionDenied:      {label: "denied", note: "no credential under -anonymous-keys deny"},
	decisionRelay:       {label: "relay", note: "no key"},
	decisionUnprotected: {label: "unprotected", note: "keyed, relayed while Redis is down under -redis-down relay"},
	decisionUnknown:     {label: "unknown", note: "a tool call whose outcome is unknown, not run again", suppressed: true},
	decisionCancelled:   {label: "cancelled", note: "a key its tenant stopped, not run again", suppressed: true},
}

func (d decision) String() string { return decisions[d].label }

// apiError is an error answered to the client as JSON before any byte of
// a stream went out: its cause's row (causes.go) with a message.
type apiError struct {
	cause      cause
	status     int
	typ        string
	message    string
	retryAfter int // seconds; 0 for none
	// unknown: the request went upstream and its outcome is unknown; the
	// answer carries outcomeHeader and never Retry-After.
	unknown bool
}

func (e *apiError) Error() string { return e.typ + ": " + e.message }

type errorBody struct {
	Error errorFields `json:"error"`
}

type errorFields struct {
	Type    string `json:"type"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
}

// abortEvent is the data of the event that ends an aborted stream.
func abortEvent(code, message string) string {
	b, _ := json.Marshal(errorBody{Error: errorFields{Type: "stream_aborted", Code: code, Message: message}})
	return string(b)
}
