package sse

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixture returns the body of one recorded stream from testdata.
func fixture(tb testing.TB, name string) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".sse"))
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// readAll reads every event of body, failing on a read error.
func readAll(tb testing.TB, body string, maxEventSize int) []Event {
	tb.Helper()
	var evs []Event
	for ev, err := range Read(strings.NewReader(body), maxEventSize) {
		if err != nil {
			tb.Fatalf("Read: got error %v; want none", err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// readUntilError reads the events of body up to its first read error:
// what a fuzzed body yields.
func readUntilError(body []byte) []Event {
	var evs []Event
	for ev, err := range Read(bytes.NewReader(body), 0) {
		if err != nil {
			break
		}
		evs = append(evs, ev)
	}
	return evs
}

// blocks splits an SSE body into its raw events, each ending with "\n\n".
func blocks(body string) []string {
	bs := strings.SplitAfter(body, "\n\n")
	if bs[len(bs)-1] == "" {
		bs = bs[:len(bs)-1]
	}
	return bs
}
