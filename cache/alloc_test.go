//go:build !race

package cache

import "testing"

// TestReadPathAllocs holds the replay and follow paths to zero
// allocations; the race detector's instrumentation allocates, hence the
// build tag. It is not parallel: AllocsPerRun counts the allocations of
// every goroutine, so another test running beside it would count too.
func TestReadPathAllocs(t *testing.T) {
	m := newMemory(t, Config{})
	sc := Scope{Tenant: "t", Key: "k"}
	f := claim(t, m, sc, "fp")
	f.SetHead(streamHead)
	appendN(t, f, 1, 200)
	s, err := f.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	f.Commit(nil)
	r := begin(t, m, sc, "fp").Result
	tests := []struct {
		name string
		fn   func()
	}{
		{"Result.After", func() { _, _ = r.After(100) }},
		{"Sub.Read", func() { _, _ = s.Read() }},
		{"Sub.Position", func() { _ = s.Position() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := testing.AllocsPerRun(100, tt.fn); got != 0 {
				t.Errorf("got %v allocs; want 0", got)
			}
		})
	}
}
