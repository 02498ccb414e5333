package cache

import (
	"time"
)

// This file is the service-provider interface of a store backend: what a
// store that keeps its ledger outside this process (cache/redis keeps it
// in Redis) needs of this package, so that it makes, feeds and ends
// flights without touching a flight's lock or fields:
//
//   - Backend: what a flight reports to the store that made it;
//   - Journals: a store's live journals, the bytes they hold against its
//     Limits (all together, and each account's share), and the flights
//     made with them (Journals.NewFlight);
//   - the journal's spans: Flight.WireSince reads the encoded events to
//     mirror them, Flight.AppendWire copies another replica's, and
//     Flight.JournalBytes sizes them;
//   - the end's facts: Flight.KeepFor, Flight.Denied, Flight.HoldsUnknown;
//   - Codec: a committed Result as one compressed blob, and back
//     (Result.Unpack and Result.Cost for a local copy of it).
//
// Memory is a backend of its own flights through the same interface.

// Backend is what a Flight reports to the store that made it: the
// store's ledger learns of every end through it, and accounts the
// journal's bytes against its bounds. A flight calls Reserve with its own
// lock held, so Reserve must not call the flight back; it calls the
// others without it, from the goroutine that appends, marks or ends the
// flight, and they may. Each of Commit and Fail is called at most once
// per flight, and not both, unless Commit fails the flight itself (a
// store that refuses a commit calls Flight.Fail from inside it).
type Backend interface {
	// Reserve accounts n more journal bytes of f against the store's
	// bounds; an error (ErrStoreFull) refuses them.
	Reserve(f *Flight, n int) error
	// Release returns the n journal bytes f still holds, once, as it ends.
	Release(f *Flight, n int)
	// Commit records res as the key's committed result and reports
	// whether the store kept it.
	Commit(f *Flight, res *Result) (stored bool)
	// Fail records the end of a generation that produced no result.
	Fail(f *Flight, state State, reason string)
	// Mark records progress of a live generation.
	Mark(f *Flight, state State, attempts, lastStatus int)
}

// Journals are the live journals of one store: the bytes they hold,
// all together and per account, against the store's Limits
// (MaxLiveBytes and its per-tenant share), and the policy of when they
// seal. A store makes its flights with NewFlight, and accounts their
// bytes (its Backend's Reserve and Release) with Reserve and Release. It
// is safe for concurrent use.
type Journals struct {
	limits Limits
	now    func() time.Time
	shares *liveShares
	seal   *sealPolicy
}

// NewJournals returns the journals of a store bounded by l (its defaults
// set, Limits.SetDefaults), whose generations' ages are told by now.
func NewJournals(l Limits, now func() time.Time) *Journals {
	shares := newLiveShares(l)
	return &Journals{limits: l, now: now, shares: shares, seal: newSealPolicy(l, now, &shares.total)}
}

// NewFlight returns the flight of generation gen of sc, whose request has
// the fingerprint fp, reporting to be; t is the tool call it stands for
// (BeginTool), or nil. Its bytes count against sc's accounts
// (Scope.Charged) from now until it ends, when be releases them.
func (j *Journals) NewFlight(be Backend, sc Scope, gen uint64, fp string, t *Tool) *Flight {
	f := newFlight(be, sc, gen, fp, j.limits.MaxStreamBytes, j.limits.MaxSubscribers, j.now(), j.seal)
	f.share = j.shares.enter(sc.Charged())
	f.tool = t
	return f
}

// Full reports, with ErrStoreFull, that the live journals hold all they
// may: no new generation begins.
func (j *Journals) Full() error { return j.shares.full() }

// Admit reports whether a new generation of sc may begin: not while the
// journals are full, nor while one of its accounts holds more than its
// share and less than two shares are free (the error says which).
func (j *Journals) Admit(sc Scope) error { return j.shares.admit(sc.Charged()) }

// Reserve accounts n more bytes of f's journal against the bounds, as a
// Backend's Reserve does.
func (j *Journals) Reserve(f *Flight, n int) error { return j.shares.reserve(f.share, n) }

// Release returns n bytes of f's journal, as a Backend's Release does.
func (j *Journals) Release(f *Flight, n int) { j.shares.leave(f.share, n) }

// Bytes returns the bytes the live journals hold together.
func (j *Journals) Bytes() int64 { return j.shares.total.Load() }

// Backend returns the backend f reports to.
func (f *Flight) Backend() Backend { return f.be }

// JournalBytes returns the size of f's encoded events.
func (f *Flight) JournalBytes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.j.size
}

// HoldsUnknown reports whether f, ended in state, holds its key so that a
// re-issue answers Unknown: a tool call (BeginTool) whose outcome is
// unknown.
func (f *Flight) HoldsUnknown(state State) bool {
	return f.tool != nil && heldUnknown(state, "?")
}

var (
	_ Backend = (*memoryBackend)(nil)
	_ Backend = detached{}
)
