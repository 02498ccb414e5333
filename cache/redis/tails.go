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
// with one XREAD over all of them, at most one call per
// Config.TailBatch: a followed event costs Redis a share of a call
// rather than a blocking XREAD, a wake-up and a round trip of its own.
// A tail waits for the call after the one in flight when it asks, so
// the batching adds at most TailBatch and a round trip to a follower's
// events. On a Cluster, where the journals are in different slots, each
// tail reads its own.
type tailReader struct {
	mu      sync.Mutex // guards waiting and running
	waiting map[*tailReq]struct{}
	running bool // readTails runs; it stops once nothing waits
}

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
		r.wg.Add(1)
		go r.readTails()
	}
	t.mu.Unlock()
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

// readTails reads the journals the tails wait for, one XREAD over all of
// them (up to maxTailKeys; one read per journal a call), at most one
// call per TailBatch, each blocking for TailBatch at most, until no tail
// waits.
func (r *Store) readTails() {
	defer r.wg.Done()
	t := &r.tailr
	var sent time.Time
	for {
		t.mu.Lock()
		if len(t.waiting) == 0 || r.ctx.Err() != nil {
			t.running = false
			t.mu.Unlock()
			return
		}
		byKey := make(map[string]*tailReq, min(len(t.waiting), maxTailKeys))
		for q := range t.waiting {
			if len(byKey) == maxTailKeys {
				break
			}
			if _, dup := byKey[q.key]; !dup {
				byKey[q.key] = q
			}
		}
		t.mu.Unlock()
		if wait := r.cfg.TailBatch - time.Since(sent); wait > 0 {
			select {
			case <-r.ctx.Done():
				continue
			case <-time.After(wait):
			}
		}
		sent = time.Now()
		keys, ids := make([]string, 0, len(byKey)), make([]string, 0, len(byKey))
		for k, q := range byKey {
			keys, ids = append(keys, k), append(ids, q.last)
		}
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
		for k, q := range byKey {
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
