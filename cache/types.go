package cache

import (
	"errors"
	"time"
)

// Scope names one idempotency key of one tenant. Tenant is a hash of the
// caller's credential, never the credential itself.
type Scope struct {
	Tenant string
	Key    string
}

func (s Scope) id() string { return s.Tenant + "\x00" + s.Key }

// State is a key's place in its lifecycle, as DESIGN.md names it.
type State string

// The states of a key.
const (
	StateIntentReceived   State = "intent_received"
	StateExecutionStarted State = "execution_started"
	StateCommitted        State = "committed"
	StateFailedRetryable  State = "failed_retryable"
	StateFailedTerminal   State = "failed_terminal"
	StateCommitUnknown    State = "commit_unknown"
)

// Live reports whether a generation may still produce events in this state.
func (s State) Live() bool { return s == StateIntentReceived || s == StateExecutionStarted }

// Header is one response header kept with a generation's head.
type Header struct {
	Name, Value string
}

// Head is the start of an upstream answer: what a replay needs to answer
// with the same status and headers.
type Head struct {
	Status      int
	ContentType string
	// Stream is true for a text/event-stream answer relayed as events.
	Stream bool
	// Header holds the end-to-end upstream headers worth replaying.
	Header []Header
}

// Errors a caller branches on.
var (
	// ErrNotFound: the store holds nothing for the scope.
	ErrNotFound = errors.New("stream not found")
	// ErrGone: the position names a generation that aborted, was replaced,
	// or whose body is no longer held.
	ErrGone = errors.New("stream gone")
	// ErrPosition: the position names the right generation but an event it
	// never had.
	ErrPosition = errors.New("position beyond the stream")
	// ErrStreamTooLarge: one generation exceeded the bytes allowed per stream.
	ErrStreamTooLarge = errors.New("stream exceeds the per-stream byte bound")
	// ErrStoreFull: the live journals together hold the byte bound, or the
	// ledger holds its maximum number of keys.
	ErrStoreFull = errors.New("store is full")
	// ErrTenantFull: the tenant holds its maximum number of keys
	// (Limits.MaxKeysPerTenant), so a new key of its is refused; other
	// tenants' new keys are not. It is not ErrStoreFull.
	ErrTenantFull = errors.New("too many keys for one tenant")
	// ErrConflict: the key belongs to a request with another fingerprint.
	ErrConflict = errors.New("key used with another request")
	// ErrEnded: the generation has already ended; nothing more may be added.
	ErrEnded = errors.New("generation already ended")
)

// Decision is what Begin decided for a request with a key.
type Decision int

// The decisions of DESIGN.md's table.
const (
	// Miss: the caller claimed the key and owns the returned Flight.
	Miss Decision = iota
	// Join: a generation with the same fingerprint is live.
	Join
	// Hit: a committed result with the same fingerprint is stored.
	Hit
	// Conflict: the key is live or committed with another fingerprint.
	Conflict
	// Gone: the key is committed but its body is no longer held and the
	// store's policy is not to regenerate.
	Gone
)

var decisionNames = [...]string{"miss", "join", "hit", "conflict", "gone"}

func (d Decision) String() string { return decisionNames[d] }

// Begun is the result of Begin.
type Begun struct {
	Decision Decision
	// Flight is set on Miss (owned by the caller) and Join.
	Flight *Flight
	// Result is set on Hit.
	Result *Result
	// Regenerated is true on a Miss that replaces a committed result whose
	// body the store no longer held.
	Regenerated bool
}

// KeyInfo is what the ledger knows of one key, for GET /keys/{key}.
type KeyInfo struct {
	State      State     `json:"state"`
	Generation uint64    `json:"generation"`
	Attempts   int       `json:"attempts"`
	LastStatus int       `json:"last_upstream_status,omitempty"`
	Events     int       `json:"events"`
	Bytes      int       `json:"bytes"`
	BodyStored bool      `json:"body_stored"`
	Reason     string    `json:"reason,omitempty"`
	Created    time.Time `json:"created"`
	Updated    time.Time `json:"updated"`
	Expires    time.Time `json:"expires"`
}
