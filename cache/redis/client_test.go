package redis

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// TestRedialSaysAFailureOnce: a store waiting for Redis hears why it
// cannot connect, once per distinct reason, not once per attempt.
func TestRedialSaysAFailureOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: every dial is refused
	s := newSwapClient(nil)
	ctx, cancel := context.WithCancel(context.Background())
	var failures atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		opt := rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true}
		s.redial(ctx, opt, 10*time.Millisecond, time.Second, func(error) { failures.Add(1) }, func() { t.Error("connected to nothing") })
	}()
	time.Sleep(300 * time.Millisecond) // tens of attempts
	cancel()
	<-done
	if n := failures.Load(); n != 1 {
		t.Errorf("%d failures said for one refused address; want 1", n)
	}
}
