package cache

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ssegate/ssegate/sse"
)

// Flight is one live generation: an append-only journal of encoded events
// and the subscribers that follow it. The owner (the goroutine that reads
// the upstream) calls SetHead, Append and then exactly one of Commit or
// Fail; any number of subscribers read concurrently. A subscriber never
// blocks the owner: Append only signals subscribers whose signal channel
// is empty.
type Flight struct {
	// Scope and Gen name the generation; ids of its events are Gen-Seq.
	Scope Scope
	Gen   uint64

	id        string // a Memory flight's ledger id (Scope.ID), made once by its claim
	fp        string
	be        Backend
	maxBytes  int
	maxSubs   int
	started   time.Time
	seal      *sealPolicy   // nil: the journal never seals (a detached one drops instead)
	share     []*tenantLive // its accounts' live bytes (liveShares), or nil
	headReady chan struct{}
	done      chan struct{}
	trace     atomic.Pointer[string] // the traceparent of the generation's request (SetTrace)

	mu       sync.Mutex // guards everything below
	head     Head
	hasHead  bool
	j        journal // encoded events, each with its id
	reserved int     // bytes accounted with the backend
	held     int     // of reserved, bytes held for events not yet appended (Hold)
	subs     []*Sub
	// followers: of subs, those -max-followers counts (Subscribe's); the
	// origin's (SubscribeOrigin) is not one of them.
	followers int
	ended     bool
	state     State
	reason    string
	body      []byte // non-streaming answer, for joiners
	// whole: Commit was called, so the answer came whole (a stream's
	// journal ends with its clean end, a non-streaming body was read
	// whole). A flight that then ended uncommitted (the store refused the
	// commit) is Unstored: its clients get the answer, not an abort.
	whole    bool
	usage    Usage
	first    time.Time // when the first event was journaled
	model    string
	fallback []Fallback
	// The journal's read blocks are sealed while sealNow is set. It is
	// decided again each time a block fills (asked: the number of blocks
	// when it last was).
	asked   int
	sealNow bool
	// denied: the flight ended by Deny, and the store keeps no record of
	// its key.
	denied bool
	// frames is the committed journal, packed (Commit), kept when its
	// blocks go back to the pools (journal.pooled, freeLocked) for a
	// reader that comes after; freed: they went back; followed: a Sub
	// was opened.
	frames   [][]byte
	freed    bool
	followed bool

	tool *Tool // set by BeginTool before the flight is handed out

	stopper Stopper // what Stop calls: the generation's (SetStopper); guarded by mu
}

// Stopper is what ends a flight's generation before its end when its
// tenant stops it: the goroutine that reads the upstream for it. Stop
// must not block, and must end the flight soon after (Fail with
// StateCancelled).
type Stopper interface {
	Stop()
}

// SetStopper names what Stop calls: set by whoever owns the generation
// this process runs, before any client can ask for the stop.
func (f *Flight) SetStopper(s Stopper) {
	f.mu.Lock()
	f.stopper = s
	f.mu.Unlock()
}

// Stop asks the generation of a live flight that this process runs to
// end, cancelled. It reports false when the flight has no Stopper here (a
// copy of another replica's generation: its store tells the owner) or
// has ended.
func (f *Flight) Stop() bool {
	f.mu.Lock()
	s, ended := f.stopper, f.ended
	f.mu.Unlock()
	if s == nil || ended {
		return false
	}
	s.Stop()
	return true
}

// SetModel records the model of the attempts to come, and the models
// given up on before it; the store records them with the next Mark.
func (f *Flight) SetModel(model string, fallbacks []Fallback) {
	f.mu.Lock()
	f.model, f.fallback = model, fallbacks
	f.mu.Unlock()
}

// Model returns what SetModel recorded.
func (f *Flight) Model() (string, []Fallback) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.model, f.fallback
}

// SetTrace records the W3C traceparent of the request that started the
// generation, opaque to the store, for the requests that follow or
// replay it to link to; its committed Result keeps it while this process
// holds the Result.
func (f *Flight) SetTrace(traceparent string) { f.trace.Store(&traceparent) }

// Trace returns what SetTrace recorded, "" before.
func (f *Flight) Trace() string {
	if tp := f.trace.Load(); tp != nil {
		return *tp
	}
	return ""
}

