package cache

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ssegate/ssegate/sse"
)

// maxStoredRatio bounds a committed blob's size against the raw bytes of
// the journal it was committed from.
const maxStoredRatio = 0.35

// TestStoredRatioFixtures journals each recorded stream of sse/testdata
// (the whole set one after the other, as a longer stream, too) with one
// subscriber that keeps up, commits it, and holds the stored blob to
// maxStoredRatio of the raw bytes. A stream of under 4 KiB is only
// logged: the head and the blob's framing weigh more than its events.
func TestStoredRatioFixtures(t *testing.T) {
	names, err := filepath.Glob(filepath.Join("..", "sse", "testdata", "*.sse"))
	if err != nil || len(names) == 0 {
		t.Fatalf("fixtures: %v (%d found)", err, len(names))
	}
	var all []sse.Event
	streams := map[string][]sse.Event{}
	for _, name := range names {
		body, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for ev, err := range sse.Read(strings.NewReader(string(body)), 0) {
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			streams[filepath.Base(name)] = append(streams[filepath.Base(name)], ev)
		}
		all = append(all, streams[filepath.Base(name)]...)
	}
	var long []sse.Event
	for range 20 {
		long = append(long, all...)
	}
	streams["all×20"] = long
	m := newMemory(t, Config{})
	for _, name := range slices.Sorted(maps.Keys(streams)) {
		evs := streams[name]
		sc := Scope{Tenant: "t", Key: name}
		f := claim(t, m, sc, "fp")
		f.SetHead(streamHead)
		s, err := f.Subscribe(0)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if _, err := f.Append(ev.Type, ev.Data); err != nil {
				t.Fatal(err)
			}
			s.Read()
		}
		s.Close()
		if !f.Commit(nil) {
			t.Fatalf("%s: the body store did not keep the result", name)
		}
		b, ok := m.bodies.Get(sc.ID())
		if !ok {
			t.Fatalf("%s: no blob", name)
		}
		raw := begin(t, m, sc, "fp").Result.dataSize()
		ratio := float64(len(b.z)) / float64(raw)
		t.Logf("%s: %d events, %d raw bytes, %d stored: %.3f", name, len(evs), raw, len(b.z), ratio)
		if raw >= 4<<10 && ratio > maxStoredRatio {
			t.Errorf("%s: stored %.3f of the raw bytes; want at most %.2f", name, ratio, maxStoredRatio)
		}
	}
}
