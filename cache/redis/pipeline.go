package redis

import (
	"context"
	"sync"

	"github.com/redis/rueidis"
)

// Bounds of one pipeline of scriptPipe: as many script calls as a batch
// script takes items (maxBatchItems), and as many pipelines in flight at
// once as appends may have calls (maxAppendCalls).
const (
	maxPipeItems = maxBatchItems
	maxPipeCalls = maxAppendCalls
)

// scriptPipe sends the claims and commits of a replica's streams to
// Redis together (group commit, as appendBatcher does for appends): a
// call that finds nothing in flight is sent at once, alone, by its
// caller; the calls
// that queue while one is on its way go in one pipeline (one write, and
// on the server one read, for all of them; per slot on a Cluster, where
// rueidis splits a pipeline by node). Each call is still its own script
// run, so nothing of a claim's rules changes: it is atomic on its key,
// fenced by its token, and counted against its tenant and accounts in the
// script, whatever else its pipeline carries; a call refused or fenced
// answers only for itself. What this saves is Redis's per-request work (a
// read of the socket, a write of the replies) and the client's, which at
// tens of thousands of streams costs more than the scripts' own commands
// (docs/redis.md, Batches).
type scriptPipe struct {
	mu    sync.Mutex // guards queue and calls
	queue []*pipedCall
	calls int // senders running
}

// pipedCall is one queued script call, answered on done.
type pipedCall struct {
	// The caller's: once done, the caller has its answer (its error) and
	// the call is not sent.
	ctx        context.Context
	s          *rueidis.Lua
	keys, args []string
	done       chan rueidis.RedisResult // capacity 1
}

// runPiped runs a's script s as run does, through the replica's pipe.
// Its answer comes within ctx: a queued call is not held past it.
func (r *Store) runPiped(ctx context.Context, s *rueidis.Lua, a scriptArgs) rueidis.RedisResult {
	keys, args := a.keysArgs()
	q := &pipedCall{ctx: ctx, s: s, keys: keys, args: args, done: make(chan rueidis.RedisResult, 1)}
	b := &r.pipe
	b.mu.Lock()
	if b.calls == 0 {
		// Nothing in flight: the call goes at once, from this goroutine;
		// what queues meanwhile goes once it is answered.
		b.calls++
		b.mu.Unlock()
		res := exec(ctx, r.c, s, keys, args)
		b.mu.Lock()
		if len(b.queue) > 0 {
			r.wg.Go(r.sendPiped)
		} else {
			b.calls--
		}
		b.mu.Unlock()
		return res
	}
	b.queue = append(b.queue, q)
	if b.calls < maxPipeCalls && len(b.queue) >= maxPipeItems {
		b.calls++
		r.wg.Go(r.sendPiped)
	}
	b.mu.Unlock()
	select {
	case res := <-q.done:
		return res
	case <-ctx.Done():
		// Sent meanwhile or not, its answer is a timed-out call's, which
		// each caller already handles (a claim is abandoned, a commit
		// tried again: both scripts find their own earlier run).
		return rueidis.NewErrorResult(ctx.Err())
	}
}

// sendPiped sends queued calls until the queue is empty.
func (r *Store) sendPiped() {
	b := &r.pipe
	for {
		b.mu.Lock()
		batch := b.take()
		if len(batch) == 0 {
			b.calls--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		r.pipeline(batch)
	}
}

// take removes the next pipeline's calls from the queue: at most
// maxPipeItems, without those whose caller stopped waiting. Called with
// mu held.
func (b *scriptPipe) take() []*pipedCall {
	n := min(len(b.queue), maxPipeItems)
	batch := make([]*pipedCall, 0, n)
	for _, q := range b.queue[:n] {
		if q.ctx.Err() == nil {
			batch = append(batch, q)
		}
	}
	clear(b.queue[:n])
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	return batch
}

// pipeline sends batch, one call alone as Lua.Exec does, several as one
// pipeline of EVALSHAs; a call that finds its script not loaded (a Redis
// restarted or failed over since the store loaded them) is sent again
// alone, which loads it.
func (r *Store) pipeline(batch []*pipedCall) {
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.Timeout)
	defer cancel()
	if len(batch) == 1 {
		q := batch[0]
		q.done <- exec(ctx, r.c, q.s, q.keys, q.args)
		return
	}
	r.pipelines.Add(1)
	c, swapped := current(r.c) // built and sent on one client (exec)
	cmds := make(rueidis.Commands, 0, len(batch))
	sent := batch[:0:0]
	for _, q := range batch {
		if swapped && !fitsClient(c, q.keys) {
			q.done <- rueidis.NewErrorResult(errClientChanged)
			continue
		}
		info := scriptInfoOf(q.s)
		cmd := c.B().Evalsha().Sha1(info.sha).Numkeys(int64(len(q.keys))).Key(q.keys...).Arg(q.args...).Build()
		if info.retryable {
			cmd = cmd.ToRetryable()
		}
		cmds = append(cmds, cmd)
		sent = append(sent, q)
	}
	if len(cmds) == 0 {
		return
	}
	for i, res := range c.DoMulti(ctx, cmds...) {
		q := sent[i]
		if err, ok := rueidis.IsRedisErr(res.Error()); ok && err.IsNoScript() {
			res = exec(ctx, c, q.s, q.keys, q.args)
		}
		q.done <- res
	}
}