// Usage is the token count an upstream reported for one answer.
type Usage struct {
	Input, Output int64
}

// SetUsage records the tokens the upstream reported, before Commit.
func (f *Flight) SetUsage(u Usage) {
	f.mu.Lock()
	f.usage = u
	f.mu.Unlock()
}

// Usage returns the tokens the upstream reported, once known.
func (f *Flight) Usage() Usage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.usage
}

// FirstEventAt returns when the first event was journaled (zero before).
func (f *Flight) FirstEventAt() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.first
}

func newFlight(be Backend, sc Scope, gen uint64, fp string, maxBytes, maxSubs int, now time.Time, seal *sealPolicy) *Flight {
	return &Flight{
		Scope:     sc,
		Gen:       gen,
		fp:        fp,
		be:        be,
		maxBytes:  maxBytes,
		maxSubs:   maxSubs,
		started:   now,
		seal:      seal,
		headReady: make(chan struct{}),
		done:      make(chan struct{}),
		state:     StateIntentReceived,
	}
}

// HeadReady is closed once the head is known, or the flight ended without one.
func (f *Flight) HeadReady() <-chan struct{} { return f.headReady }

// Done is closed once the flight has ended (committed or failed).
func (f *Flight) Done() <-chan struct{} { return f.done }

// Head returns the answer's head once HeadReady is closed; ok is false
// when the flight ended before the upstream answered.
func (f *Flight) Head() (h Head, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.head, f.hasHead
}

// HeadEnded returns the head (hasHead: the upstream answered) and whether
// the flight ended, from one look: since SetHead does nothing once the
// flight ended, a flight that set its head and then ended never reads as
// one that ended without it. Outcome is valid once ended is.
func (f *Flight) HeadEnded() (h Head, hasHead, ended bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.head, f.hasHead, f.ended
}

// SetHead records the upstream's answer head and wakes those waiting for it.
func (f *Flight) SetHead(h Head) {
	f.mu.Lock()
	if f.hasHead || f.ended {
		f.mu.Unlock()
		return
	}
	f.head, f.hasHead = h, true
	f.mu.Unlock()
	close(f.headReady)
}

// Mark records the generation's progress (state, attempt count, last
// upstream status) in the store's ledger.
func (f *Flight) Mark(state State, attempts, lastStatus int) {
	f.be.Mark(f, state, attempts, lastStatus)
}

// Append encodes one event with the next id of this generation, adds it
// to the journal and signals subscribers. It fails with ErrStreamTooLarge
// or ErrStoreFull when a bound would be crossed; the owner should then
// Fail the flight.
func (f *Flight) Append(typ, data string) (sse.ID, error) { return f.append(typ, data, false) }

// AppendLine is Append for data of one line, that holds no "\r" or "\n"
// (sse.Scanner.OneLine): it is not searched for line breaks
// (sse.AppendLineEvent).
func (f *Flight) AppendLine(typ, data string) (sse.ID, error) { return f.append(typ, data, true) }

func (f *Flight) append(typ, data string, oneLine bool) (sse.ID, error) {
	f.mu.Lock()
	if f.ended {
		f.mu.Unlock()
		return sse.ID{}, ErrEnded
	}
	id := sse.ID{Gen: f.Gen, Seq: uint64(f.j.events()) + 1}
	wire := id
	if f.Gen == 0 {
		wire = sse.ID{} // a detached flight: no resumable position to name
	}
	n, err := f.j.appendOf(wire, typ, data, oneLine, f.maxBytes)
	if err != nil {
		f.mu.Unlock()
		return sse.ID{}, err
	}
	take := min(n, f.held) // what Hold accounted already
	if err := f.be.Reserve(f, n-take); err != nil {
		f.j.drop(n)
		f.mu.Unlock()
		return sse.ID{}, err
	}
	f.held -= take
	f.reserved += n - take
	if id.Seq == 1 {
		f.first = time.Now()
	}
	f.settleLocked()
	f.signalLocked()
	f.mu.Unlock()
	return id, nil
}

// Hold accounts n bytes of events the owner holds before appending them
// (a stream's preamble) against the store's live bounds, as journal bytes
// are: the Appends that follow use them up before they reserve more. What
// is held and never appended stays accounted until the flight ends, which
// errs on the side of the bound. It fails as Append would, with
// ErrStoreFull or ErrEnded.
func (f *Flight) Hold(n int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		return ErrEnded
	}
	if err := f.be.Reserve(f, n); err != nil {
		return err
	}
	f.held += n
	f.reserved += n
	return nil
}

