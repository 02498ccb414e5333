package proxy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ssegate/ssegate/cache"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/ssegate/ssegate/sse"
)

// TestCauseTable: every cause has a whole row, names are unique, every
// reason the detector gives and every reason the stores give has its own
// row, and names read back as their cause.
func TestCauseTable(t *testing.T) {
	t.Parallel()
	types := map[string]bool{ // docs/design.md, Errors
		"invalid_idempotency_key": true, "invalid_last_event_id": true, "credential_required": true,
		"invalid_resume_token": true, "stream_not_found": true, "key_not_found": true, "not_found": true,
		"idempotency_in_flight": true, "stream_gone": true, "idempotency_conflict": true,
		"request_too_large": true, "invalid_request": true, "capacity_exceeded": true,
		"store_unavailable": true, "shutting_down": true, "upstream_unavailable": true,
		"upstream_error": true, "upstream_timeout": true,
	}
	states := map[cache.State]bool{"": true, cache.StateFailedRetryable: true, cache.StateFailedTerminal: true, cache.StateCommitUnknown: true}
	seen := map[string]cause{}
	for c := causeNone + 1; c < numCauses; c++ {
		r := causes[c]
		if r.name == "" || r.status < 400 || r.msg == "" || !types[r.typ] || !states[r.state] {
			t.Errorf("cause %d (%q): incomplete row %+v", c, r.name, r)
		}
		if r.verdict != upstream.Final && r.state == "" {
			t.Errorf("%v: an attempt's cause without the key state it leaves", c)
		}
		if r.fallback && (r.verdict == upstream.Ambiguous || r.state != cache.StateFailedRetryable) {
			t.Errorf("%v: falls back, yet the model may have run the request (verdict %v, state %q)", c, r.verdict, r.state)
		}
		if prev, dup := seen[r.name]; dup {
			t.Errorf("%v: name used by cause %d too", c, prev)
		}
		seen[r.name] = c
		if causeOf(r.name) != c {
			t.Errorf("causeOf(%q) = %v; want %v", r.name, causeOf(r.name), c)
		}
	}
	for _, reason := range sse.Reasons {
		if c := causeOf(reason); causes[c].name != reason || causes[c].abort == "" {
			t.Errorf("detector reason %q: no row with an abort message", reason)
		}
	}
	// The provider's own ends are relayed as they came, without
	// stream_aborted: every detector reason but those that say the
	// provider did not end the stream, or that its end would pass a half
	// answer for a whole one.
	half := []string{sse.ReasonNoTerminalEvent, sse.ReasonMalformedEvent, sse.ReasonNoChoices, sse.ReasonMissingChoice,
		sse.ReasonMissingFinishReason, sse.ReasonSequenceGap}
	for _, reason := range sse.Reasons {
		stated := !slices.Contains(half, reason)
		if relayEnd(reason) != stated || (endFrame(cache.StateFailedRetryable, reason) == nil) != stated {
			t.Errorf("detector reason %q: relayEnd %v; want %v", reason, relayEnd(reason), stated)
		}
	}
	for c := causeNone + 1; c < numCauses; c++ {
		if causes[c].relayEnd && !slices.Contains(sse.Reasons, causes[c].name) {
			t.Errorf("%v: relayEnd for a cause that is no detector reason", c)
		}
	}
	for _, reason := range cache.Reasons {
		if c := causeOf(reason); causes[c].name != reason || causes[c].abort == "" {
			t.Errorf("store reason %q: no row with an abort message", reason)
		}
	}
	for status, want := range map[int]cause{400: causeUpstreamRefused, 404: causeUpstreamRefused, 429: causeUpstreamFailed, 500: causeUpstreamFailed, 503: causeUpstreamFailed} {
		c := causeOf(upstreamStatus(status).reason(status))
		if c != want || causes[c].state != map[cause]cache.State{causeUpstreamRefused: cache.StateFailedTerminal, causeUpstreamFailed: cache.StateFailedRetryable}[want] {
			t.Errorf("upstream status %d: cause %v; want %v", status, c, want)
		}
	}
	if c := causeOf("a_reason_of_a_newer_replica"); c != causeUncleanEnd {
		t.Errorf("unknown reason: got %v; want unclean_end", c)
	}
	if got := causeOf("a_reason_of_a_newer_replica").abortMessage(); !strings.Contains(got, "did not end cleanly") {
		t.Errorf("unknown reason's abort message: %q", got)
	}
}

// TestCausesChooseEveryStatus: the cause table is the only place an error
// answer is built: no other file of the package builds an apiError, or
// names an error type or a stream_aborted code in a string of its own.
func TestCausesChooseEveryStatus(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	built := regexp.MustCompile(`apiError\{|typ: "|abortEvent\("|"type":`)
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "causes.go" {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "//") || strings.Contains(line, "func abortEvent(") {
				continue
			}
			if built.MatchString(line) {
				t.Errorf("%s:%d builds an error answer outside causes.go: %s", name, i+1, strings.TrimSpace(line))
			}
		}
	}
}
