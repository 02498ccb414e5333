package redis

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// Bounds of one read of tailReader: the journals it reads at once (a
// key and an id each in the call) and the entries of each.
const (
	maxTailKeys    = 4096
	maxTailEntries = 256
)

// maxTailBatch bounds Config.TailBatch: the wait it adds to a follower's
// events.
const maxTailBatch = time.Second

// errTailIdle is readTail's answer when the journal gave nothing within
// the tail's idle interval.
var errTailIdle = errors.New("journal idle")

// tailReader reads the journals a replica follows on a standalone Redis
// with one XREAD over those that have news, at most one call per
// Config.TailBatch: a followed event costs Redis a share of a call
// rather than a blocking XREAD, a wake-up and a round trip of its own.
// It learns which have news from the writes themselves: every script that
// adds to a journal (an append, a finish, a reap, an abandon) PUBLISHes
// on the journal's name, and the reader holds a connection of its own
// subscribed to the journals its tails wait for. A journal is read when a
// notification came since its last read, when it was just subscribed to
// (what came before is read once), and every tailFullEvery all of them
// are, whatever came: a notification lost with its connection (the reader
// then subscribes again on a new one) costs a follower that long at most.
// Without the subscription (it failed) every read covers all of them, as
// a poll. A tail waits for the call after the one in flight when it asks,
// so the batching adds at most TailBatch and a round trip to a follower's
// events. On a Cluster, where the journals are in different slots, each
// tail reads its own.
type tailReader struct {
	mu      sync.Mutex // guards waiting, running, dirty and subs
	waiting map[*tailReq]struct{}
	running bool // readTails runs; it stops once nothing waits

	dirty map[string]struct{}  // journals notified since their last read
	subs  map[string]time.Time // journals subscribed to, and when last waited for
	wake  chan struct{}        // capacity 1: a notification, or a tail that waits
}

// tailFullEvery is how often the shared read covers every journal waited
// for, notified or not; tailUnsubscribeAfter how long a journal nobody
// waits for stays subscribed (a tail between two reads, or one that went
// idle to check its owner, comes back).
const (
	tailFullEvery        = 250 * time.Millisecond
	tailUnsubscribeAfter = 2 * time.Second
)

// tailReq is one tail's read: the entries of key after last. The reader
// answers on done, once, after removing it from waiting; a tail that
// stops waiting removes it itself, and is then not answered.
type tailReq struct {
	key, last string
	done      chan tailAnswer // capacity 1
}

type tailAnswer struct {
	entries []rueidis.XRangeEntry
	err     error
}

// readTail returns the entries of journal key after id last, waiting for
// them up to the tail's idle interval: errTailIdle when none came.
func (r *Store) readTail(key, last string) ([]rueidis.XRangeEntry, error) {
	if !r.sharedKeys() || r.cfg.TailBatch < 0 {
		ctx, cancel := context.WithTimeout(r.ctx, r.idle+r.cfg.Timeout)
		defer cancel()
		r.reads.Add(1)
		m, err := r.c.Do(ctx, r.c.B().Xread().Count(maxTailEntries).Block(r.idle.Milliseconds()).
			Streams().Key(key).Id(last).Build()).AsXRead()
		if rueidis.IsRedisNil(err) {
			return nil, errTailIdle
		}
		return m[key], err
	}
	t := &r.tailr
	q := &tailReq{key: key, last: last, done: make(chan tailAnswer, 1)}
	t.mu.Lock()
	if t.waiting == nil {
		t.waiting = map[*tailReq]struct{}{}
	}
	t.waiting[q] = struct{}{}
	if !t.running {
		t.running = true
		if t.wake == nil {
			t.wake = make(chan struct{}, 1)
		}
		r.wg.Add(1)
		go r.readTails()
	}
	t.mu.Unlock()
	t.poke()
	idle := time.NewTimer(r.idle)
	defer idle.Stop()
	select {
	case a := <-q.done:
		return a.entries, a.err
	case <-idle.C:
	case <-r.ctx.Done():
	}
	t.mu.Lock()
	_, waits := t.waiting[q]
	delete(t.waiting, q)
	t.mu.Unlock()
	if !waits { // answered meanwhile
		a := <-q.done
		return a.entries, a.err
	}
	if err := r.ctx.Err(); err != nil {
		return nil, err
	}
	return nil, errTailIdle
}