// settleLocked seals the journal's full blocks that every subscriber has
// read (see journal), when memory asks for it (sealWantedLocked); a
// detached journal drops them instead, which costs nothing. The raw
// blocks a pooled journal sealed go back once no reader holds them.
func (f *Flight) settleLocked() {
	full := f.j.sealed < len(f.j.blocks)-1
	if !full && len(f.j.retired) == 0 || f.j.discard && len(f.subs) == 0 {
		return // nothing full or waiting; or a reader is still to come for what is dropped
	}
	pos := f.j.events()
	held := pos
	for _, s := range f.subs {
		pos, held = min(pos, s.next), min(held, s.held)
	}
	if full && (f.j.discard || f.sealWantedLocked()) {
		f.j.settle(pos)
	}
	f.j.unretire(held)
}

// sealWantedLocked reports whether the journal is to seal the full blocks
// its readers have read (sealPolicy.wants). It asks only when a block has
// filled since it last did: one comparison per append otherwise.
func (f *Flight) sealWantedLocked() bool {
	if f.seal == nil {
		return false
	}
	if n := len(f.j.blocks); n != f.asked {
		f.asked = n
		f.sealNow = f.seal.wants(f.j.size, f.started)
	}
	return f.sealNow
}

func (f *Flight) signalLocked() {
	for _, s := range f.subs {
		select {
		case s.c <- struct{}{}:
		default:
		}
	}
}

// Commit ends the flight as committed: for a stream, its journal is the
// result; for a non-streaming answer, body is. It reports whether the body
// store kept the result (the ledger records the commit either way).
func (f *Flight) Commit(body []byte) (stored bool) {
	f.mu.Lock()
	if f.ended {
		f.mu.Unlock()
		return false
	}
	res := &Result{Scope: f.Scope, Gen: f.Gen, Head: f.head, Usage: f.usage, Trace: f.Trace()}
	if f.head.Stream {
		if !f.j.discard { // a flight no store records keeps no result
			res.packed, res.size = f.j.frames(), f.j.size
			res.Ends = f.j.ends[:len(f.j.ends):len(f.j.ends)]
			if f.j.pooled {
				f.frames = res.packed
			}
		}
	} else {
		res.Data = body
		f.body = body
	}
	f.whole = true
	f.mu.Unlock()

	// The ledger and body store learn of the commit before any subscriber
	// sees the end: a client that saw its stream end and repeats the
	// request at once must find the result.
	stored = f.be.Commit(f, res)
	f.end(StateCommitted, "")
	return stored
}

// Fail ends the flight without a result. body, when not nil, is the
// upstream's own (non-2xx) answer, which joiners receive as it was. A
// store that refuses a commit fails the flight from inside Commit: the
// non-streaming body Commit was given stays the flight's (Unstored).
// ended reports that this call ended it: it had not ended before.
func (f *Flight) Fail(state State, reason string, body []byte) (ended bool) {
	f.mu.Lock()
	if f.ended {
		f.mu.Unlock()
		return false
	}
	if body != nil || !f.whole {
		f.body = body
	}
	f.mu.Unlock()
	f.be.Fail(f, state, reason)
	f.end(state, reason)
	return true
}

// Deny ends the flight as failed_terminal for the upstream's refusal of
// the caller's credential (its 401 or 403 answer, body, which joiners
// receive as Fail's do). Nothing was generated or paid, so the store
// keeps no record of the key once the answer is with the flight's
// clients: a repeat is a new miss. A failed key is otherwise kept for
// FailedTTL, and a client that mints a credential per request would fill
// the ledger with keys nobody will ask for again.
func (f *Flight) Deny(reason string, body []byte) (ended bool) {
	f.mu.Lock()
	if !f.ended {
		f.denied = true
	}
	f.mu.Unlock()
	return f.Fail(StateFailedTerminal, reason, body)
}

// Denied reports whether the flight ends by Deny: its store keeps no
// record of the key (Backend).
func (f *Flight) Denied() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.denied
}

