package cache

import (
	"errors"
	"time"
)

// Tool describes a key that stands for an MCP tool call, for BeginTool:
// a call whose outcome is unknown holds its key, so that a re-issue is
// told so rather than run again.
type Tool struct {
	// Name is the tool's name, shown by Info.
	Name string
	// Keep is how long a committed call's key and answer stand (0: the
	// store's TTL); a key derived from the call's arguments stands for
	// its window only.
	Keep time.Duration
	// UnknownTTL is how long a call that ended commit_unknown holds its
	// key (0: the store's FailedTTL).
	UnknownTTL time.Duration
}

// ErrLive is Forget's answer for a key whose generation is running.
var ErrLive = errors.New("the key's generation is running")

// KeepFor is how long the ledger keeps the key of f after it ended in
// state, given the store's own TTL (committed) and FailedTTL.
func (f *Flight) KeepFor(state State, ttl, failedTTL time.Duration) time.Duration {
	return f.tool.KeepFor(state, ttl, failedTTL)
}

// KeepFor is how long a key of the tool call t (nil: of no tool call) is
// kept after its end in state.
func (t *Tool) KeepFor(state State, ttl, failedTTL time.Duration) time.Duration {
	switch {
	case t == nil:
	case state == StateCommitted && t.Keep > 0:
		return t.Keep
	case state == StateCommitUnknown && t.UnknownTTL > 0:
		return t.UnknownTTL
	}
	if state == StateCommitted {
		return ttl
	}
	return failedTTL
}

// heldUnknown reports whether a key in state, of the tool name tool,
// answers BeginTool with Unknown: a tool call whose outcome is unknown.
func heldUnknown(state State, tool string) bool {
	return state == StateCommitUnknown && tool != ""
}