// poke wakes readTails.
func (t *tailReader) poke() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// readTails reads the journals the tails wait for, one XREAD over those
// with news (all of them every tailFullEvery; up to maxTailKeys; one read
// per journal a call), at most one call per TailBatch, until no tail
// waits.
func (r *Store) readTails() {
	defer r.wg.Done()
	t := &r.tailr
	var sent, full time.Time
	waited := time.Now() // when a tail last waited
	sub := &tailSub{}
	defer sub.close()
	for {
		// At most one call per TailBatch: what is notified meanwhile
		// waits for the next, and so does the work of choosing it.
		if wait := r.cfg.TailBatch - time.Since(sent); wait > 0 {
			select {
			case <-r.ctx.Done():
			case <-time.After(wait):
			}
		}
		t.mu.Lock()
		if len(t.waiting) == 0 || r.ctx.Err() != nil {
			// Nobody waits: the reader lingers tailUnsubscribeAfter with
			// its subscription, for the tails between two reads (a lone
			// follower's, at each event) and those checking their owner.
			if r.ctx.Err() == nil && time.Since(waited) < tailUnsubscribeAfter {
				t.mu.Unlock()
				linger := time.NewTimer(tailUnsubscribeAfter - time.Since(waited))
				select {
				case <-r.ctx.Done():
				case <-t.wake:
				case <-linger.C:
				}
				linger.Stop()
				continue
			}
			t.running = false
			t.dirty, t.subs = nil, nil
			t.mu.Unlock()
			return
		}
		waited = time.Now()
		byKey := make(map[string]*tailReq, min(len(t.waiting), maxTailKeys))
		var dups []string // journals more than one tail waits for
		for q := range t.waiting {
			if len(byKey) == maxTailKeys {
				break
			}
			if _, dup := byKey[q.key]; !dup {
				byKey[q.key] = q
			} else {
				dups = append(dups, q.key)
			}
		}
		now := time.Now()
		if t.subs == nil {
			t.subs, t.dirty = map[string]time.Time{}, map[string]struct{}{}
		}
		var fresh []string // waited for, not subscribed to yet
		for k := range byKey {
			if _, ok := t.subs[k]; !ok {
				fresh = append(fresh, k)
			}
			t.subs[k] = now
		}
		var stale []string // subscribed to, not waited for lately
		if now.Sub(full) >= tailFullEvery {
			for k, at := range t.subs {
				if now.Sub(at) >= tailUnsubscribeAfter {
					stale = append(stale, k)
					delete(t.subs, k)
					delete(t.dirty, k)
				}
			}
		}
		t.mu.Unlock()
		if !sub.sync(r, fresh, stale) {
			// The subscription is gone (or never came): what it had is
			// subscribed again on a new connection, and read once.
			t.mu.Lock()
			t.subs = map[string]time.Time{}
			t.mu.Unlock()
		}
		// Which journals this call reads: those notified, all of them
		// when a full read is due or there is no subscription.
		pollAll := !sub.ok() || time.Since(full) >= tailFullEvery
		t.mu.Lock()
		var read map[string]*tailReq
		if pollAll {
			read = byKey
		} else {
			read = make(map[string]*tailReq)
			for k, q := range byKey {
				if _, news := t.dirty[k]; news {
					read[k] = q
				}
			}
		}
		t.mu.Unlock()
		if len(read) == 0 {
			wait := time.NewTimer(tailFullEvery - time.Since(full))
			select {
			case <-r.ctx.Done():
			case <-t.wake:
			case <-sub.lost:
			case <-wait.C:
			}
			wait.Stop()
			continue
		}
		sent = time.Now()
		if pollAll {
			full = sent
		}
		keys, ids := make([]string, 0, len(read)), make([]string, 0, len(read))
		t.mu.Lock()
		for k, q := range read {
			keys, ids = append(keys, k), append(ids, q.last)
			// Before the read: a notification of what lands after the
			// read's snapshot marks it again.
			delete(t.dirty, k)
		}
		t.mu.Unlock()
		var m map[string][]rueidis.XRangeEntry
		err := errClientChanged // the journals' slots differ on a Cluster (exec)
		if c, swapped := current(r.c); !swapped || fitsClient(c, keys) {
			ctx, cancel := context.WithTimeout(r.ctx, r.cfg.Timeout)
			r.reads.Add(1)
			m, err = c.Do(ctx, c.B().Xread().Count(maxTailEntries).
				Streams().Key(keys...).Id(ids...).Build()).AsXRead()
			cancel()
		}
		if rueidis.IsRedisNil(err) {
			continue
		}
		t.mu.Lock()
		// Another tail of a journal read for one of them reads it next.
		for _, k := range dups {
			if _, ok := read[k]; ok && t.dirty != nil {
				t.dirty[k] = struct{}{}
			}
		}
		for k, q := range read {
			if _, waits := t.waiting[q]; !waits {
				continue
			}
			if err != nil {
				delete(t.waiting, q)
				q.done <- tailAnswer{err: err}
			} else if es := m[k]; len(es) > 0 {
				delete(t.waiting, q)
				q.done <- tailAnswer{entries: es}
			}
		}
		t.mu.Unlock()
	}
}

