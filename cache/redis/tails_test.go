package redis

import (
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"github.com/ssegate/ssegate/cache/internal/wiretest"
	"github.com/ssegate/ssegate/internal/redistest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRedisTailsShareReads: a replica following many streams reads them
// together, one XREAD for all of them per -redis-tail-batch, not one per
// event per stream; each follower still gets every event of its stream,
// in order, and the committed end. With TailBatch negative (as on a
// Cluster) each tail reads its own: an XREAD per event or so.
func TestRedisTailsShareReads(t *testing.T) {
	t.Parallel()
	const streams, events, pace = 16, 40, 10 * time.Millisecond
	for _, c := range []struct {
		name  string
		batch time.Duration
		// the bound on the follower's XREADs over all events
		max  func(all int) bool
		want string
	}{
		{"shared", 20 * time.Millisecond, func(r int) bool { return r <= streams*events/4 }, "at most a quarter of the events"},
		{"own", -1, func(r int) bool { return r >= streams*events/2 }, "about one per event"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rs := replicas(t, 1)
			// The follower's replica, with the batch under test.
			fr := newRedis(t, rs[0].cfg.URL[len("redis://"):], rs[0].cfg.Prefix, func(cfg *Config) { cfg.TailBatch = c.batch })
			var wg sync.WaitGroup
			for i := range streams {
				sc := cache.Scope{Tenant: "t", Key: "k" + strconv.Itoa(i)}
				owner := rbegin(t, rs[0], sc, "fp").Flight
				storetest.StartStream(t, owner)
				storetest.AppendN(t, owner, 1, 1)
				b := rbegin(t, fr, sc, "fp")
				if b.Decision != cache.Join || b.Flight == nil {
					t.Fatalf("%s: decision %v; want a join", sc.Key, b.Decision)
				}
				s, err := b.Flight.Subscribe(0)
				if err != nil {
					t.Fatal(err)
				}
				wg.Go(func() {
					for seq := 2; seq <= events; seq++ {
						time.Sleep(pace)
						storetest.AppendN(t, owner, seq, 1)
					}
					if !owner.Commit(nil) {
						t.Errorf("%s: Commit: got false; want true", sc.Key)
					}
				})
				wg.Go(func() {
					defer s.Close()
					got, ended := wiretest.Follow(s, 5*time.Second)
					if !ended {
						t.Errorf("%s: the follower's stream did not end", sc.Key)
					}
					wiretest.CheckSeq(t, wiretest.ParseWire(t, got), owner.Gen, 0, uint64(events))
					if st := waitDone(t, b.Flight, 5*time.Second); st != cache.StateCommitted {
						t.Errorf("%s: the follower's flight ended %s; want committed", sc.Key, st)
					}
				})
			}
			wg.Wait()
			reads := int(fr.Stats().Reads)
			t.Logf("%d XREADs for %d streams of %d events", reads, streams, events)
			if !c.max(reads) {
				t.Errorf("the follower's XREADs: got %d for %d streams of %d events; want %s", reads, streams, events, c.want)
			}
		})
	}
}