func (f *Flight) end(state State, reason string) {
	f.mu.Lock()
	if f.ended {
		// A store whose commit can be refused (Redis: another replica
		// took the generation over) fails the flight from inside commit;
		// the Commit that called it then finds the flight already ended.
		f.mu.Unlock()
		return
	}
	f.ended = true
	f.state = state
	f.reason = reason
	n := f.reserved
	f.reserved = 0
	f.signalLocked()
	f.freeLocked()
	hadHead := f.hasHead
	f.mu.Unlock()
	f.be.Release(f, n)
	if !hadHead {
		close(f.headReady)
	}
	close(f.done)
}

// freeLocked gives the journal's blocks back to the pools once nothing can
// read them any more. The rule: a slice that Read or ReadSpans returned
// is the Sub's until it reads again or closes (Sub.held), and the WireSince
// of a store that mirrors the journal keeps its slices for good, so only
// a Memory flight's journal is pooled. A sealed block goes back once every
// open Sub has read again past it (journal.unretire); the rest only when
// the flight ended with its commit packed (frames) and no Sub is open, so
// that no slice of them is held. Whoever subscribes after that (a client
// that joined before the end, a resume of the live flight that subscribes
// late) reads a journal that refillLocked unpacked from the frames, never
// the pools' blocks. Nor does a flight no Sub ever followed give them
// back as it ends: a reader is still to come, and reads them raw (a
// generation's own client subscribes before it starts, SubscribeOrigin,
// so only a flight without one is never followed). A
// flight that failed keeps its blocks for the collector: its late
// readers have nothing else to read.
func (f *Flight) freeLocked() {
	if !f.ended || f.frames == nil || f.freed || len(f.subs) > 0 || !f.followed {
		return
	}
	f.j.free()
	f.freed = true
}

// refillLocked makes a journal freeLocked gave back readable again, from
// the committed frames.
func (f *Flight) refillLocked() {
	if !f.freed {
		return
	}
	r := Result{packed: f.frames, size: f.j.size}
	if err := r.Unpack(); err != nil {
		panic("cache: a committed journal does not unpack: " + err.Error()) // it was packed here
	}
	f.j.refill(r.Data)
	f.freed = false
}

// Outcome returns how the flight ended: the final state, the cause of a
// failure, and the non-streaming body. Valid once Done is closed.
func (f *Flight) Outcome() (state State, reason string, body []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state, f.reason, f.body
}

// Unstored reports whether the flight ended with a whole answer that the
// store did not keep: Commit was called, and the store refused it (the
// flight ended failed, commit_unknown where the store may hold it after
// all). Its clients get the answer; the key has no result. Valid once
// Done is closed.
func (f *Flight) Unstored() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.whole && f.ended && f.state != StateCommitted
}

// Events returns the number of events journaled so far.
func (f *Flight) Events() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.j.events()
}

// Subscribe registers a subscriber that receives the events after seq
// (0 for all). Registration and position are taken under the journal's
// lock, so the subscriber sees every later event exactly once. It fails
// with ErrPosition for an event the flight has not journaled, and with
// ErrTooManyFollowers past -max-followers: the subscribers it counts are
// Subscribe's, never the origin's (SubscribeOrigin).
func (f *Flight) Subscribe(after uint64) (*Sub, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if after > uint64(f.j.events()) {
		return nil, ErrPosition
	}
	if f.maxSubs > 0 && f.followers >= f.maxSubs {
		return nil, ErrTooManyFollowers
	}
	s := f.subscribeLocked(after)
	s.follower = true
	f.followers++
	return s, nil
}

// SubscribeOrigin registers the subscriber of the client whose request
// made the flight: every event from the first. It is taken before the
// generation starts, so nothing the flight journals or ends with comes
// before it, and it is no follower: -max-followers neither counts nor
// refuses it, so that a request that made a generation always has a
// place in it, however many joiners come first.
func (f *Flight) SubscribeOrigin() *Sub {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.subscribeLocked(0)
}

func (f *Flight) subscribeLocked(after uint64) *Sub {
	f.refillLocked()
	f.followed = true
	s := &Sub{f: f, next: int(after), held: int(after), c: make(chan struct{}, 1)}
	s.c <- struct{}{} // there may be a backlog to read at once
	f.subs = append(f.subs, s)
	return s
}

