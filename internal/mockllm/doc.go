// Package mockllm is a mock LLM upstream that speaks the three wire dialects
// ssegate relays: OpenAI Chat Completions (POST /v1/chat/completions),
// Anthropic Messages (POST /v1/messages) and OpenAI Responses
// (POST /v1/responses), streaming (SSE) and not, plus GET /v1/models.
//
// It exists so that `ssegate -upstream mock` runs with no API key, so that the
// proxy's tests have a real HTTP upstream whose calls they can count
// (Server.Calls), and so that the benchmark suite has an upstream fast enough
// not to be what it measures.
//
// Output is deterministic: the content, ids and timestamps are derived from a
// hash of the request body, never from the clock, so the same body always
// gives byte-identical output and a test can compare a replay with the
// original byte for byte. Event shapes follow streams recorded from the real
// providers.
//
// Request headers shape a single answer without restarting the server:
//
//	X-Mock-Tokens: N          content tokens (1..100000)
//	X-Mock-Delay: 10ms        pause before each event (Go duration, at most 10s)
//	X-Mock-Chunk-Bytes: N     pad each content delta so its event is about N bytes
//	X-Mock-Fault: F           one fault, F being one of
//	    status=CODE      answer CODE (400..599) with the provider's error body
//	    reset-after=N    send N events, then reset the TCP connection
//	    eof-after=N      send N events, then end the body without the terminal event
//	    error-after=N    send N events, then the dialect's in-stream error
//	    hang             send nothing until the client leaves (bounded)
//	    hang-after=N     send N events, then stall until the client leaves (bounded)
//
// A fault after N events always fires before the terminal event ([DONE],
// message_stop, response.completed), even when N is larger than the stream,
// so that the fault is always observable. On a non-streaming request,
// reset-after resets and eof-after closes the connection before any answer,
// error-after is a 500, and hang-after hangs. An invalid header, like a
// malformed JSON body, is a 400.
//
// The request's token cap (max_tokens or max_completion_tokens, max_tokens,
// max_output_tokens) ends the answer the provider's way: finish_reason
// "length", stop_reason "max_tokens", or response.incomplete with
// incomplete_details.reason "max_output_tokens".
//
// Server.Calls counts every POST to a model endpoint, whatever becomes of
// it, so a test can assert how many generations reached the upstream;
// Server.Generations counts those that began an answer.
//
// A Responses request with "background": true and "stream": true is kept
// (bounded in number and time), as OpenAI keeps it: GET
// /v1/responses/{id}?stream=true&starting_after=N streams its events with
// a sequence_number above N to the end, the same events the first stream
// had, and counts as a resume (Server.Resumes), not a call. An X-Mock-Fault
// that fires after N events fires at that event of the response: a
// resume from past it runs to the end. An unknown id is a 404, and a
// Responses stream that was not a background one a 400, in OpenAI's
// error shape.
package mockllm
