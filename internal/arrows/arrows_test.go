package main

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

// TestTiny measures testdata/tiny, whose arrows its a.go lists: a field,
// a method, a type and a var each make an arrow; a local name that shadows
// a package-level one and a test file make none.
func TestTiny(t *testing.T) {
	g, err := load("testdata/tiny")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range g.files {
		for _, to := range slices.Sorted(maps.Keys(g.out[f])) {
			got = append(got, f+"→"+to)
		}
	}
	want := []string{"a.go→b.go", "a.go→c.go", "b.go→c.go", "c.go→b.go", "c.go→d.go", "d.go→b.go"}
	if !slices.Equal(got, want) {
		t.Errorf("arrows: got %v; want %v", got, want)
	}
	if ord, want := g.order(), []string{"a.go", "c.go", "d.go", "b.go"}; !slices.Equal(ord, want) {
		t.Errorf("order: got %v; want %v", ord, want)
	}
	back := g.backArrows(g.order())
	if back["b.go"] != 1 || len(back) != 1 {
		t.Errorf("back-arrows: got %v; want only b.go: 1", back)
	}
	if n := g.cyclic(); n != 4 {
		t.Errorf("within cycles: got %d; want 4", n)
	}
	if n := g.twoWay(); n != 2 {
		t.Errorf("two-way: got %d; want 2", n)
	}
	var out strings.Builder
	g.report(&out, "tiny", true)
	for _, line := range []string{
		"b.go                              3       1     1",
		"arrows 6, back-arrows 1 (17 %), within cycles 4 (67 %), two-way 2 (33 %)",
		"b.go → c.go (back)",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("report lacks %q:\n%s", line, out.String())
		}
	}
}

// TestOrderWithoutCycles: a package whose files form layers has no
// back-arrow, whatever their names.
func TestOrderWithoutCycles(t *testing.T) {
	g := newGraph([]string{"a.go", "b.go", "c.go", "z.go"})
	g.add("z.go", "c.go")
	g.add("c.go", "b.go")
	g.add("b.go", "a.go")
	g.add("z.go", "a.go")
	g.add("a.go", "a.go") // a file using itself is no arrow
	if n := g.arrows(); n != 4 {
		t.Errorf("arrows: got %d; want 4", n)
	}
	if back := g.backArrows(g.order()); len(back) != 0 {
		t.Errorf("back-arrows: got %v; want none (order %v)", back, g.order())
	}
	if n := g.cyclic(); n != 0 {
		t.Errorf("within cycles: got %d; want 0", n)
	}
}