// Sub follows one Flight for one client.
type Sub struct {
	f    *Flight
	next int // index of the next event to deliver
	// held: the first event of what the last Read returned, which the
	// reader may still hold (it is done with it once it reads again).
	held   int
	c      chan struct{}
	closed bool // guarded by f.mu
	// follower: counted among the flight's followers (Subscribe); set
	// before the Sub is handed out.
	follower bool
}

// C receives a signal whenever there may be something new to Read.
func (s *Sub) C() <-chan struct{} { return s.c }

// Read returns encoded events not yet delivered, as one slice, and
// whether the flight has ended with nothing left to read after p. The
// slice stays valid until the Sub reads again or closes: calling Read
// says the reader is done with what the last one returned, and the
// journal may then reuse that memory, for its own events (a detached
// flight, NewDetached) or for another stream's (a Memory flight's blocks
// go back to pools, freeLocked). A backlog longer than one journal block
// comes in several Reads; C is signalled again while any is left, so one
// Read per signal never strands a reader. A Sub that was closed reads
// nothing, and never reads as ended.
func (s *Sub) Read() (p []byte, ended bool) {
	var one [1][]byte
	spans, ended := s.ReadSpans(one[:0])
	if len(spans) > 0 {
		p = spans[0]
	}
	return p, ended
}

// ReadSpans is Read for a reader that writes several spans at once: it
// appends to dst, up to its capacity, the spans of everything not yet
// delivered (a backlog beyond them comes in later calls, signalled on C
// as for Read). One ReadSpans is one Read: the reader must be done with
// all the spans before it reads again.
func (s *Sub) ReadSpans(dst [][]byte) (spans [][]byte, ended bool) {
	f := s.f
	f.mu.Lock()
	if s.closed {
		f.mu.Unlock()
		return dst, false
	}
	n := f.j.events()
	s.held = s.next
	if s.next == n {
		f.j.recycle()
	}
	for s.next < n && len(dst) < cap(dst) {
		var p []byte
		p, s.next = f.j.span(s.next, n)
		dst = append(dst, p)
	}
	ended = f.ended && s.next == n
	f.settleLocked()
	if s.next < n {
		select {
		case s.c <- struct{}{}:
		default:
		}
	}
	f.mu.Unlock()
	return dst, ended
}

// Position returns the seq of the last event Read has returned.
func (s *Sub) Position() uint64 {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	return uint64(s.next)
}

// Close unregisters the subscriber, which must be done with every slice
// it read. It is safe to call more than once.
func (s *Sub) Close() {
	f := s.f
	f.mu.Lock()
	s.closed = true
	for i, x := range f.subs {
		if x == s {
			if s.follower {
				f.followers--
			}
			last := len(f.subs) - 1
			f.subs[i] = f.subs[last]
			f.subs[last] = nil
			f.subs = f.subs[:last]
			break
		}
	}
	f.settleLocked()
	f.freeLocked()
	f.mu.Unlock()
}

// AppendWire adds one event that is already encoded, id included: an
// event another replica journaled, which a follower flight copies byte for
// byte so that every replica serves the owner's exact bytes and ids. seq
// must be the next seq of this journal. A Backend's flight only
// (Journals.NewFlight): it reserves the bytes as Append does.
func (f *Flight) AppendWire(seq uint64, wire []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		return ErrEnded
	}
	if want := uint64(f.j.events()) + 1; seq != want {
		return fmt.Errorf("event %d-%d arrived where %d-%d was due", f.Gen, seq, f.Gen, want)
	}
	if err := f.j.appendWire(wire, f.maxBytes); err != nil {
		return err
	}
	if err := f.be.Reserve(f, len(wire)); err != nil {
		f.j.drop(len(wire))
		return err
	}
	f.reserved += len(wire)
	if seq == 1 {
		f.first = time.Now()
	}
	f.settleLocked()
	f.signalLocked()
	return nil
}

// WireSince returns the encoded events after the first from ones, at most
// maxEvents of them, each as its own slice (valid for good: the journal is
// never rewritten), with the head as it stands. A store that mirrors the
// journal elsewhere reads it with this (Backend).
func (f *Flight) WireSince(from, maxEvents int) (evs [][]byte, h Head, hasHead bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refillLocked()
	n := min(f.j.events(), from+maxEvents)
	for i := from; i < n; i++ {
		evs = append(evs, f.j.event(i))
	}
	return evs, f.head, f.hasHead
}
