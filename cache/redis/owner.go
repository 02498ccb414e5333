package redis

import (
	"context"
	"encoding/json"
	"github.com/ssegate/ssegate/cache"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Bounds of one append script. A batch takes whatever the proxy journaled
// while the previous batch was in flight (Nagle-style: about one round trip
// of latency, bigger batches under load), up to these. The first batch,
// written when a follower asks, takes up to maxCatchUp events, so that
// the follower's wait for what the owner holds is one round trip.
const (
	maxBatch      = 64
	maxCatchUp    = 4096
	maxBatchBytes = 1 << 20
)

// journalTTL is how long a journal outlives its generation's end: time for
// every tail to read the terminal entry. Later resumes read the result.
const journalTTL = 60 * time.Second

// owner is the backend of a flight this replica claimed. Its flusher
// goroutine mirrors the journal to Redis and runs the commit, until
// shutdown; the store's renewal loop keeps its lease (Store.renewLoop).
//
// The journal is mirrored only once a follower on another replica asks
// for it (st.want, signalled through this replica's inbox, or seen by a
// renewal or the commit when the signal was lost): until then the
// generation costs Redis its claim, its renewals (which carry its marks)
// and its commit, whatever its length.
//
// Fencing: Redis refuses appends and the commit once k.st names another
// (tok, gen); the owner then fails its flight with generation_lost, so its
// clients get stream_aborted rather than an answer that was not kept. It
// also fails it when it cannot reach Redis for a whole lease, since by then
// a follower may have reaped it.
type owner struct {
	// Set by newOwner (f by Store.own, before start), never written again.
	r   *Store
	f   *cache.Flight
	k   rkeys
	tok string
	gen string
	// fresh is the claim's: whether it counted a key with no record, which
	// the finish then need not look for in some sets (finishScript).
	// Set by own before start.
	fresh string

	// t0 and lastRenew measure the lease on the monotonic clock: lastRenew
	// is when (as time since t0) the last successful renewal, or the
	// claim, was sent. The lease cannot end before lastRenew + Lease.
	// t0 is set by newOwner; lastRenew is stored by the renewal loop.
	t0        time.Time
	lastRenew atomic.Int64
	// extended is when (as time since t0) the last extension of st and j
	// was sent, and sentMarks the fields of st as the renewals sent them;
	// both are the renewal loop's alone.
	extended  time.Duration
	sentMarks renewedMarks
	// flushedBytes is the journal's size in Redis, for the failure record;
	// stored by the flusher, read by fail.
	flushedBytes atomic.Int64
	// mirror is set, for good, once a follower asked for the journal: the
	// flusher then writes what the journal holds, and every event after.
	mirror atomic.Bool

	// Made by newOwner. kick is sent by whoever journals or marks (poke)
	// and commitC by the generation's commit, both received by the
	// flusher; stop is closed and ctx cancelled by shutdown, from commit,
	// fail or the store's Close.
	kick     chan struct{} // capacity 1: the journal or the mark changed
	commitC  chan *commitReq
	stop     chan struct{} // closed by shutdown
	stopOnce sync.Once
	ctx      context.Context // cancelled by shutdown: ends calls in flight
	cancel   context.CancelFunc

	mu    sync.Mutex // protects state, mk and markVer
	state ownerState // moved as ownerState says
	// Written by the generation (mark, through Flight.Mark), read by the
	// flusher (markNow).
	mk      markFields
	markVer int // bumped by mark; the flusher sends the mark when it moved
}

// ownerState is how far an owner is from the end of its generation. Every
// move is made under owner.mu:
//
//	from        to          on                                       by
//	live        committing  Flight.Commit                            the generation (Commit)
//	live        fenced      Redis refused a batch or the lease, or   the flusher or the renewal loop (fence)
//	                        could not be reached for a lease
//	committing  fenced      the commit was not taken: refused,       the generation (Commit)
//	                        Redis unreachable, the store closed
//	live        failed      Flight.Fail; the failure is recorded     the one failing the flight (Fail)
//	committing  failed      Flight.Fail; the failure is recorded     the one failing the flight (Fail)
//	fenced      failed      Flight.Fail; nothing is recorded         the one failing the flight (Fail): the
//	                                                                 fencer, or the generation meanwhile
//
// Only the first of commit and fence moves out of live: once the owner is
// committing, fenced or failed, fence does nothing, and commit waits for
// the flight's end and reports false. A commit Redis took leaves the owner
// committing for good (the flight ends committed). Failed is final: a
// second fail does nothing. The proxy never fails a flight while it
// commits it; committing → failed is what fail would make of it.
type ownerState uint8

const (
	ownerLive       ownerState = iota // nothing has begun to end the generation
	ownerCommitting                   // a commit has begun
	ownerFenced                       // this owner may no longer write; its flight is failing
	ownerFailed                       // fail has run
)

var ownerStates = [...]string{
	ownerLive:       "live",
	ownerCommitting: "committing",
	ownerFenced:     "fenced",
	ownerFailed:     "failed",
}

func (s ownerState) String() string {
	if int(s) < len(ownerStates) {
		return ownerStates[s]
	}
	return "ownerState(" + strconv.Itoa(int(s)) + ")"
}

type markFields struct {
	state            cache.State
	attempts, status int
	model, fallbacks string // fallbacks as JSON, "" for none
}

type commitReq struct {
	blob []byte
	done chan commitOutcome
}

type commitOutcome struct {
	ok      bool
	counted bool // the finish ended the key's count too (sharedKeys)
	state   cache.State
	reason  string
}

// journalPos is where the flusher knows Redis's journal to end.
type journalPos struct {
	flushed int    // events Redis holds
	prev    string // the id of the last entry (gen-0 before the first)
	bytes   int64  // their encoded bytes
	markVer int    // the mark Redis holds
}

// newOwner returns the owner of generation gen of k, claimed with tok
// at claimed; its flight is set (o.f) before it starts.
func newOwner(r *Store, k rkeys, tok string, gen uint64, claimed time.Time) *owner {
	o := &owner{
		r: r, k: k, tok: tok, gen: strconv.FormatUint(gen, 10),
		t0:      claimed,
		kick:    make(chan struct{}, 1),
		commitC: make(chan *commitReq),
		stop:    make(chan struct{}),
		mk:      markFields{state: cache.StateIntentReceived},
	}
	o.ctx, o.cancel = context.WithCancel(r.ctx)
	return o
}

func (o *owner) start() {
	o.r.mu.Lock()
	o.r.owners[o] = struct{}{}
	o.r.mu.Unlock()
	o.r.wg.Add(1)
	go o.flusher()
}

func (o *owner) shutdown() {
	o.stopOnce.Do(func() {
		o.r.mu.Lock()
		delete(o.r.owners, o)
		o.r.mu.Unlock()
		close(o.stop)
		o.cancel()
	})
}

// ask makes the owner mirror its journal to Redis from now on.
func (o *owner) ask() {
	if !o.mirror.Swap(true) {
		o.r.mirrors.Add(1)
		o.poke()
	}
}

// journalBytes is the size of the local journal's encoded events.
func (o *owner) journalBytes() int64 { return int64(o.f.JournalBytes()) }

// storedBytes is the journal's size as Redis records it: what was
// mirrored, or, unmirrored, the local journal's.
func (o *owner) storedBytes() int64 {
	if o.mirror.Load() {
		return o.flushedBytes.Load()
	}
	return o.journalBytes()
}

func (o *owner) poke() {
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// pokeMirror wakes the flusher for what it has to mirror: nothing until
// a follower asked (ask wakes it then; renewals carry the marks), so an
// unfollowed stream's events cost no wake-up each.
func (o *owner) pokeMirror() {
	if o.mirror.Load() {
		o.poke()
	}
}

// leaseLapsed reports whether the lease may have expired: no renewal has
// succeeded for a whole lease.
func (o *owner) leaseLapsed() bool {
	return time.Since(o.t0) > time.Duration(o.lastRenew.Load())+o.r.cfg.Lease
}

func (o *owner) Reserve(f *cache.Flight, n int) error {
	if err := o.r.reserve(f, n); err != nil {
		return err
	}
	o.pokeMirror()
	return nil
}

func (o *owner) Release(f *cache.Flight, n int) { o.r.release(f, n) }

func (o *owner) Mark(f *cache.Flight, state cache.State, attempts, lastStatus int) {
	model, fbs := f.Model()
	fj := ""
	if len(fbs) > 0 {
		b, _ := json.Marshal(fbs)
		fj = string(b)
	}
	o.mu.Lock()
	o.mk.model, o.mk.fallbacks = model, fj
	o.mk.state, o.mk.attempts = state, attempts
	if lastStatus != 0 {
		o.mk.status = lastStatus
	}
	o.markVer++
	o.mu.Unlock()
	o.pokeMirror()
}

// fence ends the flight because this replica may no longer write its
// generation. It does nothing once a commit or failure has begun: those
// settle with Redis themselves.
func (o *owner) fence(reason string) {
	o.mu.Lock()
	if o.state != ownerLive {
		o.mu.Unlock()
		return
	}
	o.state = ownerFenced
	o.mu.Unlock()
	o.r.fenced.Add(1)
	o.r.cfg.Logger.Warn("owned generation fenced", "scope", o.f.Scope,
		"generation", o.f.Gen, "reason", reason, "state", cache.StateCommitUnknown)
	o.f.Fail(cache.StateCommitUnknown, reason, nil)
}

// commit runs the fenced finish script through the flusher, after the
// journal's tail. When Redis refuses it or cannot be reached, the flight
// fails here, before Flight.Commit would end it as committed: the owner's
// clients never see a clean end of an answer that was not kept.
func (o *owner) Commit(f *cache.Flight, res *cache.Result) bool {
	o.mu.Lock()
	if o.state != ownerLive {
		o.mu.Unlock()
		<-f.Done() // a fence is failing the flight
		return false
	}
	o.state = ownerCommitting
	o.mu.Unlock()
	out := commitOutcome{state: cache.StateCommitUnknown, reason: cache.ReasonStoreUnavailable}
	if blob, err := o.r.codec.Encode(res); err == nil {
		req := &commitReq{blob: blob, done: make(chan commitOutcome, 1)}
		select {
		case o.commitC <- req:
			out = <-req.done
		case <-o.stop:
		}
	}
	if out.ok {
		o.r.commits.Add(1)
		o.r.keep(o.k, res)
		o.shutdown()
		o.r.forget(o.k, f)
		if keep := f.KeepFor(cache.StateCommitted, o.r.cfg.TTL, o.r.cfg.FailedTTL); !out.counted {
			o.r.keyCommitted(f.Scope, o.k, keep)
		} else {
			o.r.moreEnded(f.Scope, o.k, keep) // the finish ended the rest
		}
		return true
	}
	o.mu.Lock()
	if o.state == ownerCommitting { // not when a fail came meanwhile: failed is final
		o.state = ownerFenced
	}
	o.mu.Unlock()
	if out.reason == cache.ReasonGenerationLost {
		o.r.fenced.Add(1)
	}
	o.r.cfg.Logger.Warn("commit refused", "scope", f.Scope,
		"generation", f.Gen, "reason", out.reason, "state", out.state)
	f.Fail(out.state, out.reason, nil)
	return false
}

// fail records the end of a generation without a result, so that tails
// end their clients the same way and the key is free. When Redis cannot
// be told, the lease lapses and a follower or the next claim reaps it.
func (o *owner) Fail(f *cache.Flight, state cache.State, reason string) {
	o.mu.Lock()
	if o.state == ownerFailed {
		o.mu.Unlock()
		return
	}
	skip := o.state == ownerFenced
	o.state = ownerFailed
	o.mu.Unlock()
	o.shutdown()
	defer o.r.forget(o.k, f)
	if skip {
		return
	}
	head := ""
	if h, ok := f.Head(); ok {
		head = headJSON(h)
	}
	_, _, body := f.Outcome()
	ttl := f.KeepFor(state, o.r.cfg.TTL, o.r.cfg.FailedTTL)
	if f.HoldsUnknown(state) {
		o.r.noteUnknown(o.k, o.r.cfg.Now().Add(ttl))
	}
	if f.Denied() {
		ttl = 0 // Flight.Deny: the key's record goes at once (tails read the journal)
	}
	mk, _ := o.markNow()
	args := finishArgs{tok: o.tok, gen: o.gen, keep: ttl, state: state, reason: reason,
		now: o.r.cfg.Now(), head: head, body: body, events: f.Events(), bytes: o.storedBytes(),
		mirrored: o.mirror.Load(), mark: mk, end: o.r.countEnd(o.k, ttl, false, state == cache.StateCommitUnknown, o.fresh)}
	for range 2 {
		shared := o.r.sharedKeys()
		args.keys, args.notify = o.r.finishKeys(f.Scope, o.k, shared), shared
		ctx, cancel := o.r.opCtx()
		a, err := parseWriteAnswer(run(ctx, o.r.c, finishScript, args))
		cancel()
		if err == nil {
			if a.written() && !shared { // shared: the script ended the count
				o.r.keyEnded(f.Scope, o.k, state, ttl)
			} else if a.written() {
				o.r.moreEnded(f.Scope, o.k, ttl) // but for the accounts after the first
			}
			return
		}
		o.r.unavailable.Add(1)
	}
}

func headJSON(h cache.Head) string {
	b, _ := json.Marshal(h) // a Head always marshals
	return string(b)
}

// renewLoop keeps the leases of every generation this replica owns:
// every Lease/3 it sends all their renewals at once, so that Redis takes
// them in a few script calls read together (on a Cluster, a call each,
// pipelined), rather than each with a call, a read and a wake-up of its
// own, which cost more than the renewal itself. An owner is fenced when
// Redis says another replica took over, or when no renewal got through
// for a whole lease.
func (r *Store) renewLoop() {
	t := time.NewTicker(r.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		r.renewAll()
	}
}

// renewAll renews the leases of the generations this replica owns. On a
// standalone Redis they go in batches of renewScript (the keys of many
// scopes in one call); on a Cluster, whose scopes are in different slots,
// each in a call of its own. The calls are sent at once, not with
// ExecMulti: it loads the script on every node first and fails every call
// when one node is down, which on a Cluster would fence the owners of the
// healthy nodes' keys too.
func (r *Store) renewAll() {
	r.mu.Lock()
	owners := slices.Collect(maps.Keys(r.owners))
	r.mu.Unlock()
	if len(owners) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, min(r.cfg.Timeout, r.cfg.Lease/2))
	defer cancel()
	r.renewals.Add(int64(len(owners)))
	now := time.Now()
	rns := make([]renewal, len(owners))
	items := make([]batchItem, len(owners))
	for i, o := range owners {
		rns[i] = o.renewal(now.Sub(o.t0))
		keys := o.k.withoutResult[:2] // st, lease
		if rns[i].extends {
			keys = o.k.withoutResult // and j
		}
		items[i] = batchItem{keys: keys, args: rns[i].args}
	}
	per := 1
	if r.sharedKeys() {
		per = maxBatchItems
	}
	var wg sync.WaitGroup
	for _, run := range batchRuns(items, per) {
		rs := rns[:len(run)]
		rns = rns[len(run):]
		wg.Go(func() {
			out, err := r.renewRun(ctx, run)
			if err != nil {
				// Redis may come back from an older snapshot: the sets'
				// expiries this replica renewed may be gone.
				r.setRenewals.forget()
			}
			for i, rn := range rs {
				n, e := int64(0), err
				if err == nil {
					n, e = out[i].AsInt64()
				}
				rn.o.renewed(rn, n, e)
			}
		})
	}
	wg.Wait()
}

// renewRun sends a run of renewals in one call of renewScript and returns
// one answer per item; an error when the call as a whole failed, in which
// case whether any item ran is unknown.
func (r *Store) renewRun(ctx context.Context, run []batchItem) ([]rueidis.RedisMessage, error) {
	keys, args := renewArgs{lease: r.cfg.Lease, liveTTL: r.cfg.LiveTTL, items: run}.keysArgs()
	return execItems(ctx, r.c, renewScript, keys, args, len(run))
}

// renewal is one owner's renewal as renewAll sends it.
type renewal struct {
	o       *owner
	sent    time.Duration // since o.t0
	args    []string      // renewScript's item: flags, tok, gen, the moved values, updated
	extends bool          // st and j are extended
	moved   uint8         // the renewedFields it sets, a bit each
}

// renewal makes this owner's renewal, sent at sent since t0. It extends
// st and j once a quarter of LiveTTL passed since the last extension sent
// (the claim's first), so that Redis keeps them LiveTTL past the last
// renewal at most and three quarters of it at least. While the journal is
// not mirrored, it sets the fields of st that moved since the renewals
// sent them (the generation's mark, events and bytes), and then updated.
// A field is never cleared (0 and "" are not sent): the claim wrote the
// zeros.
func (o *owner) renewal(sent time.Duration) renewal {
	flags := make([]byte, 1, 1+len(renewedFields))
	flags[0] = 'n'
	rn := renewal{o: o, sent: sent, args: []string{"", o.tok, o.gen}}
	if sent-o.extended >= o.r.cfg.LiveTTL/4 {
		rn.extends, o.extended = true, sent
		flags[0] = 'e'
	}
	if !o.mirror.Load() {
		mk, _ := o.markNow()
		p := renewedMarks{string(mk.state), strconv.Itoa(mk.attempts), strconv.Itoa(mk.status),
			mk.model, mk.fallbacks, strconv.Itoa(o.f.Events()), strconv.FormatInt(o.journalBytes(), 10)}
		for i, v := range p {
			if v != "" && v != "0" && v != o.sentMarks[i] {
				rn.args = append(rn.args, v)
				o.sentMarks[i] = v
				rn.moved |= 1 << i
				flags = append(flags, byte('1'+i))
			}
		}
		if rn.moved != 0 {
			rn.args = append(rn.args, nowMS(o.r.cfg.Now()))
		}
	}
	rn.args[0] = string(flags)
	return rn
}

// renewedFields are the fields of st a renewal sets, and renewedMarks
// their values as the renewals sent them.
var renewedFields = [...]string{"state", "attempts", "status", "model", "fallbacks", "events", "bytes"}

type renewedMarks [len(renewedFields)]string

// renewed takes a renewal's answer: one that finds a follower's ask starts
// the mirror (the ask's signal may have been lost).
func (o *owner) renewed(rn renewal, n int64, err error) {
	if o.ctx.Err() != nil { // shut down meanwhile
		return
	}
	switch {
	case err == nil && n >= 1:
		o.lastRenew.Store(int64(rn.sent))
		if n == 2 {
			o.ask()
		}
	case err == nil:
		o.fenceAside(cache.ReasonGenerationLost)
	case o.r.ctx.Err() != nil:
	default:
		// Whether it reached Redis is unknown: the next renewal sends
		// again what this one sent (what earlier ones sent is known).
		if rn.extends {
			o.extended = -o.r.cfg.LiveTTL
		}
		for i := range o.sentMarks {
			if rn.moved&(1<<i) != 0 {
				o.sentMarks[i] = ""
			}
		}
		o.r.unavailable.Add(1)
		if o.leaseLapsed() {
			o.fenceAside(cache.ReasonStoreUnavailable)
		}
	}
}

// fenceAside fences the owner on a goroutine of its own: failing the
// flight records the failure in Redis, which must not hold up the other
// owners' renewals.
func (o *owner) fenceAside(reason string) {
	o.r.wg.Go(func() { o.fence(reason) })
}

// flusher mirrors the journal to Redis and runs the commit, so appends
// and the finish are ordered on one goroutine.
func (o *owner) flusher() {
	defer o.r.wg.Done()
	pos := journalPos{prev: o.gen + "-0"}
	dead := false // fenced: nothing more is written, a commit is refused
	for {
		select {
		case <-o.stop:
			return
		case req := <-o.commitC:
			if dead {
				req.done <- commitOutcome{state: cache.StateCommitUnknown, reason: cache.ReasonGenerationLost}
			} else {
				req.done <- o.finishCommit(&pos, req.blob)
			}
			continue
		case <-o.kick:
		}
		if dead {
			continue
		}
		if reason := o.flush(&pos, 0); reason != "" {
			dead = true
			o.fence(reason)
		}
	}
}

// batchResult is what one script call did with the journal.
type batchResult int

const (
	batchOK     batchResult = iota
	batchRetry              // Redis could not be reached: try again
	batchFenced             // another replica holds the generation
)

// flush appends journaled events until at most keep of them are not in
// Redis. It returns a fence reason, or "" (done, or stopped).
// Nothing is written until a follower asked for the journal.
func (o *owner) flush(pos *journalPos, keep int) string {
	if !o.mirror.Load() {
		return ""
	}
	backoff := 5 * time.Millisecond
	for {
		n := maxBatch
		if pos.flushed == 0 {
			n = maxCatchUp
		}
		evs, h, _ := o.f.WireSince(pos.flushed, n+keep)
		if len(evs) <= keep {
			evs = nil
		} else if keep > 0 {
			evs = evs[:len(evs)-keep]
		}
		evs = capBytes(evs)
		mk, ver := o.markNow()
		if len(evs) == 0 && ver == pos.markVer {
			return ""
		}
		args := appendArgs{keys: o.k.journal, tok: o.tok, gen: o.gen, prev: pos.prev, mark: mk,
			now: o.r.cfg.Now(), bytes: pos.bytes + eventBytes(evs), from: pos.flushed, evs: evs, notify: o.r.sharedKeys()}
		if pos.flushed == 0 && len(evs) > 0 {
			args.head = headJSON(h)
		}
		bytes := args.bytes
		a, err := o.r.appendJournal(o, args)
		switch o.settle(pos, a, err, len(evs), bytes) {
		case batchOK:
			if a.verdict == writeOK { // writePrev wrote nothing, the mark included
				pos.markVer = ver
			}
			backoff = 5 * time.Millisecond
		case batchFenced:
			return cache.ReasonGenerationLost
		case batchRetry:
			if o.leaseLapsed() {
				return cache.ReasonStoreUnavailable
			}
			if !o.sleep(&backoff) {
				return ""
			}
		}
	}
}

// eventBytes returns the encoded bytes of evs.
func eventBytes(evs [][]byte) int64 {
	var n int64
	for _, e := range evs {
		n += int64(len(e))
	}
	return n
}

// settle applies a script's answer to pos.
func (o *owner) settle(pos *journalPos, a writeAnswer, err error, n int, bytes int64) batchResult {
	if err != nil {
		if _, ok := rueidis.IsRedisErr(err); ok {
			// Redis answered with an error: retrying cannot help.
			o.r.cfg.Logger.Error("redis refused a journal write", "key", o.f.Scope.Key,
				"generation", o.f.Gen, "err", err.Error())
			return batchFenced
		}
		if o.ctx.Err() == nil {
			o.r.unavailable.Add(1)
		}
		return batchRetry
	}
	switch a.verdict {
	case writeOK, writeAlready:
		o.r.batches.Add(1)
		o.r.events.Add(int64(n))
		pos.flushed += n
		pos.bytes = bytes
		pos.prev = o.gen + "-" + strconv.Itoa(pos.flushed)
		if pos.flushed == 0 {
			pos.prev = o.gen + "-0"
		}
		o.flushedBytes.Store(bytes)
		return batchOK
	case writePrev:
		// Redis's journal does not end where this owner thinks. Before it:
		// a failover lost its acknowledged tail; re-append from where it
		// ends, from the journal. After it: a batch ran whose reply was
		// lost (a cut connection, a timeout), and the batch sent again
		// found its own events there; they are this owner's (only its
		// (tok, gen) may append), so take them as written. Past what the
		// journal holds, they cannot be its own.
		g, seqS, ok := strings.Cut(a.last, "-")
		seq, err := strconv.Atoi(seqS)
		if !ok || g != o.gen || err != nil || seq > o.f.Events() {
			return batchFenced
		}
		if seq < pos.flushed {
			o.r.cfg.Logger.Warn("redis journal lost acknowledged events; re-appending",
				"scope", o.f.Scope, "generation", o.f.Gen, "redis_has", seq, "sent", pos.flushed)
		}
		evs, _, _ := o.f.WireSince(0, seq)
		pos.bytes = 0
		for _, e := range evs {
			pos.bytes += int64(len(e))
		}
		pos.flushed, pos.prev = seq, a.last
		return batchOK
	default:
		return batchFenced
	}
}

// finishCommit appends what Redis lacks (the last batch inside the finish
// script itself) and commits. finish is idempotent per (tok, gen), so a
// retry after a lost reply settles as "already".
func (o *owner) finishCommit(pos *journalPos, blob []byte) commitOutcome {
	backoff := 5 * time.Millisecond
	for {
		if reason := o.flush(pos, maxBatch); reason != "" {
			return commitOutcome{state: cache.StateCommitUnknown, reason: reason}
		}
		if o.ctx.Err() != nil {
			return commitOutcome{state: cache.StateCommitUnknown, reason: cache.ReasonStoreUnavailable}
		}
		// Unmirrored, the commit carries no events: the result holds them.
		mirror := o.mirror.Load()
		var evs [][]byte
		var h cache.Head
		if mirror {
			evs, h, _ = o.f.WireSince(pos.flushed, maxBatch)
			if pos.flushed+len(evs) < o.f.Events() {
				// Asked since flush looked: mirror the rest first (the
				// finish would refuse a journal short of the last event).
				continue
			}
		}
		head := ""
		if pos.flushed == 0 && len(evs) > 0 {
			head = headJSON(h)
		}
		mk, _ := o.markNow()
		keep := o.f.KeepFor(cache.StateCommitted, o.r.cfg.TTL, o.r.cfg.FailedTTL)
		shared := o.r.sharedKeys()
		args := finishArgs{keys: o.r.finishKeys(o.f.Scope, o.k, shared), tok: o.tok, gen: o.gen, done: true,
			prev: pos.prev, keep: keep, state: cache.StateCommitted, now: o.r.cfg.Now(), result: blob,
			events: o.f.Events(), bytes: pos.bytes + eventBytes(evs), firstHead: head, mirrored: mirror, mark: mk,
			end: o.r.countEnd(o.k, keep, true, false, o.fresh), from: pos.flushed, evs: evs, notify: shared}
		if !mirror {
			args.bytes = o.journalBytes()
		}
		bytes := args.bytes
		ctx, cancel := context.WithTimeout(o.ctx, o.r.cfg.Timeout)
		a, err := parseWriteAnswer(o.r.runPiped(ctx, finishScript, args))
		cancel()
		if err == nil && a.verdict == writeWant {
			// A follower asked before the commit: mirror, then commit.
			o.ask()
			continue
		}
		switch o.settle(pos, a, err, len(evs), bytes) {
		case batchOK:
			if a.written() {
				return commitOutcome{ok: true, counted: shared}
			}
			// writePrev: pos moved to where Redis's journal ends.
		case batchFenced:
			return commitOutcome{state: cache.StateCommitUnknown, reason: cache.ReasonGenerationLost}
		case batchRetry:
			if o.leaseLapsed() || !o.sleep(&backoff) {
				return commitOutcome{state: cache.StateCommitUnknown, reason: cache.ReasonStoreUnavailable}
			}
		}
	}
}

func (o *owner) markNow() (markFields, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mk, o.markVer
}

// sleep waits out a backoff step; false when the owner stopped meanwhile.
func (o *owner) sleep(d *time.Duration) bool {
	t := time.NewTimer(*d)
	defer t.Stop()
	select {
	case <-o.stop:
		return false
	case <-t.C:
	}
	*d = min(*d*2, o.r.cfg.Lease/4)
	return true
}

// capBytes keeps a batch under maxBatchBytes (but at least one event).
func capBytes(evs [][]byte) [][]byte {
	n := 0
	for i, e := range evs {
		n += len(e)
		if n > maxBatchBytes && i > 0 {
			return evs[:i]
		}
	}
	return evs
}
