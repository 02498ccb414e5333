// Package upstream is ssegate's side of the calls to an LLM API: the
// client of each upstream and its connections (Conn), held to the time
// budgets of a streamed answer; the circuits that keep calls away from an
// upstream, or one of its models, while they fail (Breaker); and what a
// failed call allows (Verdict, RetryAfter, FullJitter, Budget).
//
// It decides nothing about a request: whether to call, retry, fail over or
// relay is package proxy's. Nothing here imports proxy.
package upstream
