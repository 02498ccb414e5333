package redis

import (
	"encoding/json"
	"errors"
	"github.com/ssegate/ssegate/cache"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// The two Backends of the flights a Redis store makes: the owner's of a
// generation this replica runs, and the follower's of one it mirrors.
var (
	_ cache.Backend = (*owner)(nil)
	_ cache.Backend = (*follower)(nil)
)

// follower is the backend of a flight that copies a generation another
// replica owns. Its tail is the only writer of the flight, so the flight's
// journal code serves local clients exactly as it does on the owner.
// Nothing a follower does changes the generation in Redis, except reaping
// it once its owner's lease is gone.
type follower struct {
	r   *Store
	f   *cache.Flight
	k   rkeys
	gen string
	tok string // its reaps' token (loseLua)
	// counted: this follower's reap was counted (lost), from its answer
	// or, when that was lost, from the terminal entry it wrote.
	counted bool
}

// The backends of this store's flights: an owned one's and a followed one's.
var (
	_ cache.Backend = (*owner)(nil)
	_ cache.Backend = (*follower)(nil)
)

func (fl *follower) Reserve(f *cache.Flight, n int) error { return fl.r.reserve(f, n) }
func (fl *follower) Release(f *cache.Flight, n int)       { fl.r.release(f, n) }

func (fl *follower) Commit(f *cache.Flight, res *cache.Result) bool {
	fl.r.keep(fl.k, res)
	fl.r.forget(fl.k, f)
	return true
}

func (fl *follower) Fail(f *cache.Flight, _ cache.State, _ string) { fl.r.forget(fl.k, f) }
func (fl *follower) Mark(*cache.Flight, cache.State, int, int)     {}

// tail asks the owner for the generation's journal, then reads it from
// its start, with explicit ids so that nothing falls between catching up
// and following (XREAD with an id returns at once what follows it and
// blocks only when caught up), and ends the flight as the journal's
// terminal entry says. When the journal stays idle it asks again whether
// the owner's lease stands, and reaps the generation when it does not.
func (fl *follower) tail() {
	r, f := fl.r, fl.f
	defer r.wg.Done()
	last := fl.gen + "-0"
	next := uint64(1)
	var downSince time.Time
	backoff := 5 * time.Millisecond
	ended := 0 // consecutive idle checks that found the generation over
	// An error here leaves the ask to the first idle check.
	if stop, _ := fl.poll(&ended); stop {
		return
	}
	for {
		if r.ctx.Err() != nil {
			f.Fail(cache.StateFailedRetryable, cache.ReasonShutdown, nil)
			return
		}
		es, err := r.readTail(fl.k.j, last)
		if errors.Is(err, errTailIdle) {
			var stop bool
			if stop, err = fl.poll(&ended); err == nil {
				if stop {
					return
				}
				downSince = time.Time{}
				continue
			}
		}
		if err != nil {
			if r.ctx.Err() != nil {
				continue
			}
			r.unavailable.Add(1)
			if downSince.IsZero() {
				downSince = time.Now()
			}
			// The owner fences itself after a lease without Redis; past
			// that the generation cannot commit.
			if time.Since(downSince) > r.cfg.Lease+r.idle {
				f.Fail(cache.StateCommitUnknown, cache.ReasonStoreUnavailable, nil)
				return
			}
			select {
			case <-r.ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, r.idle)
			continue
		}
		downSince, backoff, ended = time.Time{}, 5*time.Millisecond, 0
		for _, e := range es {
			if fl.apply(e, &next) {
				return
			}
			last = e.ID
		}
	}
}

// poll runs reapScript: it asks the owner for the journal (signalling its
// replica when the ask is new), reaps a generation whose owner is dead,
// and ends the flight from the result of one committed before its journal
// was mirrored. It reports whether the flight has ended.
func (fl *follower) poll(ended *int) (bool, error) {
	f := fl.f
	state, word, err := fl.check()
	if err != nil {
		return false, err
	}
	switch state {
	case reapAlive:
		*ended = 0
	case reapAsked:
		*ended = 0
		fl.signal(word) // the owner replica's name
	case reapDone:
		fl.fromResult()
		return true, nil
	case reapReaped:
		// The next read returns the lost entry this wrote.
		fl.lost(word)
	default:
		// Over, yet no terminal entry after ours: read once more (it may
		// have just been written), then give up.
		if *ended++; *ended >= 2 {
			f.Fail(cache.StateCommitUnknown, cache.ReasonGenerationLost, nil)
			return true, nil
		}
	}
	return false, nil
}

// lost logs and counts the reap of this follower's generation, once, and
// ends its count: a tool call's key is held for its own time (utl: ms),
// others' records kept for FailedTTL; the count follows them.
func (fl *follower) lost(utl string) {
	if fl.counted {
		return
	}
	fl.counted = true
	r, f := fl.r, fl.f
	r.reaped.Add(1)
	r.cfg.Logger.Warn("reaped a generation whose owner's lease expired",
		"scope", f.Scope, "generation", f.Gen,
		"state", cache.StateCommitUnknown)
	hold := r.cfg.FailedTTL
	if h := heldFor([]string{utl}, 0); h > 0 {
		hold = h
	}
	r.keyEnded(f.Scope, fl.k, cache.StateCommitUnknown, hold)
}

// signal pushes the ask to the owner replica's inbox, so that it mirrors
// the journal at once rather than at its next renewal.
func (fl *follower) signal(owner string) {
	r := fl.r
	if owner == "" {
		return
	}
	key := r.inboxKey(owner)
	ctx, cancel := r.opCtx()
	defer cancel()
	r.asks.Add(1)
	for _, res := range r.c.DoMulti(ctx,
		r.c.B().Rpush().Key(key).Element(fl.k.h+" "+fl.gen).Build(),
		r.c.B().Pexpire().Key(key).Milliseconds(journalTTL.Milliseconds()).Build()) {
		if res.Error() != nil {
			r.unavailable.Add(1)
			return
		}
	}
}

// apply copies one journal entry into the flight; true when the flight
// has ended.
func (fl *follower) apply(e rueidis.XRangeEntry, next *uint64) bool {
	f := fl.f
	g, seqS, _ := strings.Cut(e.ID, "-")
	seq, err := strconv.ParseUint(seqS, 10, 64)
	if g != fl.gen || err != nil {
		// The key was claimed again: this generation is over, and its
		// terminal entry went with the old journal.
		f.Fail(cache.StateCommitUnknown, cache.ReasonGenerationLost, nil)
		return true
	}
	switch {
	case seq == 0 || seq < *next:
		return false
	case seq == math.MaxUint64:
		fl.end(e.FieldValues)
		return true
	}
	if h := e.FieldValues["h"]; h != "" {
		var hd cache.Head
		if json.Unmarshal([]byte(h), &hd) == nil {
			f.SetHead(hd)
		}
	}
	if err := f.AppendWire(seq, []byte(e.FieldValues["e"])); err != nil {
		fl.failCopy(err)
		return true
	}
	*next = seq + 1
	return false
}

// failCopy ends the flight when this replica could not keep its copy.
func (fl *follower) failCopy(err error) {
	reason := cache.ReasonGenerationLost
	switch {
	case errors.Is(err, cache.ErrStreamTooLarge):
		reason = cache.ReasonMaxStreamBytes
	case errors.Is(err, cache.ErrStoreFull):
		reason = cache.ReasonStoreFull
	}
	fl.f.Fail(cache.StateFailedRetryable, reason, nil)
}

// end ends the flight as the owner ended the generation.
func (fl *follower) end(fields map[string]string) {
	f := fl.f
	switch fields["t"] {
	case "done":
		if h, ok := f.Head(); ok && h.Stream {
			f.Commit(nil) // the journal holds every event: the finish appended the rest first
			return
		}
		// A non-streaming answer, or a stream without events: the result
		// holds the head and body.
		fl.fromResult()
	case "failed":
		if h := fields["h"]; h != "" {
			var hd cache.Head
			if json.Unmarshal([]byte(h), &hd) == nil {
				f.SetHead(hd)
			}
		}
		var body []byte
		if b := fields["b"]; b != "" {
			body = []byte(b)
		}
		reason, state := fields["reason"], cache.State(fields["state"])
		if n, err := strconv.Atoi(fields["n"]); err == nil && f.Events() < n && state != cache.StateCancelled {
			// The owner ended before its last events reached Redis (its
			// flusher stops at the failure): this copy is cut short, and
			// a reason the proxy relays as the provider's own end (an
			// error event) would pass it off as whole. Its clients are
			// told the stream was cut. (A stop by the tenant says so
			// itself.)
			reason = cache.ReasonUncleanEnd
		}
		f.Fail(state, reason, body)
	default: // lost: reaped, the owner died or was cut off
		if fields["by"] == fl.tok {
			fl.lost(fields["utl"]) // its own reap, whose answer was lost
		}
		f.Fail(cache.StateCommitUnknown, cache.ReasonGenerationLost, nil)
	}
}

// fromResult ends the flight from the committed result: its head, the
// events the journal did not give (none, when the generation was
// committed before its journal was mirrored), byte for byte, or its body.
func (fl *follower) fromResult() {
	f := fl.f
	var res *cache.Result
	var err error
	deadline := time.Now().Add(fl.r.cfg.Lease)
	for {
		res, err = fl.r.result(f.Scope, fl.k, f.Gen)
		if err == nil || !errors.Is(err, cache.ErrUnavailable) || time.Now().After(deadline) {
			break
		}
		time.Sleep(fl.r.idle / 4)
	}
	if err == nil {
		err = res.Unpack()
	}
	if err != nil {
		f.Fail(cache.StateCommitUnknown, cache.ReasonStoreUnavailable, nil)
		return
	}
	f.SetHead(res.Head)
	if !res.Head.Stream {
		f.Commit(res.Data)
		return
	}
	for seq := f.Events() + 1; seq <= res.Events(); seq++ {
		from := uint32(0)
		if seq > 1 {
			from = res.Ends[seq-2]
		}
		if err := f.AppendWire(uint64(seq), res.Data[from:res.Ends[seq-1]]); err != nil {
			fl.failCopy(err)
			return
		}
	}
	f.Commit(nil)
}

// check asks for the journal and whether the generation's owner is alive,
// reaping it if not, and returns the owner replica's name for a new ask,
// or the hold of a tool call it reaped (parseReapAnswer).
func (fl *follower) check() (reapAnswer, string, error) {
	r := fl.r
	ctx, cancel := r.opCtx()
	defer cancel()
	return parseReapAnswer(run(ctx, r.c, reapScript, reapArgs{
		keys: fl.k.withoutResult, gen: fl.gen, stTTL: r.cfg.FailedTTL, now: r.cfg.Now(), reaper: fl.tok,
	}))
}