// TestRedisTailBatchBound: a tail batch past its bound is refused at
// New, not left to hold every follower's events that long.
func TestRedisTailBatchBound(t *testing.T) {
	t.Parallel()
	_, err := New(Config{URL: "redis://127.0.0.1:1", TailBatch: maxTailBatch + time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "tail batch") {
		t.Fatalf("New with a tail batch of %v: got error %v; want one naming the tail batch", maxTailBatch+time.Millisecond, err)
	}
}

// followOne starts a stream on owner's replica with its first event and
// joins it from fr: the owner's flight and the follower's subscription.
func followOne(t *testing.T, owner, fr *Store, key string) (*cache.Flight, *cache.Sub) {
	t.Helper()
	sc := cache.Scope{Tenant: "t", Key: key}
	f := rbegin(t, owner, sc, "fp").Flight
	storetest.StartStream(t, f)
	storetest.AppendN(t, f, 1, 1)
	b := rbegin(t, fr, sc, "fp")
	if b.Decision != cache.Join || b.Flight == nil {
		t.Fatalf("%s: decision %v; want a join", key, b.Decision)
	}
	s, err := b.Flight.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return f, s
}

// TestRedisTailsReadNotified: the shared read learns of a followed
// journal's news from the append's notification, so a follower gets an
// event within the batch and a round trip of its append, though the read
// covers every journal only every tailFullEvery (250 ms): the median delay
// of an event that comes every 30 ms, beside 20 silent followed streams,
// is well under what reading all of them every 250 ms would give (about
// 125 ms).
func TestRedisTailsReadNotified(t *testing.T) {
	t.Parallel()
	const events, pace = 30, 30 * time.Millisecond
	rs := replicas(t, 1)
	fr := newRedis(t, rs[0].cfg.URL[len("redis://"):], rs[0].cfg.Prefix, func(cfg *Config) { cfg.TailBatch = 5 * time.Millisecond })
	for i := range 20 {
		followOne(t, rs[0], fr, "silent"+strconv.Itoa(i))
	}
	f, s := followOne(t, rs[0], fr, "active")
	var mu sync.Mutex
	appended := make([]time.Time, events+1)
	go func() {
		for seq := 2; seq <= events; seq++ {
			time.Sleep(pace)
			mu.Lock()
			appended[seq] = time.Now()
			mu.Unlock()
			storetest.AppendN(t, f, seq, 1)
		}
		f.Commit(nil)
	}()
	var delays []time.Duration
	seen := 0
	deadline := time.After(10 * time.Second)
	for seen < events {
		select {
		case <-s.C():
		case <-deadline:
			t.Fatalf("the follower got %d events of %d", seen, events)
		}
		for {
			p, end := s.Read()
			now := time.Now()
			for range strings.Count(string(p), "\n\n") {
				seen++
				if seen >= 2 {
					mu.Lock()
					delays = append(delays, now.Sub(appended[seen]))
					mu.Unlock()
				}
			}
			if end || len(p) == 0 {
				break
			}
		}
	}
	slices.Sort(delays)
	p50 := delays[len(delays)/2]
	t.Logf("delay of a followed event: p50 %v, max %v", p50, delays[len(delays)-1])
	if p50 > 60*time.Millisecond {
		t.Errorf("median delay of a followed event %v; want under 60ms (notified reads)", p50)
	}
}

// TestRedisTailsSubscriptionLost: when the reader's subscription
// connection is cut (CLIENT KILL TYPE pubsub), followers lose nothing:
// the reader reads every journal until it has subscribed again on a new
// connection, and each follower gets its whole stream and its end.
func TestRedisTailsSubscriptionLost(t *testing.T) {
	t.Parallel()
	const events = 40
	rs := replicas(t, 1)
	addr := rs[0].cfg.URL[len("redis://"):]
	fr := newRedis(t, addr, rs[0].cfg.Prefix, nil)
	type pair struct {
		f *cache.Flight
		s *cache.Sub
	}
	var ps []pair
	for i := range 4 {
		f, s := followOne(t, rs[0], fr, "k"+strconv.Itoa(i))
		ps = append(ps, pair{f, s})
	}
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() {
			for seq := 2; seq <= events; seq++ {
				time.Sleep(10 * time.Millisecond)
				storetest.AppendN(t, p.f, seq, 1)
			}
			if !p.f.Commit(nil) {
				t.Error("Commit: got false")
			}
		})
		wg.Go(func() {
			got, ended := wiretest.Follow(p.s, 5*time.Second)
			if !ended {
				t.Error("a follower's stream did not end")
			}
			wiretest.CheckSeq(t, wiretest.ParseWire(t, got), p.f.Gen, 0, events)
		})
	}
	for range 3 {
		time.Sleep(100 * time.Millisecond)
		if _, err := redistest.Command(addr, time.Second, "CLIENT", "KILL", "TYPE", "pubsub"); err != nil {
			t.Fatalf("CLIENT KILL: %v", err)
		}
	}
	wg.Wait()
}

// TestRedisTailsNoChannelRights: a Redis user with the keys of the prefix
// but no channels (Redis 7's default for a new user: resetchannels)
// cannot PUBLISH or SUBSCRIBE: a journal's notification is refused, not
// its write, and the follower reads it without one. The owner commits
// and the follower gets the whole stream and its end.
func TestRedisTailsNoChannelRights(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	if _, err := redistest.Command(srv.Addr, time.Second, "ACL", "SETUSER", "keysonly", "on", ">pw", "resetchannels", "~acl:*", "+@all"); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	as := func(c *Config) { c.URL = "redis://keysonly:pw@" + srv.Addr }
	owner, fr := newRedis(t, srv.Addr, "acl", as), newRedis(t, srv.Addr, "acl", as)
	f, s := followOne(t, owner, fr, "k")
	const events = 20
	go func() {
		for seq := 2; seq <= events; seq++ {
			time.Sleep(10 * time.Millisecond)
			storetest.AppendN(t, f, seq, 1)
		}
		if !f.Commit(nil) {
			t.Error("Commit: got false; want true")
		}
	}()
	got, ended := wiretest.Follow(s, 5*time.Second)
	if !ended {
		t.Fatal("the follower's stream did not end")
	}
	wiretest.CheckSeq(t, wiretest.ParseWire(t, got), f.Gen, 0, events)
}
