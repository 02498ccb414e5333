package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// swapClient is the client of a store that started while Redis was
// unreachable. It starts as a single-node client (rueidis builds no other
// without an answer) and is replaced, once Redis answers, by the client
// rueidis picks from the server: a cluster client on a Redis Cluster,
// where the single-node one would get MOVED for most keys forever.
type swapClient struct {
	cur atomic.Pointer[rueidis.Client]

	mu     sync.Mutex // guards closed and old
	closed bool
	old    rueidis.Client // the replaced client until it is closed, after a grace period or at Close
}

func newSwapClient(c rueidis.Client) *swapClient {
	s := &swapClient{}
	s.cur.Store(&c)
	return s
}

func (s *swapClient) get() rueidis.Client { return *s.cur.Load() }

// redial tries rueidis.NewClient(opt) every interval until it succeeds or
// ctx ends, then swaps the new client in. The replaced one is closed
// after grace, so that operations already on it finish there. failed
// hears each failure whose message differs from the one before, so that
// a server that comes up refusing the client (a wrong password, say)
// is said once rather than never or every interval.
func (s *swapClient) redial(ctx context.Context, opt rueidis.ClientOption, interval, grace time.Duration, failed func(error), connected func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c, err := rueidis.NewClient(opt)
		if err != nil {
			if msg := err.Error(); msg != last {
				last = msg
				failed(err)
			}
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.old = s.get()
		s.cur.Store(&c)
		s.mu.Unlock()
		connected()
		time.AfterFunc(grace, s.closeOld)
		return
	}
}

// closeOld closes the replaced client, if it is not closed yet.
func (s *swapClient) closeOld() {
	s.mu.Lock()
	old := s.old
	s.old = nil
	s.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

func (s *swapClient) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.closeOld()
	s.get().Close()
}

func (s *swapClient) B() rueidis.Builder { return s.get().B() }
func (s *swapClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	return s.get().Do(ctx, cmd)
}
func (s *swapClient) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	return s.get().DoMulti(ctx, multi...)
}
func (s *swapClient) Receive(ctx context.Context, sub rueidis.Completed, fn func(rueidis.PubSubMessage)) error {
	return s.get().Receive(ctx, sub, fn)
}
func (s *swapClient) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	return s.get().DoCache(ctx, cmd, ttl)
}
func (s *swapClient) DoMultiCache(ctx context.Context, multi ...rueidis.CacheableTTL) []rueidis.RedisResult {
	return s.get().DoMultiCache(ctx, multi...)
}
func (s *swapClient) DoStream(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResultStream {
	return s.get().DoStream(ctx, cmd)
}
func (s *swapClient) DoMultiStream(ctx context.Context, multi ...rueidis.Completed) rueidis.MultiRedisResultStream {
	return s.get().DoMultiStream(ctx, multi...)
}
func (s *swapClient) Dedicated(fn func(rueidis.DedicatedClient) error) error {
	return s.get().Dedicated(fn)
}
func (s *swapClient) Dedicate() (rueidis.DedicatedClient, func()) { return s.get().Dedicate() }
func (s *swapClient) Nodes() map[string]rueidis.Client            { return s.get().Nodes() }
func (s *swapClient) Mode() rueidis.ClientMode                    { return s.get().Mode() }
