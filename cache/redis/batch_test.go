package redis

import (
	"strings"
	"testing"

	"github.com/redis/rueidis"
	"github.com/ssegate/ssegate/internal/redistest"
)

// TestBatchScript: a batch script runs its body once per item, each with
// its own KEYS and ARGV, and answers each item apart: an item whose
// command fails gets its error, and the items after it still run.
func TestBatchScript(t *testing.T) {
	t.Parallel()
	r := newRedis(t, redistest.Shared(t), redistest.Prefix(t), nil)
	s := newBatchScript(`
if ARGV[1] == 'none' then return end
redis.call('INCR', KEYS[1])
return {KEYS[1], #KEYS, #ARGV}`)
	p := redistest.Prefix(t)
	text := p + ":{x}:text"
	if err := r.c.Do(r.ctx, r.c.B().Set().Key(text).Value("not a number").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	out, err := s.exec(r.ctx, r.c, []batchItem{
		{keys: []string{p + ":{x}:a"}, args: []string{"x", "y"}},
		{keys: []string{text}},
		{keys: []string{p + ":{x}:b", p + ":{x}:c"}, args: []string{"none"}},
		{keys: []string{p + ":{x}:b"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := func(i int, key string, keys, args int64) {
		t.Helper()
		a, err := out[i].ToArray()
		if err != nil || len(a) != 3 {
			t.Fatalf("item %d: %v %v; want {%s, %d, %d}", i, a, err, key, keys, args)
		}
		k, _ := a[0].ToString()
		nk, _ := a[1].AsInt64()
		na, _ := a[2].AsInt64()
		if k != key || nk != keys || na != args {
			t.Fatalf("item %d: {%s, %d, %d}; want {%s, %d, %d}", i, k, nk, na, key, keys, args)
		}
	}
	want(0, p+":{x}:a", 1, 2)
	if err := out[1].Error(); err == nil || !strings.Contains(err.Error(), "not an integer") {
		t.Fatalf("item 1 (INCR of a text): got error %v; want Redis's", err)
	}
	if err := out[2].Error(); !rueidis.IsRedisNil(err) {
		t.Fatalf("item 2 (no answer): got %v; want nil", err)
	}
	want(3, p+":{x}:b", 1, 0)
}

// TestBatchRuns: items are split into runs of at most per items and
// maxBatchArgBytes, an item larger than that alone in a run of its own.
func TestBatchRuns(t *testing.T) {
	t.Parallel()
	item := func(n int) batchItem { return batchItem{keys: []string{"k"}, args: []string{strings.Repeat("a", n-1)}} }
	var items []batchItem
	for range 5 {
		items = append(items, item(10))
	}
	items = append(items, item(maxBatchArgBytes/2), item(maxBatchArgBytes/2), item(1), item(2*maxBatchArgBytes), item(1))
	var got []int
	for _, run := range batchRuns(items, 3) {
		got = append(got, len(run))
	}
	want := []int{3, 3, 2, 1, 1} // 10 10 10 | 10 10 half | half 1 | huge | 1
	if len(got) != len(want) {
		t.Fatalf("runs: got %v; want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("runs: got %v; want %v", got, want)
		}
	}
}
