package redis

import (
	"context"
	"sync"
)

// Bounds of one call of appendBatcher. An append costs Redis more than a
// renewal (its events' XADDs and st's fields), so a call takes half of
// maxBatchItems to stay within the few hundred µs a batch script may hold
// Redis; its bytes are bounded by maxBatchArgBytes, as every batch
// script's. An append too large for either (a follower's first batch,
// mostly) goes alone as appendScript, which also keeps it clear of Lua's
// bound on unpack (about 8,000 values) in batchScript.
const (
	maxAppendItems = maxBatchItems / 2
	maxAppendArgs  = 4096
	// maxAppendCalls bounds the calls in flight at once: a second call
	// starts only when the queue holds a full call, so that a replica
	// appending faster than one call per round trip is not held to it.
	maxAppendCalls = 4
)

// appendBatcher sends the appends of a replica's owners to a standalone
// Redis: what queued while the previous call was on its way goes in one
// call of appendsScript (group commit: an append that finds nothing in
// flight is sent at once, alone, as appendScript). An owner sends its
// next append only once the last has its answer; an append answered by
// its deadline (or its call's timeout) may still run after the next, and
// the prev check keeps the journal the owner's events, in order, each
// once: whichever runs second finds the journal moved and writes nothing.
type appendBatcher struct {
	mu    sync.Mutex // guards queue, bytes and calls
	queue []*appendReq
	bytes int // the queue's argument bytes
	calls int // senders running
}

// appendReq is one owner's append, answered on done.
type appendReq struct {
	// The owner's, bounded by -redis-timeout from the queueing: once done,
	// the owner has its answer and the append is not sent.
	ctx   context.Context
	item  batchItem
	bytes int
	done  chan appendAnswer // capacity 1
}

type appendAnswer struct {
	a   writeAnswer
	err error
}

// appendJournal runs o's append (appendScript's args): on a
// standalone Redis through the replica's batcher, on a Cluster alone
// (each scope's keys are in a slot of their own). Either way its answer
// comes within -redis-timeout: a queued append is not held for the calls
// ahead of it and then its own.
func (r *Store) appendJournal(o *owner, args appendArgs) (writeAnswer, error) {
	ctx, cancel := context.WithTimeout(o.ctx, r.cfg.Timeout)
	defer cancel()
	if !r.sharedKeys() {
		return parseWriteAnswer(run(ctx, r.c, appendScript, args))
	}
	var it batchItem
	it.keys, it.args = args.keysArgs()
	req := &appendReq{ctx: ctx, item: it, bytes: it.size(), done: make(chan appendAnswer, 1)}
	b := &r.appends
	b.mu.Lock()
	b.queue = append(b.queue, req)
	b.bytes += req.bytes
	if b.calls == 0 || (b.calls < maxAppendCalls && (len(b.queue) >= maxAppendItems || b.bytes >= maxBatchArgBytes)) {
		b.calls++
		r.wg.Go(r.sendAppends)
	}
	b.mu.Unlock()
	select {
	case ans := <-req.done:
		return ans.a, ans.err
	case <-ctx.Done():
		// The owner stopped, or the append waited -redis-timeout behind
		// the calls ahead of it. Sent meanwhile or not, its answer is a
		// timed-out call's: the owner appends again, and an append that
		// did run reads as its own (writePrev).
		return writeAnswer{}, ctx.Err()
	}
}

// sendAppends sends queued appends until the queue is empty.
func (r *Store) sendAppends() {
	b := &r.appends
	for {
		b.mu.Lock()
		batch := b.take()
		if len(batch) == 0 {
			b.calls--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		ctx, cancel := context.WithTimeout(r.ctx, r.cfg.Timeout)
		alone := func(q *appendReq) {
			a, err := parseWriteAnswer(exec(ctx, r.c, appendScript, q.item.keys, q.item.args))
			q.done <- appendAnswer{a, err}
		}
		switch {
		case len(batch) == 1:
			alone(batch[0])
		case !r.sharedKeys():
			// The client turned into a Cluster's since they queued
			// (swapClient): their keys are in different slots.
			var wg sync.WaitGroup
			for _, q := range batch {
				wg.Go(func() { alone(q) })
			}
			wg.Wait()
		default:
			items := make([]batchItem, len(batch))
			for i, q := range batch {
				items[i] = q.item
			}
			out, err := appendsScript.exec(ctx, r.c, items)
			for i, q := range batch {
				if err != nil {
					q.done <- appendAnswer{err: err}
					continue
				}
				a, err := parseWriteStrings(out[i].AsStrSlice())
				q.done <- appendAnswer{a, err}
			}
		}
		cancel()
	}
}

// take removes the next call's appends from the queue, within the bounds;
// an append too large for a batch goes alone. Those whose context is done
// (the owner stopped, or -redis-timeout passed) are dropped. Called with
// mu held.
func (b *appendBatcher) take() []*appendReq {
	n, bytes := 0, 0
	var batch []*appendReq
	for _, q := range b.queue {
		alone := q.bytes > maxBatchArgBytes || len(q.item.args) > maxAppendArgs
		if len(batch) == maxAppendItems || (len(batch) > 0 && (alone || bytes+q.bytes > maxBatchArgBytes)) {
			break
		}
		n++
		b.bytes -= q.bytes
		if q.ctx.Err() != nil {
			continue
		}
		batch = append(batch, q)
		bytes += q.bytes
		if alone {
			break
		}
	}
	clear(b.queue[:n]) // sent: the backing array need not keep their events
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	return batch
}
