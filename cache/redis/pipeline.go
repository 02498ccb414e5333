package redis

import (
	"context"
	"slices"
	"sync"
	"time"

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
		res := r.execPiped(ctx, s, keys, args)
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
	r.sendBatch(ctx, batch, false)
}

// sendBatch sends batch as pipeline describes; reloaded: the scripts of
// its calls were just loaded, after a NOSCRIPT.
func (r *Store) sendBatch(ctx context.Context, batch []*pipedCall, reloaded bool) {
	if len(batch) == 1 {
		q := batch[0]
		q.done <- r.execPiped(ctx, q.s, q.keys, q.args)
		return
	}
	r.pipelines.Add(1)
	c, swapped := current(r.c) // built and sent on one client (exec)
	if r.cfg.WaitReplicas > 0 && !r.sharedKeys() {
		// On a Cluster each call's WAIT must follow it to its node, on
		// its connection: each goes alone.
		var wg sync.WaitGroup
		for _, q := range batch {
			wg.Go(func() { q.done <- r.execPiped(ctx, q.s, q.keys, q.args) })
		}
		wg.Wait()
		return
	}
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
	waiting := r.cfg.WaitReplicas > 0
	if waiting {
		// A blocking command takes the whole pipeline to one connection
		// of its own (rueidis's blocking pool), in order: the WAIT
		// covers every call before it.
		cmds = append(cmds, r.waitCmd(c))
	}
	out := c.DoMulti(ctx, cmds...)
	if waiting && slices.ContainsFunc(out[:len(sent)], func(res rueidis.RedisResult) bool { return res.Error() == nil }) {
		r.waited(out[len(out)-1])
	}
	var noScript []*pipedCall
	for i, q := range sent {
		res := out[i]
		if err, ok := rueidis.IsRedisErr(res.Error()); ok && err.IsNoScript() {
			noScript = append(noScript, q)
			continue
		}
		q.done <- res
	}
	if len(noScript) == 0 {
		return
	}
	if !waiting || reloaded {
		// Each alone, at once, not one after another: Lua.Exec sends the
		// script with the call (EVAL), which loads it.
		var wg sync.WaitGroup
		for _, q := range noScript {
			wg.Go(func() { q.done <- exec(ctx, c, q.s, q.keys, q.args) })
		}
		wg.Wait()
		return
	}
	// The server lost the scripts (restarted, or a replica promoted:
	// Redis does not copy SCRIPT LOAD to replicas). Each is loaded once,
	// and the calls go again together, behind one more wait.
	loaded := map[*rueidis.Lua]bool{}
	for _, q := range noScript {
		if !loaded[q.s] {
			loaded[q.s] = true
			_ = c.Do(ctx, c.B().ScriptLoad().Script(scriptInfoOf(q.s).body).Build()).Error()
		}
	}
	r.sendBatch(ctx, noScript, true)
}

// execPiped runs one piped call: as exec does, and with
// Config.WaitReplicas followed by its WAIT on its connection (a
// dedicated one: on a Cluster, that of the keys' node).
func (r *Store) execPiped(ctx context.Context, s *rueidis.Lua, keys, args []string) rueidis.RedisResult {
	if r.cfg.WaitReplicas == 0 {
		return exec(ctx, r.c, s, keys, args)
	}
	c, swapped := current(r.c)
	if swapped && !fitsClient(c, keys) {
		return rueidis.NewErrorResult(errClientChanged)
	}
	info := scriptInfoOf(s)
	for attempt := 0; ; attempt++ {
		var res, wait rueidis.RedisResult
		err := c.Dedicated(func(d rueidis.DedicatedClient) error {
			// A built command is spent once sent: each send builds its own.
			call := func() rueidis.Completed {
				return d.B().Evalsha().Sha1(info.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
			}
			out := d.DoMulti(ctx, call(), r.waitCmd(d))
			if rerr, ok := rueidis.IsRedisErr(out[0].Error()); ok && rerr.IsNoScript() {
				// The server lacks the script (restarted, or failed over:
				// Redis does not copy SCRIPT LOAD to its replicas). Its
				// wait is lost time; the call goes again once loaded.
				if err := d.Do(ctx, d.B().ScriptLoad().Script(info.body).Build()).Error(); err != nil {
					res = rueidis.NewErrorResult(err)
					return nil
				}
				out = d.DoMulti(ctx, call(), r.waitCmd(d))
			}
			res, wait = out[0], out[1]
			return nil
		})
		if err != nil {
			return rueidis.NewErrorResult(err)
		}
		if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && redirected(rerr) {
			return r.unwaited(ctx, s, keys, args)
		}
		if res.Error() == nil {
			r.waited(wait)
			return res
		}
		// A call cut with its connection: a script safe to repeat (the
		// claim) goes once more, as rueidis sends it again unwaited.
		if info.retryable && attempt == 0 && res.NonRedisError() != nil && ctx.Err() == nil {
			continue
		}
		return res
	}
}

// redirected reports whether a Cluster answered err to send the call to
// another node (MOVED, or ASK while its slot moves).
func redirected(err *rueidis.RedisError) bool {
	_, moved := err.IsMoved()
	_, ask := err.IsAsk()
	return moved || ask
}

// unwaited runs a call that a Cluster redirected (MOVED, ASK: its slot
// moves), which a dedicated connection does not follow: without the
// wait, through the client that does, counted as a short wait.
func (r *Store) unwaited(ctx context.Context, s *rueidis.Lua, keys, args []string) rueidis.RedisResult {
	r.waits.Add(1)
	r.waitsShort.Add(1)
	return exec(ctx, r.c, s, keys, args)
}

// waitCmd is the WAIT for Config.WaitReplicas, built by b's builder.
func (r *Store) waitCmd(b interface{ B() rueidis.Builder }) rueidis.Completed {
	// WAIT's timeout is in ms, and 0 would block until the replicas come.
	return b.B().Wait().Numreplicas(int64(r.cfg.WaitReplicas)).Timeout(max(r.cfg.WaitTimeout.Milliseconds(), 1)).Build()
}

// waited counts a WAIT's answer: short when fewer replicas than asked
// acknowledged the writes before it (or it failed), logged at most once
// a minute. The writes stand either way: the claim or commit goes on as
// it would without the wait.
func (r *Store) waited(res rueidis.RedisResult) {
	r.waits.Add(1)
	n, err := res.AsInt64()
	if err == nil && n >= int64(r.cfg.WaitReplicas) {
		return
	}
	r.waitsShort.Add(1)
	now := time.Now().UnixNano()
	if last := r.waitWarned.Load(); now-last >= int64(time.Minute) && r.waitWarned.CompareAndSwap(last, now) {
		attrs := []any{"asked", r.cfg.WaitReplicas, "acknowledged", n, "timeout", r.cfg.WaitTimeout.String(), "short_total", r.waitsShort.Load()}
		if err != nil {
			attrs = append(attrs, "err", err.Error())
		}
		r.cfg.Logger.Warn("redis: claims or commits reached fewer replicas than -redis-wait-replicas asks; a failover now may lose them", attrs...)
	}
}
