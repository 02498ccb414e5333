package cache

import (
	"context"
	"strconv"

	"github.com/redis/rueidis"
)

// scriptItem is one run of a body under manyScript: its own KEYS and ARGV.
type scriptItem struct {
	keys, args []string
}

// manyLua runs a body written against KEYS and ARGV once per item, in one
// script call. ARGV starts with the item count, then each item's key and
// argument counts; the items' keys and arguments follow in order. Each
// run gets its own KEYS and ARGV, which shadow the globals, and is run
// under pcall, so that one item's error reply is its answer alone.
type manyLua struct{ *rueidis.Lua }

func manyScript(body string) manyLua {
	return manyLua{rueidis.NewLuaScript(`
local body = function(KEYS, ARGV)
` + body + `
end
local n = tonumber(ARGV[1])
local out = {}
local k, a = 0, 1 + 2 * n
for i = 1, n do
  local nk, na = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local ks, as = {}, {}
  for j = 1, nk do ks[j] = KEYS[k + j] end
  for j = 1, na do as[j] = ARGV[a + j] end
  k, a = k + nk, a + na
  local ok, r = pcall(body, ks, as)
  if ok then
    out[i] = r
  elseif type(r) == 'table' and r.err then
    out[i] = r
  else
    out[i] = redis.error_reply(tostring(r))
  end
end
return out
`)}
}

// Exec runs the body over items in one call and returns one answer per
// item, or the call's error.
func (m manyLua) Exec(ctx context.Context, c rueidis.Client, items []scriptItem) ([]rueidis.RedisMessage, error) {
	nk, na := 0, 1+2*len(items)
	for _, it := range items {
		nk += len(it.keys)
		na += len(it.args)
	}
	keys := make([]string, 0, nk)
	args := make([]string, 0, na)
	args = append(args, strconv.Itoa(len(items)))
	for _, it := range items {
		keys = append(keys, it.keys...)
		args = append(args, strconv.Itoa(len(it.keys)), strconv.Itoa(len(it.args)))
	}
	for _, it := range items {
		args = append(args, it.args...)
	}
	return m.Lua.Exec(ctx, c, keys, args).ToArray()
}
