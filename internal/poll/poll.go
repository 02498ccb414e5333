// Package poll lets a test wait for what another goroutine or process is
// to bring about. A test that sleeps instead guesses how long that takes:
// it is slow when the guess is long, and fails on a loaded machine when
// the guess is short.
package poll

import (
	"testing"
	"time"
)

// maxPause bounds the pause between two looks at a condition.
const maxPause = 20 * time.Millisecond

// Until calls cond until it holds, and reports whether it held within d.
// It looks again after a millisecond, then less and less often, up to
// every maxPause, so that a condition that soon holds costs little time
// and one that costs a request is not asked in a tight loop.
func Until(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for pause := time.Millisecond; !cond(); pause = min(2*pause, maxPause) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
	}
	return true
}

// For fails tb unless cond holds within d; what says what it waits for.
func For(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Until(d, cond) {
		tb.Fatalf("%s: not within %v", what, d)
	}
}
