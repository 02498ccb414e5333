package redis

import (
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"github.com/ssegate/ssegate/cache/internal/wiretest"
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