// tailSub is readTails's subscription: a connection of its own on which
// the journals waited for are subscribed to; a message marks its journal
// dirty and wakes the reader.
type tailSub struct {
	c      rueidis.DedicatedClient
	cancel func()
	lost   <-chan error // closed when the connection ends; nil without one
	tried  time.Time    // when the last connection was made
}

func (s *tailSub) ok() bool { return s.c != nil }

func (s *tailSub) close() {
	if s.cancel != nil {
		s.cancel()
	}
	*s = tailSub{tried: s.tried}
}

// sync subscribes to fresh and unsubscribes from stale, making the
// connection first when there is none; it reports whether the
// subscription stands (false: it was lost or could not be made, and
// every journal must be subscribed to again).
func (s *tailSub) sync(r *Store, fresh, stale []string) bool {
	if s.c != nil {
		select {
		case <-s.lost:
			s.close()
		default:
		}
	}
	if s.c == nil {
		// A new connection: every journal is subscribed to on it, from
		// the caller's next round. One try per tailFullEvery, so that a
		// Redis that refuses it is not asked at every read.
		if time.Since(s.tried) < tailFullEvery {
			return false
		}
		s.tried = time.Now()
		c, swapped := current(r.c)
		if swapped && !r.sharedKeys() {
			return false
		}
		t := &r.tailr
		d, cancel := c.Dedicate()
		s.c, s.cancel = d, cancel
		s.lost = d.SetPubSubHooks(rueidis.PubSubHooks{OnMessage: func(m rueidis.PubSubMessage) {
			t.mu.Lock()
			if _, subscribed := t.subs[m.Channel]; subscribed {
				t.dirty[m.Channel] = struct{}{}
			}
			t.mu.Unlock()
			t.poke()
		}})
		return false
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.Timeout)
	defer cancel()
	if len(stale) > 0 {
		if err := s.c.Do(ctx, s.c.B().Unsubscribe().Channel(stale...).Build()).Error(); err != nil {
			s.close()
			return false
		}
	}
	if len(fresh) > 0 {
		if err := s.c.Do(ctx, s.c.B().Subscribe().Channel(fresh...).Build()).Error(); err != nil {
			s.close()
			return false
		}
		// What came before the subscription is read once.
		t := &r.tailr
		t.mu.Lock()
		for _, k := range fresh {
			t.dirty[k] = struct{}{}
		}
		t.mu.Unlock()
	}
	return true
}
