package cache

import (
	"log/slog"
	"time"
)

// Scope names one idempotency key of one tenant. Tenant is a hash of the
// caller's credential, never the credential itself.
//
// Accounts are what the key is counted against, by every per-tenant
// bound (Limits: keys, live bytes, tool calls held): a hash of each
// secret credential the request carries, alone, whatever header carries
// it, so that a client cannot escape a bound by adding, varying or
// omitting credentials the upstream ignores. Empty: the tenant is the one
// account (a request with no secret credential, and the scopes a store's
// own callers make). Accounts never name a key: two scopes with the same
// Tenant and Key are one key whatever their Accounts (Scope.Same).
type Scope struct {
	Tenant   string
	Key      string
	Accounts []string
}

// ID is the one string that names s's key: its tenant and key, never
// its Accounts.
func (s Scope) ID() string { return s.Tenant + "\x00" + s.Key }

// LogValue logs s as a group of its tenant and key (slog.LogValuer), so
// that a log line names a key with one attribute, "scope", as
// scope.tenant and scope.key. Accounts are left out: they say only what
// the key counts against.
func (s Scope) LogValue() slog.Value {
	return slog.GroupValue(slog.String("tenant", s.Tenant), slog.String("key", s.Key))
}

// Same reports whether s and o name the same key.
func (s Scope) Same(o Scope) bool { return s.Tenant == o.Tenant && s.Key == o.Key }

// Charged returns the names of the accounts s's key is counted against:
// Accounts, or the tenant alone.
func (s Scope) Charged() []string {
	if len(s.Accounts) == 0 {
		return []string{s.Tenant}
	}
	return s.Accounts
}

// Account returns the first of s's accounts, the one whose keys are kept
// by expiry (Memory) and whose commit makes it known
// (Limits.MaxStrangerKeys).
func (s Scope) Account() string {
	if len(s.Accounts) == 0 {
		return s.Tenant
	}
	return s.Accounts[0]
}

// State is a key's place in its lifecycle, as docs/design.md, Key states, names it.
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

// Fallback is a model a generation gave up on for the next one, and why
// (the cause of its last attempt's failure).
type Fallback struct {
	Model  string `json:"model"`
	Reason string `json:"reason"`
}

// Decision is what Begin decided for a request with a key.
type Decision int

// The decisions of the table in docs/design.md, Request decision.
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
	// Unknown: the key is a tool call whose outcome is unknown
	// (BeginTool): it must not run again.
	Unknown
)

var decisionNames = [...]string{"miss", "join", "hit", "conflict", "gone", "unknown"}

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
	State      State  `json:"state"`
	Generation uint64 `json:"generation"`
	Attempts   int    `json:"attempts"`
	LastStatus int    `json:"last_upstream_status,omitempty"`
	Events     int    `json:"events"`
	Bytes      int    `json:"bytes"`
	BodyStored bool   `json:"body_stored"`
	Reason     string `json:"reason,omitempty"`
	// Model is the model of the generation's last attempt: the one that
	// answered, once committed. Fallbacks are the models given up on
	// before it (the proxy's -fallback), each with why.
	Model     string     `json:"model,omitempty"`
	Fallbacks []Fallback `json:"fallbacks,omitempty"`
	// Tool is the tool's name when the key is an MCP tool call.
	Tool    string    `json:"tool,omitempty"`
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
	Expires time.Time `json:"expires"`
}
