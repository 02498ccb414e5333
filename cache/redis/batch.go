package redis

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"
)

// maxBatchItems and maxBatchArgBytes bound one call of a batch script,
// and of renewScript. Redis runs nothing else while a script runs, so a
// call is kept to about a millisecond of it (a renewal costs it ~7 µs
// inside a call), and its keys and arguments to what the server takes in
// a read or two of its query buffer.
const (
	maxBatchItems    = 128
	maxBatchArgBytes = 64 << 10
)

// batchScript runs a script body once per item in one call, so that many
// items cost Redis one script call: its set-up and its reply, not one each.
type batchScript struct{ lua *rueidis.Lua }

// newBatchScript wraps body, written against KEYS and ARGV as a script of
// its own, in a loop over the items of a call. ARGV frames the items, each
// as its count of keys, its count of arguments, then its arguments; KEYS
// holds the items' keys in order. Within body, the item's keys and
// arguments shadow KEYS and ARGV. The call answers one element per item:
// body's answer, nil when it returned none, or the error that ended the
// item (pcall: the other items run, and the writes the item made before
// its error stay, as those of a script that fails do).
//
// Every key of a call must hash to one slot on a Cluster, where a batch
// is one item (or items of one scope).
func newBatchScript(body string) batchScript {
	return batchScript{newScript(`local function item(KEYS, ARGV)
` + body + `
end
local out, k, a, n = {}, 1, 1, #ARGV
while a <= n do
  local nk, na = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local ok, r = pcall(item, {unpack(KEYS, k, k + nk - 1)}, {unpack(ARGV, a + 2, a + 1 + na)})
  if not ok then
    if type(r) ~= 'table' or not r.err then r = {err = tostring(r)} end
  elseif r == nil then
    r = false
  end
  out[#out + 1] = r
  k, a = k + nk, a + 2 + na
end
return out
`)}
}

// batchItem is one run of a batch script's body: its KEYS and ARGV.
type batchItem struct{ keys, args []string }

func (it batchItem) size() int {
	n := 0
	for _, s := range it.keys {
		n += len(s)
	}
	for _, s := range it.args {
		n += len(s)
	}
	return n
}

// batchRuns splits items into runs of at most per items and
// maxBatchArgBytes each (an item larger than that alone gets a run of its
// own): the calls of a batch script that send them.
func batchRuns(items []batchItem, per int) [][]batchItem {
	var runs [][]batchItem
	for len(items) > 0 {
		n, bytes := 0, 0
		for n < len(items) && n < per {
			bytes += items[n].size()
			if n > 0 && bytes > maxBatchArgBytes {
				break
			}
			n++
		}
		runs = append(runs, items[:n:n])
		items = items[n:]
	}
	return runs
}

// exec runs the script's body once per item, in one call, and returns one
// answer per item; an error when the call as a whole failed, in which case
// whether any item ran is unknown.
func (s batchScript) exec(ctx context.Context, c rueidis.Client, items []batchItem) ([]rueidis.RedisMessage, error) {
	var keys []string
	args := make([]string, 0, 2*len(items))
	for _, it := range items {
		keys = append(keys, it.keys...)
		args = append(args, strconv.Itoa(len(it.keys)), strconv.Itoa(len(it.args)))
		args = append(args, it.args...)
	}
	return execItems(ctx, c, s.lua, keys, args, len(items))
}

// execItems runs a script of n items and returns its answer to each; an
// error when the call as a whole failed (whether any item ran is then
// unknown) or did not answer each item.
func execItems(ctx context.Context, c rueidis.Client, lua *rueidis.Lua, keys, args []string, n int) ([]rueidis.RedisMessage, error) {
	out, err := exec(ctx, c, lua, keys, args).ToArray()
	if err != nil {
		return nil, err
	}
	if len(out) != n {
		return nil, fmt.Errorf("script of %d items: %d answers", n, len(out))
	}
	return out, nil
}
