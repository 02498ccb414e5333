package redis

import (
	"context"
	"errors"
	"fmt"
	"github.com/ssegate/ssegate/cache"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// The Lua scripts of the Redis store. Each runs atomically on the server
// and makes every check before its first write, so a script that refuses
// leaves nothing behind. All keys of one scope share a hash tag, so the
// scripts are legal on a Redis Cluster too.
//
// Keys of a scope (prefix:{h}:…):
//
//	st     HASH    phase (live|done|failed|lost), state (docs/design.md, Key states),
//	               gen, tok, fp, owner, created, updated, attempts, status,
//	               reason, events, bytes, commits, regen and reaped (what
//	               the claim answered, for a re-claim: claimScript), want
//	               (set by a follower on another replica: mirror the journal);
//	               tool and utl for an MCP tool call (BeginTool): its name,
//	               and how long its commit_unknown holds the key (ms);
//	               reaper, the token of the claim or follower that ended
//	               the generation lost (loseLua)
//	lease  STRING  the owner's token; a failure detector only, renewed
//	               every Lease/3. Ownership is (tok, gen) in st.
//	j      STREAM  entry ids <gen>-<seq>; seq 1..n carry the events
//	               (field e: the encoded event, id included; field h on
//	               seq 1: the head), <gen>-maxSeq ends the generation
//	               (field t: done|failed|lost). It is made by the first
//	               batch written once want is set, or by a terminal entry:
//	               a generation nobody followed has none while live, nor
//	               once committed. A journal without entries of the
//	               generation in st ends, for the scripts, at <gen>-0; it
//	               may hold an earlier generation's entries, when st
//	               expired before it (the first batch deletes them).
//	res    STRING  the committed result, compressed (see blob.go)
//
// Each tenant also has a sorted set of its keys, in its own slot, for
// the bound on keys per tenant (quota.go holds it and its scripts),
// and each replica an inbox (a LIST, prefix:inbox:{digest of its name})
// where followers push "<h> <gen>" to ask it to mirror a journal.
//
// Generations come from the server's clock (TIME in ms, or the previous
// generation + 1 when the clock has not moved past it), so they increase
// per scope across replicas without a replica's clock taking part.

// errEmptyAnswer is an answer no script gives: an empty array.
var errEmptyAnswer = errors.New("empty script answer")

// scriptStrings reads a script's array of strings.
func scriptStrings(res rueidis.RedisResult) ([]string, error) {
	arr, err := res.AsStrSlice()
	if err != nil {
		return nil, err
	}
	if len(arr) == 0 {
		return nil, errEmptyAnswer
	}
	return arr, nil
}

// scriptArgs are the keys and arguments of one call of a script: a
// struct per script, whose keysArgs yields KEYS and ARGV in the order
// the script names them in locals at its top.
type scriptArgs interface {
	keysArgs() (keys, argv []string)
}

// run runs s with a's keys and arguments.
func run(ctx context.Context, c rueidis.Client, s *rueidis.Lua, a scriptArgs) rueidis.RedisResult {
	keys, argv := a.keysArgs()
	return exec(ctx, c, s, keys, argv)
}

// flag is the scripts' word for a boolean argument: "1" or "0".
func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// maxSeq is the seq of a generation's terminal entry: nothing of the
// generation can be appended after it, even by a raw XADD.
const maxSeq = "18446744073709551615"

// claimScript decides a request: conflict, replay, join, gone or miss.
//
// It is safe to repeat with the same token, which is what makes it
// retryable (rueidis re-sends it after a network error, within the
// claim's timeout): a claim that finds the key live under its own token
// ran before and lost its reply, so the key is its caller's, and it
// answers "miss" again (with the lease set again) where a stranger's
// claim would join a generation nobody runs.
//
// On a standalone Redis the claim also counts the key (sharedKeys): a
// key with no record against its tenant's and the global bounds, a key
// the ledger held and claimed again as live whatever the bounds, all
// checks made before the first write. On a Cluster those sets are in
// other slots: a key with no record answers "new" and the caller counts
// it with quotaScript and globalScript, then claims again.
//
// KEYS: st, lease, j, res, and on a standalone Redis the tenant's set,
// its known marker, the sets of all keys, of strangers' keys and of
// commit_unknown keys
// ARGV: fp, tok, owner, lease ms, live ttl ms, now ms, refuse (1 when a
// committed key whose body is gone must not regenerate), ask (1 when a
// key with no record must be counted against its tenant first; 2 when
// this replica refuses a new key of the tenant: its claim answers "new"
// and writes nothing), tool (the tool's name for a tool call: BeginTool;
// empty otherwise), unknown ttl ms (how long a tool call that ended
// commit_unknown holds its key), then with the count's keys: bound per
// tenant, bound on all keys, bound on strangers' keys (-1: none), set
// ttl ms, member (the scope's hash), and which of the tenant's set, the
// set of all keys and that of strangers' keys to renew the expiry of (a
// character each, 0 for not: the caller renewed it within
// setRenewEvery; the count renews a set it finds empty whatever this
// says)
//
// A claim that finds its token fenced by abandonScript, or naming a
// generation that has ended, is a copy that reached Redis late (held in
// a connection's buffers, or sent again by rueidis after its caller gave
// up): it answers {"stale"} and writes nothing, so that a generation
// nobody owns is never made after its clean-up ran.
//
// Returns {"stale"}, {"conflict"}, {"replay", gen}, {"join", gen}, {"gone"},
// {"unknown", gen, held} (a tool call whose outcome is unknown; held is
// the ms it holds its key when this claim reaped its dead owner's
// generation to it, or the ms left when it did so in a run whose reply
// was lost ('reaper' is its token), "" otherwise), {"conflict", held}
// likewise, {"cancelled", gen} (a generation stopped by its tenant: the
// key is held cancelled),
// {"new"} (with ask: nothing was written), {"full", 0|-1|-2} (counted
// here: the tenant, all keys, or strangers' keys hold their bound;
// nothing was written), or {"miss", gen, regenerated (0|1), reaped (0|1),
// counted (0|1), fresh (0|1|2: counted with no record, a known tenant's
// or a stranger's key; a claim that ran before and lost its reply answers
// without it)}.
var claimScript = newScriptRetryable(nowLua + countLua + loseLua + `
local fp, tok, owner = ARGV[1], ARGV[2], ARGV[3]
local lease_ms, live_ttl, now_ms = ARGV[4], ARGV[5], ARGV[6]
-- refuse_gone: a committed key whose body is gone answers "gone" rather
-- than regenerate. count_first: a key with no record is counted before it
-- is claimed (here, on a standalone Redis; else the claim answers "new").
-- refuse_new: this replica takes no new key of the tenant (the claim
-- answers "new" for one, and writes nothing).
local refuse_gone = ARGV[7] == '1'
local count_first, refuse_new = ARGV[8] == '1', ARGV[8] == '2'
local tool, unknown_ttl = ARGV[9], ARGV[10]
-- The count's, on a standalone Redis (nil on a Cluster): the bounds
-- (-1: none), the sets' expiry, the member (the scope's hash), and which
-- of the tenant's set, that of all keys and that of strangers' keys to
-- renew the expiry of ('0' for not).
local tenant_bound, all_bound, stranger_bound = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local set_ttl, member, renew_sets = ARGV[14], ARGV[15], ARGV[16] or '111'
local s = redis.call('HMGET', KEYS[1], 'phase', 'gen', 'fp', 'tok', 'regen', 'reaped', 'state', 'tool', 'utl', 'reaper', 'abandoned')
local phase, gen, held_fp = s[1], s[2], s[3]
if s[11] == tok or (s[4] == tok and phase ~= 'live') then
  -- A copy of a claim that arrives late: its caller gave up on it and
  -- fenced its token (abandonScript), or the generation it made has
  -- ended since. It takes nothing.
  return {'stale'}
end
local held = s[8] and s[8] ~= ''
if (phase == 'live' or phase == 'done') and held_fp ~= fp then
  return {'conflict'}
end
local heldReaped = ''
if held and phase == 'live' and s[4] ~= tok and redis.call('EXISTS', KEYS[2]) == 0 then
  -- A tool call whose owner died: it may have run, so it is not run again.
  heldReaped = lose(KEYS[1], KEYS[3], gen, now_ms, tok, s[9], nil)
  phase, s[7] = 'lost', 'commit_unknown'
elseif held and s[10] == tok then
  -- This claim reaped the call before and lost its reply (a retry).
  heldReaped = reapedAgain(KEYS[1])
end
if held and (phase == 'failed' or phase == 'lost') and s[7] == 'commit_unknown' then
  if held_fp ~= fp or tool == '' then return {'conflict', heldReaped} end
  return {'unknown', gen, heldReaped}
end
if phase == 'failed' and s[7] == 'cancelled' then
  -- Stopped by its tenant: held, not run again, until st expires or is
  -- forgotten.
  if held_fp ~= fp then return {'conflict'} end
  return {'cancelled', gen}
end
local counting = #KEYS >= 9 and (count_first or refuse_new)
if phase == 'live' and s[4] == tok then
  -- This claim ran before: it counted the key then, if it counts here.
  redis.call('SET', KEYS[2], tok, 'PX', lease_ms)
  return {'miss', gen, s[5] or '0', s[6] or '0', counting and '1' or '0'}
end
if not phase and refuse_new then return {'new'} end
if not phase and count_first and not counting then return {'new'} end
local regenerated, reaped = '0', '0'
if phase == 'done' then
  if redis.call('EXISTS', KEYS[4]) == 1 then return {'replay', gen} end
  if refuse_gone then return {'gone'} end
  regenerated = '1'
elseif phase == 'live' then
  if redis.call('EXISTS', KEYS[2]) == 1 then return {'join', gen} end
  -- The owner's lease expired and nobody reaped it yet: the claim reaps.
  reaped = '1'
end
local t = now()
-- fresh: this claim counted a key with no record (1; 2 for a stranger's),
-- which no earlier generation left in the strangers' or commit_unknown
-- keys' sets: its end need not take it out of them (globalEnd).
local fresh = '0'
if counting then
  -- A key with no record is counted against the bounds; one the ledger
  -- held starts again and counts as live whatever they are.
  local tb, ab, sb = tenant_bound, all_bound, stranger_bound
  if phase then tb, ab, sb = -1, -1, -1 end
  local prune = pruning(member)
  local ok, stranger = tenantRoom(KEYS[5], KEYS[6], member, tb, t, prune)
  if not ok then return {'full', '0'} end
  local g = globalRoom(KEYS[7], KEYS[8], member, ab, sb, stranger, t, prune)
  if g ~= 1 then return {'full', g == 0 and '-1' or '-2'} end
  local exp = tostring(t + tonumber(live_ttl))
  local function renew(i) return string.sub(renew_sets, i, i) ~= '0' end
  tenantCount(KEYS[5], member, exp, set_ttl, renew(1))
  globalCount(KEYS[7], KEYS[8], KEYS[9], member, stranger, exp, set_ttl, phase, renew(2), renew(3))
  if not phase then fresh = stranger and '2' or '1' end
end
local g = t
if gen and tonumber(gen) >= g then g = tonumber(gen) + 1 end
local gs = string.format('%.0f', g)
-- The journal is written by the first mirrored batch, or by a terminal
-- entry: a generation nobody follows never has one.
if phase then
  redis.call('DEL', KEYS[3], KEYS[4])
  redis.call('HDEL', KEYS[1], 'want', 'model', 'fallbacks', 'acc') -- the last generation's
  redis.call('HSET', KEYS[1], 'phase', 'live', 'state', 'intent_received', 'gen', gs,
    'tok', tok, 'fp', fp, 'owner', owner, 'created', now_ms, 'updated', now_ms,
    'attempts', '0', 'status', '0', 'reason', '', 'events', '0', 'bytes', '0',
    'regen', regenerated, 'reaped', reaped, 'tool', tool, 'utl', unknown_ttl)
else
  -- st is new: a field left out reads as its default ('' or 0).
  local f = {'phase', 'live', 'state', 'intent_received', 'gen', gs,
    'tok', tok, 'fp', fp, 'owner', owner, 'created', now_ms, 'updated', now_ms}
  if tool ~= '' then
    table.insert(f, 'tool'); table.insert(f, tool)
    table.insert(f, 'utl'); table.insert(f, unknown_ttl)
  end
  redis.call('HSET', KEYS[1], unpack(f))
end
redis.call('PEXPIRE', KEYS[1], live_ttl)
redis.call('SET', KEYS[2], tok, 'PX', lease_ms)
return {'miss', gs, regenerated, reaped, counting and '1' or '0', fresh}
`)

// claimArgs are claimScript's keys and arguments.
type claimArgs struct {
	keys       []string // rkeys.all; on a standalone Redis, Store.finishKeys
	fp, tok    string   // the request's fingerprint; the claim's token
	owner      string   // this replica's name (Store.replica)
	lease      time.Duration
	liveTTL    time.Duration
	now        time.Time
	refuseGone bool     // a committed key whose body is gone answers gone rather than regenerate
	ask        claimAsk // what the claim does with a key it has no record of
	tool       string   // a tool call's name (BeginTool); "" for none
	unknownTTL time.Duration
	count      *claimCount // on a standalone Redis: the claim counts the key itself
}

// claimAsk is what a claim does with a key it has no record of.
type claimAsk uint8

const (
	askClaim  claimAsk = iota // claim it: it was counted (a Cluster's countKey)
	askCount                  // count it first: here on a standalone Redis, else the claim answers "new"
	askRefuse                 // refuse it: the claim answers "new" and writes nothing
)

// claimCount is what a claim on a standalone Redis counts a key with:
// the bounds (-1: none), the sets' expiry, the scope's hash, and which
// of the tenant's set, that of all keys and that of strangers' keys to
// renew the expiry of (setRenewals.flags).
type claimCount struct {
	perTenant, all, strangers int
	setTTL, member, renew     string
}

func (a claimArgs) keysArgs() ([]string, []string) {
	argv := []string{a.fp, a.tok, a.owner, ms(a.lease), ms(a.liveTTL), nowMS(a.now), flag(a.refuseGone),
		strconv.Itoa(int(a.ask)), a.tool, ms(a.unknownTTL)}
	if c := a.count; c != nil {
		argv = append(argv, strconv.Itoa(c.perTenant), strconv.Itoa(c.all), strconv.Itoa(c.strangers), c.setTTL, c.member, c.renew)
	}
	return a.keys, argv
}

// claimAnswer is claimScript's answer.
type claimAnswer struct {
	verdict claimVerdict
	gen     uint64 // claimReplay, claimJoin, claimMiss, claimUnknown: the generation
	// claimMiss: the key held a committed result whose body is gone
	// (regenerated), or a generation whose owner's lease had expired
	// (reaped); the claim counted the key (counted).
	regenerated, reaped, counted bool
	// claimMiss: "1" when the claim counted a key it found no record of,
	// "2" when that key is a stranger's, "0" otherwise: finishScript's
	// fresh argument.
	fresh string
	// claimConflict, claimUnknown: the claim reaped a dead owner's tool
	// call to commit_unknown, which holds its key this long (0: it did not).
	heldReaped time.Duration
	// claimFull: which bound refused the key: 0 its tenant's, -1 all
	// keys', -2 strangers'.
	full int
}

type claimVerdict uint8

const (
	claimConflict claimVerdict = iota // the key holds another request
	claimReplay                       // a committed result to replay
	claimJoin                         // a live generation to follow
	claimGone                         // committed, its body gone, and refuse asked
	claimNew                          // no record, and ask asked: nothing was written
	claimMiss                         // the caller owns a new generation
	claimUnknown                      // a tool call whose outcome is unknown
	claimFull                         // no record, and a bound refused the key: nothing was written
	claimStale                        // a late copy of a claim given up on or ended: nothing was written
	claimStopped                      // a generation its tenant stopped (cancelled): the key is held
)

// claimWords are claimScript's words for its verdicts.
var claimWords = [...]string{claimConflict: "conflict", claimReplay: "replay", claimJoin: "join",
	claimGone: "gone", claimNew: "new", claimMiss: "miss", claimUnknown: "unknown", claimFull: "full", claimStale: "stale",
	claimStopped: "cancelled"}

// parseClaimAnswer reads claimScript's answer out.
func parseClaimAnswer(out []string) (claimAnswer, error) {
	v := slices.Index(claimWords[:], out[0])
	if v < 0 {
		return claimAnswer{}, fmt.Errorf("unexpected answer %q", out)
	}
	a := claimAnswer{verdict: claimVerdict(v)}
	switch a.verdict {
	case claimConflict:
		a.heldReaped = heldFor(out, 1)
		return a, nil
	case claimGone, claimNew, claimStale:
		return a, nil
	case claimFull:
		if len(out) < 2 {
			return a, fmt.Errorf("unexpected answer %q", out)
		}
		n, err := strconv.Atoi(out[1])
		if err != nil || n < -2 || n > 0 {
			return a, fmt.Errorf("unexpected answer %q", out)
		}
		a.full = n
		return a, nil
	}
	if len(out) < 2 {
		return a, fmt.Errorf("unexpected answer %q", out)
	}
	gen, err := strconv.ParseUint(out[1], 10, 64)
	if err != nil {
		return a, fmt.Errorf("generation %q: %w", out[1], err)
	}
	a.gen = gen
	flag := func(i int) bool { return len(out) > i && out[i] == "1" }
	switch a.verdict {
	case claimMiss:
		a.regenerated, a.reaped, a.counted = flag(2), flag(3), flag(4)
		a.fresh = "0"
		if len(out) > 5 && (out[5] == "1" || out[5] == "2") {
			a.fresh = out[5]
		}
	case claimUnknown:
		a.heldReaped = heldFor(out, 2)
	}
	return a, nil
}

// heldFor reads the hold of a tool call reaped to commit_unknown, ms in
// out[i]; 0 when there is none.
func heldFor(out []string, i int) time.Duration {
	if len(out) <= i {
		return 0
	}
	n, err := strconv.ParseInt(out[i], 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Millisecond
}

// abandonScript ends a generation whose claim ran but whose caller never
// learnt it (the reply was lost past the claim's retries), so that
// nobody waits a lease on a generation that has no owner and never
// called the upstream. Only the claim's own token matches: the caller
// never answered Miss, so nothing else holds it, and the generation has
// no journal: the terminal entry makes it. The key ends failed_retryable:
// a retry is safe.
//
// It first fences the token (st's abandoned field): the claim may not
// have reached Redis yet (its bytes held in a connection's buffers, or a
// copy rueidis sent again), and a claim that finds its token fenced
// takes nothing (claimScript), so the clean-up cannot come before the
// claim it cleans up. A key with no record gets a record of the fence
// alone (no phase: read as no record), kept for st ttl.
//
// KEYS: st, lease, j
// ARGV: tok, st ttl ms, journal ttl ms, now ms
//
// Returns 1 when the generation is ended under that token (by this call,
// or by one whose reply was lost), 0 when the key holds no generation of
// that token (the claim never ran, and now never will, or was reaped
// since).
var abandonScript = newScriptRetryable(`
local tok, st_ttl, journal_ttl, now_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local s = redis.call('HMGET', KEYS[1], 'phase', 'gen', 'tok')
local existed = redis.call('EXISTS', KEYS[1]) == 1
redis.call('HSET', KEYS[1], 'abandoned', tok)
if not existed then redis.call('PEXPIRE', KEYS[1], st_ttl) end
if s[3] ~= tok then return 0 end
if s[1] == 'failed' then return 1 end
if s[1] ~= 'live' then return 0 end
redis.call('XADD', KEYS[3], s[2] .. '-' .. '` + maxSeq + `', 't', 'failed',
  'state', 'failed_retryable', 'reason', '` + cache.ReasonStoreUnavailable + `', 'h', '', 'b', '')
redis.pcall('PUBLISH', KEYS[3], '') -- for the followers' shared read (tails.go)
redis.call('HSET', KEYS[1], 'phase', 'failed', 'state', 'failed_retryable',
  'reason', '` + cache.ReasonStoreUnavailable + `', 'updated', now_ms)
redis.call('PEXPIRE', KEYS[1], st_ttl)
redis.call('PEXPIRE', KEYS[3], journal_ttl)
redis.call('DEL', KEYS[2])
return 1
`)

// abandonArgs are abandonScript's keys and arguments.
type abandonArgs struct {
	keys  []string // st, lease, j (rkeys.withoutResult)
	tok   string   // the abandoned claim's token
	stTTL time.Duration
	now   time.Time
}

func (a abandonArgs) keysArgs() ([]string, []string) {
	return a.keys, []string{a.tok, ms(a.stTTL), ms(journalTTL), nowMS(a.now)}
}

// journalEndLua defines journalEnd(j, gen): the id the journal ends with
// for generation gen, <gen>-0 when it holds none of gen's entries (none
// is written before the first mirrored batch), and whether what it holds
// is an earlier generation's, left by a record that expired before it.
//
// And journalAppend(st, j, gen, prev, head, argv, from), the append of
// the appendScript and finishScript: unless the journal ends at prev (it
// returns where it ends then, writing nothing; past the first batch an
// XLEN tells, and journalEnd's XREVRANGE runs only when it does not
// match), it appends argv's id,
// event pairs from from on (the event of seq 1 with the head), deleting
// an earlier generation's entries first; the first batch makes the
// journal, which expires with st. It returns nil and the last id.
const journalEndLua = `
local function journalEnd(j, gen)
  local last = redis.call('XREVRANGE', j, '+', '-', 'COUNT', 1)
  if #last == 0 then return gen .. '-0', false end
  local id = last[1][1]
  if string.sub(id, 1, #gen + 1) == gen .. '-' then return id, false end
  return gen .. '-0', true
end
local function journalAppend(st, j, gen, prev, head, argv, from)
  local lastId, stale = prev, false
  -- Past the first batch, the journal holds this generation's entries
  -- 1..n alone (the first batch deleted any other's; a later claim or a
  -- reap fails the check of st before this; a failover loses a suffix):
  -- it ends at prev, <gen>-n, when it holds n entries, which XLEN says
  -- without reading the last entry.
  local n = string.sub(prev, 1, #gen + 1) == gen .. '-' and tonumber(string.sub(prev, #gen + 2))
  if not n or n == 0 or redis.call('XLEN', j) ~= n then
    lastId, stale = journalEnd(j, gen)
  end
  if lastId ~= prev then return lastId end
  if stale then redis.call('DEL', j) end
  local first = lastId == gen .. '-0'
  for i = from, #argv, 2 do
    local id = argv[i]
    if id == gen .. '-1' and head ~= '' then
      redis.call('XADD', j, id, 'e', argv[i + 1], 'h', head)
    else
      redis.call('XADD', j, id, 'e', argv[i + 1])
    end
    if first then
      local ttl = redis.call('PTTL', st)
      if ttl > 0 then redis.call('PEXPIRE', j, ttl) end
      first = false
    end
    lastId = id
  end
  return nil, lastId
end
`

// appendScript appends a batch of events to the live journal, fenced.
// The first batch makes the journal (after deleting an earlier
// generation's), which then expires with st: renewals extend both.
//
// KEYS: st, j
// ARGV: tok, gen, prev (the id the journal must end with), state,
// attempts, status, now ms, head (JSON, for the entry of seq 1), bytes
// (total after this batch), model, fallbacks (JSON; each "" for none),
// notify (1: PUBLISH on the journal's name once events are in, for the
// followers' shared read, tails.go; on a standalone Redis), then id,
// event pairs. Every PUBLISH of the scripts is a pcall: a user whose ACL
// denies the channel loses the notification (its followers read every
// tailFullEvery), not the write.
//
// Returns {"ok"}, {"fenced"}, or {"prev", last id}: the journal does not
// end where the owner thinks (a failover lost acknowledged entries), and
// the owner re-appends from there.
var appendScript = newScript(appendLua)

// appendsScript runs appendScript's body for several owners in one call
// (appendBatcher).
var appendsScript = newBatchScript(appendLua)

const appendLua = journalEndLua + `
local tok, gen, prev, state = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local attempts, status, now_ms, head = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local bytes, model, fallbacks, notify = ARGV[9], ARGV[10], ARGV[11], ARGV[12] == '1'
local first = 13 -- then id, event pairs
local s = redis.call('HMGET', KEYS[1], 'phase', 'gen', 'tok')
if s[1] ~= 'live' or s[2] ~= gen or s[3] ~= tok then return {'fenced'} end
local ends, lastId = journalAppend(KEYS[1], KEYS[2], gen, prev, head, ARGV, first)
if ends then return {'prev', ends} end
if notify and #ARGV >= first then redis.pcall('PUBLISH', KEYS[2], '') end
local f = {'state', state, 'attempts', attempts, 'updated', now_ms, 'bytes', bytes}
if status ~= '0' then table.insert(f, 'status'); table.insert(f, status) end
if model ~= '' then table.insert(f, 'model'); table.insert(f, model) end
if fallbacks ~= '' then table.insert(f, 'fallbacks'); table.insert(f, fallbacks) end
if #ARGV >= first then
  local seq = string.match(lastId, '-(%d+)$')
  table.insert(f, 'events'); table.insert(f, seq)
end
redis.call('HSET', KEYS[1], unpack(f))
return {'ok'}
`

// appendArgs are appendScript's keys and arguments (and one item of
// appendsScript's).
type appendArgs struct {
	keys     []string // st, j (rkeys.journal)
	tok, gen string   // the owner's
	prev     string   // the id the journal must end with
	mark     markFields
	now      time.Time
	head     string // the head JSON, for the entry of seq 1; "" when the batch does not start the journal
	bytes    int64  // the journal's encoded bytes once the batch is in
	notify   bool   // PUBLISH on the journal's name (a standalone Redis: tails.go)
	// evs are the encoded events to append, the first of them of seq
	// from+1.
	from int
	evs  [][]byte
}

func (a appendArgs) keysArgs() ([]string, []string) {
	argv := make([]string, 0, 12+2*len(a.evs))
	argv = append(argv, a.tok, a.gen, a.prev, string(a.mark.state), strconv.Itoa(a.mark.attempts),
		strconv.Itoa(a.mark.status), nowMS(a.now), a.head, strconv.FormatInt(a.bytes, 10), a.mark.model, a.mark.fallbacks,
		flag(a.notify))
	return a.keys, appendPairs(argv, a.gen, a.from, a.evs)
}

// writeAnswer is the answer of appendScript and of finishScript.
type writeAnswer struct {
	verdict writeVerdict
	last    string // writePrev: the id the journal ends with, <gen>-0 for none of the generation's
}

type writeVerdict uint8

const (
	writeOK      writeVerdict = iota // written
	writeAlready                     // finishScript: this (tok, gen) had finished the generation so
	writeFenced                      // another (tok, gen) holds the key, or the generation is over
	writePrev                        // the journal does not end where the owner thinks: nothing written
	writeWant                        // finishScript: a follower asked for the journal the owner did not mirror
)

// written reports whether Redis holds what the script was sent.
func (a writeAnswer) written() bool { return a.verdict == writeOK || a.verdict == writeAlready }

// writeWords are the words of appendScript and finishScript for their
// verdicts.
var writeWords = [...]string{writeOK: "ok", writeAlready: "already", writeFenced: "fenced", writePrev: "prev", writeWant: "want"}

// parseWriteAnswer reads the answer of appendScript or finishScript. An
// error is the client's or Redis's; an answer no script gives is a fence.
func parseWriteAnswer(res rueidis.RedisResult) (writeAnswer, error) {
	return parseWriteStrings(res.AsStrSlice())
}

// parseWriteStrings reads a write script's answer as strings.
func parseWriteStrings(out []string, err error) (writeAnswer, error) {
	if err != nil {
		return writeAnswer{}, err
	}
	if len(out) == 0 {
		return writeAnswer{}, errEmptyAnswer
	}
	v := slices.Index(writeWords[:], out[0])
	if v < 0 {
		return writeAnswer{verdict: writeFenced}, nil
	}
	a := writeAnswer{verdict: writeVerdict(v)}
	if a.verdict == writePrev && len(out) > 1 {
		a.last = out[1]
	}
	return a, nil
}

// renewScript extends the leases of owners, many in one call (renewAll):
// on a standalone Redis up to maxBatchItems, on a Cluster one, whose keys
// share a slot. A lease that expired while st still names its owner (a
// pause nobody reaped) is set again: ownership lives in st, the lease
// only signals death. An owner that does not mirror its journal sends the
// marks that moved, so that other replicas' key info follows it within a
// renewal without a write per event. st and j are extended only when the
// owner asks (Redis's expiry of them need not move at every renewal: it
// only cleans up after every replica vanished).
//
// It is written for its cost, the largest share of what an unfollowed
// stream costs Redis after its claim and commit: an item carries no field
// names and no framing but its flags, runs without tables of its own, and
// a standing lease is extended (PEXPIRE) rather than written again. Each
// item runs under pcall, so that one item's error is its answer alone.
//
// KEYS: per item st, lease, and j when the item extends st and j
// ARGV: lease ms, live ttl ms; then per item its flags ("e" to extend st
// and j, "n" not, then a digit per field that moved: its place in
// renewedFields, from 1), tok, gen, the moved fields' values in the
// flags' order, and when any moved, the updated time (ms)
//
// Returns one answer per item: 1 while its owner holds the generation, 2
// when it does and a follower asked for its journal (st.want), 0 once it
// does not, or the error that ended the item.
var renewScript = newScript(`
local F = {` + renewedFieldsLua() + `}
local lease, live, byte = ARGV[1], ARGV[2], string.byte -- lease ms, live ttl ms
local T = {}
local function item(st, l, j, tok, gen, a, fl)
  local s = redis.call('HMGET', st, 'phase', 'gen', 'tok', 'want')
  if s[1] ~= 'live' or s[2] ~= gen or s[3] ~= tok then return 0 end
  if redis.call('PEXPIRE', l, lease) == 0 then redis.call('SET', l, tok, 'PX', lease) end
  if j then
    redis.call('PEXPIRE', st, live)
    redis.call('PEXPIRE', j, live)
  end
  local n = #fl
  if n > 1 then
    for i = 2, n do
      T[2 * i - 3], T[2 * i - 2] = F[byte(fl, i) - 48], ARGV[a + i - 2]
    end
    T[2 * n - 1], T[2 * n] = 'updated', ARGV[a + n - 1]
    redis.call('HSET', st, unpack(T, 1, 2 * n))
  end
  if s[4] then return 2 end
  return 1
end
local out, k, a, nargs = {}, 1, 3, #ARGV
while a <= nargs do
  local fl = ARGV[a]
  local j, nk = nil, 2
  if byte(fl, 1) == 101 then j, nk = KEYS[k + 2], 3 end -- 'e'
  local ok, r = pcall(item, KEYS[k], KEYS[k + 1], j, ARGV[a + 1], ARGV[a + 2], a + 3, fl)
  if not ok then
    if type(r) ~= 'table' or not r.err then r = {err = tostring(r)} end
  end
  out[#out + 1] = r
  k = k + nk
  -- flags, tok, gen, one value per moved field, and updated when any moved
  a = a + 3 + #fl - 1
  if #fl > 1 then a = a + 1 end
end
return out`)

// renewArgs are renewScript's keys and arguments: a run of renewals,
// each item's keys and arguments as owner.renewal made them.
type renewArgs struct {
	lease, liveTTL time.Duration
	items          []batchItem
}

func (a renewArgs) keysArgs() ([]string, []string) {
	var keys []string
	argv := []string{ms(a.lease), ms(a.liveTTL)}
	for _, it := range a.items {
		keys = append(keys, it.keys...)
		argv = append(argv, it.args...)
	}
	return keys, argv
}

// renewedFieldsLua is renewedFields as a Lua list.
func renewedFieldsLua() string {
	q := make([]string, len(renewedFields))
	for i, f := range renewedFields {
		q[i] = "'" + f + "'"
	}
	return strings.Join(q, ", ")
}

// finishScript ends a generation: committed with its result, or failed.
// It is idempotent per (gen, tok): re-running it after a lost reply
// answers "already", which settles a commit whose outcome was unknown.
// An owner that did not mirror its journal commits without it, unless a
// follower asked meanwhile ("want": the owner mirrors, then finishes);
// the journal of a committed generation nobody followed is deleted (the
// result holds its events), that of a failed one keeps its terminal entry.
// On a standalone Redis it also ends the key's count (keyEnd, globalEnd;
// sharedKeys), which a Cluster does with scripts of their own.
//
// KEYS: st, lease, j, res, and on a standalone Redis the tenant's set,
// its known marker, the sets of all keys, of strangers' keys and of
// commit_unknown keys
// ARGV: tok, gen, kind (done|failed), prev, st ttl ms, journal ttl ms,
// state, reason, now ms, blob (done) or head JSON (failed), body
// (failed), events, bytes, head JSON (for seq 1), mirrored (1 when the
// owner mirrors its journal), attempts, status, model, fallbacks (each
// "" or 0 for none), then the count's end: member (the scope's hash),
// ttl ms, set ttl ms, known (ms to mark the tenant known for; 0: not),
// committed (1|0), commit_unknown (1|0), fresh (the claim's: 0|1|2),
// notify (1: PUBLISH on the journal's name once it is written, as
// appendScript does); then id, event pairs still to append.
//
// Returns {"ok"}, {"already"}, {"fenced"}, {"want"} or {"prev", last id}
// (also when a mirrored commit's journal, with the pairs appended, would
// not end with its events'th: the owner sends the rest, then finishes).
var finishScript = newScript(nowLua + endLua + journalEndLua + `
local tok, gen, kind, prev = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local st_ttl, journal_ttl, state, reason = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
-- payload: the result's blob (done) or the head JSON (failed)
local now_ms, payload, body, events = ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local bytes, head, mirrored = ARGV[13], ARGV[14], ARGV[15] == '1'
local attempts, status, model, fallbacks = ARGV[16], ARGV[17], ARGV[18], ARGV[19]
local member, ttl, set_ttl, known_ms = ARGV[20], tonumber(ARGV[21]), ARGV[22], ARGV[23]
local committed, ended_unknown, fresh = ARGV[24] == '1', ARGV[25] == '1', ARGV[26]
local notify = ARGV[27] == '1'
local first = 28 -- then id, event pairs
local s = redis.call('HMGET', KEYS[1], 'phase', 'gen', 'tok', 'want', 'commits')
if s[2] ~= gen or s[3] ~= tok then return {'fenced'} end
if s[1] == kind then return {'already'} end
if s[1] ~= 'live' then return {'fenced'} end
if not mirrored and s[4] and kind == 'done' then return {'want'} end
if mirrored and kind == 'done' then
  -- A mirrored journal ends with the stream's last event before its end
  -- is written: a follower takes what precedes the terminal entry for the
  -- whole answer. With the events carried (none: where the journal ends,
  -- which a failover may have cut), it must end so; short of it the owner
  -- is told where it ends and sends the rest first.
  local want = gen .. '-' .. events
  local ends = ARGV[#ARGV - 1]
  if #ARGV < first then ends = journalEnd(KEYS[3], gen) end
  if ends ~= want then return {'prev', (journalEnd(KEYS[3], gen))} end
end
if #ARGV >= first then
  local ends = journalAppend(KEYS[1], KEYS[3], gen, prev, head, ARGV, first)
  if ends then return {'prev', ends} end
end
local term = gen .. '-' .. '` + maxSeq + `'
local f = {'phase', kind, 'state', state, 'updated', now_ms,
  'events', events, 'bytes', bytes}
-- The claim left reason '' (or out): an empty one need not be written.
if reason ~= '' then table.insert(f, 'reason'); table.insert(f, reason) end
local kept = true -- the journal is kept, for the tails
if kind == 'done' then
  -- Unmirrored, the generation wrote no journal, and keeps none.
  if mirrored then
    redis.call('XADD', KEYS[3], term, 't', 'done')
  else
    kept = false
  end
  redis.call('SET', KEYS[4], payload, 'PX', st_ttl)
  table.insert(f, 'commits'); table.insert(f, s[5] and tostring(tonumber(s[5]) + 1) or '1')
else
  redis.call('XADD', KEYS[3], term, 't', 'failed', 'state', state, 'reason', reason, 'h', payload, 'b', body, 'n', events)
end
if attempts ~= '' then table.insert(f, 'attempts'); table.insert(f, attempts) end
if status ~= '' and status ~= '0' then table.insert(f, 'status'); table.insert(f, status) end
if model ~= '' then table.insert(f, 'model'); table.insert(f, model) end
if fallbacks ~= '' then table.insert(f, 'fallbacks'); table.insert(f, fallbacks) end
redis.call('HSET', KEYS[1], unpack(f))
redis.call('PEXPIRE', KEYS[1], st_ttl)
if kept then
  redis.call('PEXPIRE', KEYS[3], journal_ttl)
  if notify then redis.pcall('PUBLISH', KEYS[3], '') end
end
-- The lease is left to expire: nothing reads it once phase is not live.
if #KEYS >= 9 then
  local t = now()
  local exp = tostring(t + ttl)
  -- The sets' expiry was renewed at gen (the claim's clock, or ms after),
  -- or by the claim's replica at most setRenewEvery before: it is past
  -- exp while the generation is short (setSlack), by a minute to spare
  -- for a clock that stepped back.
  local covered = t + ttl + 60000 + ` + strconv.FormatInt(setRenewEvery.Milliseconds(), 10) + ` <= tonumber(gen) + tonumber(set_ttl)
  keyEnd(KEYS[5], KEYS[6], member, ttl, exp, set_ttl, known_ms, covered)
  globalEnd(KEYS[7], KEYS[8], KEYS[9], member, ttl, exp, set_ttl, committed, ended_unknown, t, covered, fresh)
end
return {'ok'}
`)

// finishArgs are finishScript's keys and arguments.
type finishArgs struct {
	keys     []string // Store.finishKeys
	tok, gen string   // the owner's
	done     bool     // committed; else failed
	prev     string   // the id Redis's journal ends with, as the owner knows it
	keep     time.Duration
	state    cache.State
	reason   string
	now      time.Time
	result   []byte // done: the result's blob
	head     string // failed: the head JSON, "" for none
	body     []byte // failed: the upstream's answer
	events   int    // the generation's events
	bytes    int64  // their encoded bytes
	// firstHead is the head JSON for the journal's entry of seq 1, when
	// the finish appends it.
	firstHead string
	mirrored  bool // the owner mirrors its journal
	notify    bool // PUBLISH on the journal's name once written (a standalone Redis: tails.go)
	mark      markFields
	end       countEnd
	// evs are the encoded events still to append, the first of them of
	// seq from+1.
	from int
	evs  [][]byte
}

func (a finishArgs) keysArgs() ([]string, []string) {
	kind, payload := "failed", a.head
	if a.done {
		kind, payload = "done", string(a.result)
	}
	argv := make([]string, 0, 27+2*len(a.evs))
	argv = append(argv, a.tok, a.gen, kind, a.prev, ms(a.keep), ms(journalTTL),
		string(a.state), a.reason, nowMS(a.now), payload, string(a.body), strconv.Itoa(a.events),
		strconv.FormatInt(a.bytes, 10), a.firstHead, flag(a.mirrored),
		strconv.Itoa(a.mark.attempts), strconv.Itoa(a.mark.status), a.mark.model, a.mark.fallbacks,
		a.end.member, ms(a.end.ttl), a.end.setTTL, ms(a.end.knownFor), flag(a.end.committed), flag(a.end.unknown), a.end.fresh,
		flag(a.notify))
	return a.keys, appendPairs(argv, a.gen, a.from, a.evs)
}

// appendPairs appends to argv the id, event pairs of evs, the first of
// seq from+1 of generation gen.
func appendPairs(argv []string, gen string, from int, evs [][]byte) []string {
	for i, e := range evs {
		argv = append(argv, gen+"-"+strconv.Itoa(from+i+1), string(e))
	}
	return argv
}

// reapScript is run by a follower as its tail starts and whenever it goes
// idle: it asks the owner for the journal (sets st.want), reports the
// generation alive while its owner's lease stands, and otherwise ends it
// as lost (commit_unknown in docs/design.md, Key states) so that the key is free.
//
// KEYS: st, lease, j
// ARGV: gen, st ttl ms, journal ttl ms, now ms, the follower's token
//
// Returns {"alive"}, {"asked", owner} (alive, and want was set by this
// call: the follower signals the owner replica's inbox), {"reaped", utl}
// (this call ended it; utl: how long a tool call's key is held, ms, or
// "": the terminal entry says both, for a call whose answer is lost), {"done"}
// (committed: the result holds its events) or {"ended"} (failed or lost,
// or another generation holds the key).
var reapScript = newScript(loseLua + `
local gen, st_ttl, journal_ttl, now_ms, reaper = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local s = redis.call('HMGET', KEYS[1], 'phase', 'gen', 'owner', 'utl')
if s[2] ~= gen then return {'ended'} end
if s[1] == 'done' then return {'done'} end
if s[1] ~= 'live' then return {'ended'} end
if redis.call('EXISTS', KEYS[2]) == 1 then
  if redis.call('HSETNX', KEYS[1], 'want', '1') == 1 then return {'asked', s[3] or ''} end
  return {'alive'}
end
return {'reaped', lose(KEYS[1], KEYS[3], gen, now_ms, reaper, s[4], st_ttl)}
`)

// reapArgs are reapScript's keys and arguments.
type reapArgs struct {
	keys   []string // st, lease, j (rkeys.withoutResult)
	gen    string   // the generation followed
	stTTL  time.Duration
	now    time.Time
	reaper string // the follower's token
}

func (a reapArgs) keysArgs() ([]string, []string) {
	return a.keys, []string{a.gen, ms(a.stTTL), ms(journalTTL), nowMS(a.now), a.reaper}
}

// loseLua holds lose(st, j, gen, now, reaper, utl, failedTTL), the end of a
// generation whose owner's lease expired, for reapScript and claimScript:
// the terminal entry `t=lost` with the reaper's token (by) and the hold
// (utl), which makes the journal of a generation that mirrored none (it
// expires after journalTTL); st lost in commit_unknown with the reaper's
// token; and st's expiry: a tool call's (utl set) holds its key for utl
// ms, any other's record is kept failedTTL ms. It returns the hold: utl,
// or "" for none. A reaper whose answer is lost learns it reaped from
// what it wrote: a follower from the entry it reads next, a claim, sent
// again, from st (reapedAgain: the ms a tool call's key is still held).
var loseLua = `
local function lose(st, j, gen, now, reaper, utl, failedTTL)
  if not utl or utl == '0' then utl = '' end
  redis.pcall('XADD', j, gen .. '-' .. '` + maxSeq + `', 't', 'lost', 'by', reaper, 'utl', utl)
  redis.pcall('PUBLISH', j, '') -- for the followers' shared read (tails.go)
  redis.call('PEXPIRE', j, '` + strconv.FormatInt(journalTTL.Milliseconds(), 10) + `')
  redis.call('HSET', st, 'phase', 'lost', 'state', 'commit_unknown', 'reason', '` + cache.ReasonGenerationLost + `', 'updated', now, 'reaper', reaper)
  redis.call('PEXPIRE', st, utl ~= '' and utl or failedTTL)
  return utl
end
local function reapedAgain(st)
  return tostring(redis.call('PTTL', st))
end
`

// reapAnswer is reapScript's answer.
type reapAnswer uint8

const (
	reapEnded  reapAnswer = iota // failed or lost, or another generation holds the key
	reapAlive                    // the owner's lease stands
	reapReaped                   // this call ended the generation as lost
	reapAsked                    // the owner's lease stands, and this call asked for the journal
	reapDone                     // committed
)

// reapWords are reapScript's words for its answers.
var reapWords = [...]string{reapEnded: "ended", reapAlive: "alive", reapReaped: "reaped", reapAsked: "asked", reapDone: "done"}

// parseReapAnswer reads reapScript's answer and, for reapAsked, the
// owner replica's name, for reapReaped the hold of a tool call's key ("":
// none); an answer no script gives is reapEnded.
func parseReapAnswer(res rueidis.RedisResult) (reapAnswer, string, error) {
	out, err := scriptStrings(res)
	if err != nil {
		return reapEnded, "", err
	}
	a := reapAnswer(max(slices.Index(reapWords[:], out[0]), 0))
	if (a == reapAsked || a == reapReaped) && len(out) > 1 {
		return a, out[1], nil
	}
	return a, "", nil
}

// forgetScript deletes a key's records unless its generation is live
// with its owner's lease standing (Forget). A tool call's live record is
// never deleted, lease or not: its owner may be paused or cut off from
// Redis while the call runs on; the next claim reaps it to a held
// commit_unknown, which a DELETE then clears. A fence a claim's clean-up
// left (abandonScript's abandoned field) outlives the records, kept for
// fence ttl: a claim that lands after its clean-up and the forget still
// takes nothing.
//
// KEYS: st, lease, j, res
// ARGV: fence ttl ms
//
// Returns "live", "none" or "ok".
var forgetScript = newScript(`
local fence_ttl = ARGV[1]
local phase = redis.call('HGET', KEYS[1], 'phase')
if not phase then return 'none' end
local tool = redis.call('HGET', KEYS[1], 'tool')
if phase == 'live' and (redis.call('EXISTS', KEYS[2]) == 1 or (tool and tool ~= '')) then return 'live' end
local fence = redis.call('HGET', KEYS[1], 'abandoned')
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
if fence then
  redis.call('HSET', KEYS[1], 'abandoned', fence)
  redis.call('PEXPIRE', KEYS[1], fence_ttl)
end
return 'ok'
`)

// forgetArgs are forgetScript's keys and arguments.
type forgetArgs struct {
	keys     []string // rkeys.all
	fenceTTL time.Duration
}

func (a forgetArgs) keysArgs() ([]string, []string) { return a.keys, []string{ms(a.fenceTTL)} }
