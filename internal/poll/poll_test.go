package poll

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestUntil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		go func() {
			time.Sleep(100 * time.Millisecond)
			n.Store(1)
		}()
		start := time.Now()
		if !Until(time.Second, func() bool { return n.Load() == 1 }) {
			t.Fatal("Until: got false; want true, the condition held after 100ms")
		}
		if took := time.Since(start); took > 100*time.Millisecond+maxPause {
			t.Errorf("Until returned %v after the start; want within %v of the condition", took, maxPause)
		}
		start = time.Now()
		if Until(time.Second, func() bool { return false }) {
			t.Fatal("Until of a condition that never holds: got true; want false")
		}
		if took := time.Since(start); took < time.Second || took > time.Second+maxPause {
			t.Errorf("Until gave up after %v; want %v", took, time.Second)
		}
	})
}
