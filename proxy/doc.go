// Package proxy is ssegate's fasthttp handler: it takes the idempotency
// decision for each request, calls the upstream, relays Server-Sent-Event
// streams event by event while a cache.Flight records them, and serves
// replays and resumes.
//
// A keyed generation runs in its own goroutine, not in the handler of the
// request that started it: the client that caused it is only its first
// subscriber, so a client that goes away does not stop it, and joiners and
// resumers read the same journal.
package proxy
