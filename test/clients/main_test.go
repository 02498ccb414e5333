package clients_test

import (
	"bufio"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
)

func TestMain(m *testing.M) { gatetest.Main(m) }

// gates runs the built binary, so that the tests drive exactly what an
// operator deploys, with its flag parsing and signal handling, rather than
// the in-package wiring. Processes get SIGTERM and 10 s to drain at the
// end of a test. The probe is a key unknown to this tenant, answered by
// ssegate itself with a 404 without touching the upstream, and served on
// -listen even when -admin-listen moves /healthz elsewhere.
var gates = gatetest.Config{Probe: "/keys/startup-probe", Grace: 10 * time.Second}

// startGate runs ssegate on a free loopback port with args (text logs) and
// waits until it answers HTTP; see [gatetest.Config.Start].
func startGate(t *testing.T, args ...string) *gatetest.Process {
	t.Helper()
	return gates.Start(t, append([]string{"-log-format", "text"}, args...)...)
}

// event is one SSE event as a client received it.
type event struct {
	id, typ, data string
	at            time.Time // when its blank line arrived
}

// readEvents reads an SSE body by hand (so the test does not trust the
// code under test to read what it wrote), calling each with every event
// as it arrives. Comments (": ping") are skipped. It returns the events
// and the error that ended the body, nil for a clean EOF.
func readEvents(r io.Reader, each func(event)) ([]event, error) {
	var evs []event
	var ev event
	var data []string
	seen := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if seen {
				ev.data = strings.Join(data, "\n")
				ev.at = time.Now()
				evs = append(evs, ev)
				if each != nil {
					each(ev)
				}
			}
			ev, data, seen = event{}, nil, false
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id:"):
			ev.id, seen = strings.TrimPrefix(strings.TrimPrefix(line, "id:"), " "), true
		case strings.HasPrefix(line, "event:"):
			ev.typ, seen = strings.TrimPrefix(strings.TrimPrefix(line, "event:"), " "), true
		case strings.HasPrefix(line, "data:"):
			data, seen = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")), true
		}
	}
	err := sc.Err()
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return evs, err
}

// isCI reports whether the tests run in CI, where a missing browser is a
// broken set-up, not a reason to skip.
func isCI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v != "" && v != "false" && v != "0"
}
