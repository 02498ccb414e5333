// Package proxy is ssegate's fasthttp handler: it takes the idempotency
// decision for each request, calls the upstream, relays Server-Sent-Event
// streams event by event while a cache.Flight records them, and serves
// replays and resumes.
//
// A keyed generation runs in its own goroutine, not in the handler of the
// request that started it: the client that caused it is only its first
// subscriber, so a client that goes away does not stop it, and joiners and
// resumers read the same journal.
//
// One engine serves every kind of call: a model's generation, a keyed MCP
// tool call and the raw relay of an MCP path's messages differ only in
// their kind (kind.go: what a head, an event and a whole body mean, and
// the state a failed end leaves). Each is made by one attempt loop
// (gen.run, gen.attempts: route, retries within every bound, the retry
// budget, fallback), its stream read by one event loop (pump), a whole
// body recorded by one recorder (gen.settle), and its clients answered by
// one delivery (deliver for streams, with a per-client rewrite for tool
// callers; answerEnded for whole answers).
package proxy
