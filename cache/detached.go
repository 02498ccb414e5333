package cache

import "time"

// detached is the backend of a flight that no store records: a stream
// relayed without a key still fans out through a journal, but nothing of
// it is kept once it ends.
type detached struct{}

func (detached) Reserve(*Flight, int) error    { return nil }
func (detached) Release(*Flight, int)          {}
func (detached) Commit(*Flight, *Result) bool  { return false }
func (detached) Fail(*Flight, State, string)   {}
func (detached) Mark(*Flight, State, int, int) {}

// NewDetached returns a flight that belongs to no store, for a stream
// relayed without an idempotency key. Its ids carry generation 0 and are
// not written; maxBytes bounds its journal.
func NewDetached(maxBytes int) *Flight {
	f := newFlight(detached{}, Scope{}, 0, "", maxBytes, 1, time.Now(), nil)
	// Its one reader (at most one subscriber) never reads an event twice,
	// and is done with what it read when it reads again: the journal
	// drops or reuses it then.
	f.j.discard = true
	return f
}
