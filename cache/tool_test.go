package cache

import (
	"errors"
	"testing"
	"time"
)

// TestToolUnknownHeld: a tool call that ended commit_unknown answers its
// re-issues Unknown (Conflict with another fingerprint) until its own
// time passes or it is forgotten, where any other key in that state is
// free; a running key cannot be forgotten; a committed tool call's key
// stands for its Keep.
func TestToolUnknownHeld(t *testing.T) {
	clk := newClock()
	m := newMemory(t, Config{TTL: time.Hour, FailedTTL: time.Minute, Now: clk.Now})
	tool := Tool{Name: "write", Keep: 10 * time.Minute, UnknownTTL: 5 * time.Hour}
	sc := Scope{Tenant: "t", Key: "k"}

	b, err := m.BeginTool(sc, "fp", tool)
	if err != nil || b.Decision != Miss {
		t.Fatalf("first call: %v %v", b.Decision, err)
	}
	if err := m.Forget(sc); !errors.Is(err, ErrLive) {
		t.Fatalf("Forget of a running key: %v; want ErrLive", err)
	}
	b.Flight.SetHead(Head{Status: 200})
	b.Flight.Fail(StateCommitUnknown, "upstream_reset", nil)
	if n := m.ToolUnknowns(); n != 1 {
		t.Fatalf("ToolUnknowns: %d; want 1", n)
	}
	clk.Advance(time.Hour) // past FailedTTL, within UnknownTTL
	if b, _ := m.BeginTool(sc, "fp", tool); b.Decision != Unknown {
		t.Fatalf("re-issue: %v; want unknown", b.Decision)
	}
	if b, _ := m.BeginTool(sc, "other", tool); b.Decision != Conflict {
		t.Fatalf("other fingerprint: %v; want conflict", b.Decision)
	}
	if b, _ := m.Begin(sc, "fp"); b.Decision != Conflict {
		t.Fatalf("a request that is no tool call: %v; want conflict", b.Decision)
	}
	if ki, _ := m.Info(sc); ki.Tool != "write" || ki.State != StateCommitUnknown {
		t.Fatalf("Info: %+v", ki)
	}
	if err := m.Forget(sc); err != nil {
		t.Fatalf("Forget: %v", err)
	}
	if n := m.ToolUnknowns(); n != 0 {
		t.Fatalf("ToolUnknowns after Forget: %d; want 0", n)
	}
	b, _ = m.BeginTool(sc, "fp", tool)
	if b.Decision != Miss {
		t.Fatalf("after Forget: %v; want miss", b.Decision)
	}
	b.Flight.SetHead(Head{Status: 200, ContentType: "application/json"})
	b.Flight.Commit([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`))
	clk.Advance(9 * time.Minute)
	if b, _ := m.BeginTool(sc, "fp", tool); b.Decision != Hit {
		t.Fatalf("within Keep: %v; want hit", b.Decision)
	}
	clk.Advance(2 * time.Minute)
	if b, _ := m.BeginTool(sc, "fp", tool); b.Decision != Miss {
		t.Fatalf("past Keep: %v; want miss", b.Decision)
	}

	// An LLM key left commit_unknown is free, as before.
	llm := Scope{Tenant: "t", Key: "llm"}
	b, _ = m.Begin(llm, "fp")
	b.Flight.Fail(StateCommitUnknown, "upstream_reset", nil)
	if b, _ := m.Begin(llm, "fp"); b.Decision != Miss {
		t.Fatalf("an LLM key's commit_unknown: %v; want miss", b.Decision)
	}
}

// TestToolBodyGoneNotRun: a committed tool call whose stored answer is
// gone (ristretto dropped or evicted it; Redis evicted the result) is Gone
// to its re-issue, never a Miss that would run the tool again, whatever
// MissingBody says for LLM keys.
func TestToolBodyGoneNotRun(t *testing.T) {
	tool := Tool{Name: "write", UnknownTTL: time.Hour}
	sc := Scope{Tenant: "t", Key: "gone"}
	commit := func(b Begun, err error) {
		t.Helper()
		if err != nil || b.Decision != Miss {
			t.Fatalf("first call: %v %v; want miss", b.Decision, err)
		}
		b.Flight.SetHead(Head{Status: 200, ContentType: "application/json"})
		if !b.Flight.Commit([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`)) {
			t.Fatal("Commit: got false")
		}
	}
	t.Run("memory", func(t *testing.T) {
		m := newMemory(t, Config{TTL: time.Hour, MissingBody: Regenerate})
		commit(m.BeginTool(sc, "fp", tool))
		m.DropBody(sc)
		if b, err := m.BeginTool(sc, "fp", tool); err != nil || b.Decision != Gone {
			t.Fatalf("re-issue after the body went: %v %v; want gone", b.Decision, err)
		}
	})
}
