package redis

import (
	"fmt"
	"github.com/ssegate/ssegate/cache"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// A tenant's keys are counted in one sorted set per tenant,
// prefix:tenant:{th}, whose members are the scope hashes of its keys and
// whose scores are when each key's records expire (ms, the server's
// clock): a live generation's LiveTTL ahead, then TTL after a commit or
// FailedTTL after a failure, as st's own expiry. Expired members are
// removed (ZREMRANGEBYSCORE) before a set at its bound would refuse a new
// key, so they count against nothing, and a set holds at most its bound.
//
// On a standalone Redis the claim script counts a new key itself, and the
// finish script ends the count (sharedKeys): one script each, every check
// before the first write. On a Cluster the set is in its tenant's slot,
// not in the scope's, so it cannot be updated in the claim script: a new
// key is counted before it is claimed. The claim script reports a key it
// has no record of ("new") instead of claiming it; the tenant's set then
// takes the key if the tenant has room (atomically per tenant), and the
// claim runs again. A known key (live, committed, failed, lost) is
// decided in one round trip. What this leaves open, none of which refuses
// a key wrongly for longer than LiveTTL:
//   - on a Cluster, a key counted whose claim then fails (Redis gone
//     between the two) counts until its LiveTTL score passes;
//   - on a Cluster, a replica that dies between a generation's end and the
//     set's update leaves the key at its live score (a reap or an abandon
//     ends the count in scripts of their own on a standalone Redis too): a
//     failed key counts for up to
//     LiveTTL rather than FailedTTL, a committed one stops counting after
//     LiveTTL though its result is kept for TTL;
//   - a generation that outlives LiveTTL without another request for its
//     key stops counting (renewals extend st, not the set);
//   - a failure's update that lands after the key was claimed again gives
//     the new generation the failure's expiry.
//
// All keys are also counted in one sorted set, prefix:keys:{all}, the
// same way (member the scope hash, score its expiry), against MaxKeys;
// and the keys of strangers in another beside it, prefix:strangers:{all},
// against MaxStrangerKeys. Counting by expiry rather than by a number
// means the count cannot drift: a key whose end was never reported (a
// replica that died, an update lost with Redis) stops counting when its
// score passes, and one count in 8 removes up to pruneBatch expired members
// (all of them when they would refuse a key). A tenant is known (not a stranger) while prefix:tenant:{th}:known
// exists: it is set for TTL at each of the tenant's commits. On a
// Cluster a new key is counted against its tenant first and then against
// the whole (two slots, two scripts); a key the whole refuses is taken
// out of its tenant's set again. A key denied by the upstream (Flight.Deny) is taken
// out of both at once, and its records deleted.
//
// The keys Redis holds in commit_unknown are a third set in that slot,
// prefix:unknown:{all}, kept the same way by the same scripts: a key ended
// commit_unknown (a failed write of that state, a reap) is added with its
// records' expiry, and leaves when it is claimed again or ended otherwise;
// the expired are removed as another is added, and a scrape only counts
// the unexpired (UnknownKeys).

// tenantKey names the set of the keys of sc's first account
// (Scope.Account: the tenant, for a scope without Accounts).
func (r *Store) tenantKey(sc cache.Scope) string { return r.accountKey(sc.Account()) }

// accountKey names the set of the keys of an account: the one set of the
// account whether it is a scope's first or comes after it, each in its
// own slot. The account, itself a hash, is hashed again so that the
// set's name does not repeat what the ledger's records are named by.
func (r *Store) accountKey(account string) string {
	return r.cfg.Prefix + ":tenant:{" + digest("tenant\x00"+account) + "}"
}

// A scope's accounts after its first (Scope.Accounts: a request that
// carries more than one credential value) are counted in their sets
// apart from the claim, a script each, since each set is in a slot of its
// own: a new key is counted in them, against MaxKeysPerTenant, before
// the claim counts it against its first account and the whole (on a
// Cluster, before countKey), and taken out of them again when a bound
// refuses it there. Each count checks and adds atomically, so no set
// passes its bound. A claim a bound refuses, or that ends otherwise than
// taking the key (or whose outcome is unknown and that never ran), takes
// out only the members it added, not those another claim of the key
// counted first; the claim that took the key counts again, unbounded, in
// the sets where it found the key already counted, since the claim that
// counted it there may take it out (countMore). That recount and such a
// removal are not ordered: a key can go uncounted in an account after
// its first until its next claim, an under-count bounded by the
// concurrent claims of one key. Every end of the key's count ends it in them too
// (keyEnd; moreEnded after a finish that ended the rest): a key whose end
// goes unreported counts, there as in its first account's set, until
// its live score passes.

// more returns sc's accounts after its first.
func more(sc cache.Scope) []string {
	if len(sc.Accounts) < 2 {
		return nil
	}
	return sc.Accounts[1:]
}

// countMore counts sc's key as live in the sets of its accounts after
// its first, against MaxKeysPerTenant unless unbounded, and returns
// those of them it added the key to (it was not counted there before)
// and those that had it already. When one refuses it, it is taken out
// of those it was added to, and countMore returns ErrTenantFull
// (wrapped).
func (r *Store) countMore(sc cache.Scope, k rkeys, unbounded bool) (added, had []string, err error) {
	bound := r.cfg.MaxKeysPerTenant
	if unbounded {
		bound = -1
	}
	ctx, cancel := r.opCtx()
	defer cancel()
	for _, a := range more(sc) {
		n, err := run(ctx, r.c, quotaScript, quotaArgs{
			set: r.accountKey(a), member: k.h, bound: bound, liveTTL: r.cfg.LiveTTL, setTTL: r.setTTL(),
		}).AsInt64()
		switch {
		case err == nil && n >= 3:
			added = append(added, a)
			continue
		case err == nil && n != 0:
			had = append(had, a)
			continue
		}
		if !unbounded {
			r.uncountMore(added, k)
			added = nil
		}
		if err != nil {
			return added, had, r.unavailableErr("account keys", err)
		}
		return added, had, r.fullErr(0)
	}
	return added, had, nil
}

// uncountMore takes k's key out of the sets of accounts: a bound refused
// it after they had counted it.
func (r *Store) uncountMore(accounts []string, k rkeys) {
	ctx, cancel := r.opCtx()
	defer cancel()
	for _, a := range accounts {
		if err := r.c.Do(ctx, r.c.B().Zrem().Key(r.accountKey(a)).Member(k.h).Build()).Error(); err != nil {
			r.unavailable.Add(1)
		}
	}
}

// moreEnded ends sc's key's count in the sets of its accounts after its
// first (keyEndScript), its records expiring in ttl (0: at once): what a
// finish that ended the rest of the count in its own script leaves.
func (r *Store) moreEnded(sc cache.Scope, k rkeys, ttl time.Duration) {
	accounts := more(sc)
	if len(accounts) == 0 {
		return
	}
	ctx, cancel := r.opCtx()
	defer cancel()
	end := r.countEnd(k, ttl, false, false, "")
	for _, a := range accounts {
		err := run(ctx, r.c, keyEndScript, keyEndArgs{set: r.accountKey(a), end: end}).Error()
		if err != nil && !rueidis.IsRedisNil(err) {
			r.unavailable.Add(1)
		}
	}
}

// setTTL is the expiry of a tenant's set, renewed by the writes that count
// a key (a replica's claims once every setRenewEvery: setRenewals): past
// any of its members' scores, by enough that the end of a generation
// shorter than about 9 minutes finds the expiry renewed before its claim
// past its score (covered in finishScript) and need not renew it.
func (r *Store) setTTL() string {
	return ms(max(r.cfg.TTL, r.cfg.FailedTTL, r.cfg.LiveTTL) + setSlack)
}

// setSlack is how far a set's expiry is set past the longest of its
// members' expiries: past setRenewEvery, by the 10 minutes a generation
// may run before its end must renew the sets again (covered in
// finishScript).
const setSlack = 11 * time.Minute

// setRenewEvery is how often a replica's claims renew the expiry of a set
// of keys they count in (setRenewals): a claim within that of the last
// renewal its replica sent leaves the expiry as it is, which is still
// past its key's score by setSlack less setRenewEvery at least.
const setRenewEvery = time.Minute

// maxRenewedSets bounds the sets a replica remembers renewing: past it, a
// set it does not remember is renewed at each claim, as without the
// memory.
const maxRenewedSets = 1 << 16

// setRenewals remembers when this replica's claims last renewed the
// expiry of each set of keys, so that its claims renew a set once every
// setRenewEvery rather than each (a command of Redis's each).
type setRenewals struct {
	mu    sync.Mutex
	last  map[string]time.Time // set key: when the claim that renewed it was sent
	swept time.Time            // when renewed last dropped the renewals past setRenewEvery
}

// flags returns the claim's renew argument for sets (claimScript): a
// character each, "0" for a set renewed by a claim sent less than
// setRenewEvery before now.
func (s *setRenewals) flags(now time.Time, sets ...string) string {
	b := make([]byte, len(sets))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, set := range sets {
		b[i] = '1'
		if t, ok := s.last[set]; ok && now.Sub(t) < setRenewEvery {
			b[i] = '0'
		}
	}
	return string(b)
}

// renewed records that a claim sent at sent renewed the expiry of sets.
// At the bound it drops the renewals past setRenewEvery, at most once
// every setRenewEvery, so that claims past the bound do not each walk
// the map.
func (s *setRenewals) renewed(sent time.Time, sets ...string) {
	if len(sets) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		s.last = make(map[string]time.Time)
	}
	if len(s.last) >= maxRenewedSets && sent.Sub(s.swept) >= setRenewEvery {
		s.swept = sent
		for set, t := range s.last {
			if sent.Sub(t) >= setRenewEvery {
				delete(s.last, set)
			}
		}
	}
	for _, set := range sets {
		if t, ok := s.last[set]; (ok && t.Before(sent)) || (!ok && len(s.last) < maxRenewedSets) {
			s.last[set] = sent
		}
	}
}

// forget drops every renewal remembered: Redis may hold the sets with an
// older expiry than this replica renewed (a restart from an older
// snapshot, a failover to a replica behind), so the next claims renew them.
func (s *setRenewals) forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.last)
}

// knownKey names the marker of a tenant known by a commit; it shares the
// tenant set's slot.
func (r *Store) knownKey(sc cache.Scope) string { return r.tenantKey(sc) + ":known" }

// globalKeys names the sets of all keys, of strangers' keys and of
// commit_unknown keys.
func (r *Store) globalKeys() []string {
	return []string{r.cfg.Prefix + ":keys:{all}", r.cfg.Prefix + ":strangers:{all}", r.cfg.Prefix + ":unknown:{all}"}
}

// countKey counts sc's key, as live, against its tenant's bound, then
// against MaxKeys and, for a stranger's key, MaxStrangerKeys. It returns
// ErrTenantFull or ErrStoreFull (wrapped) when a bound refuses the key.
// unbounded counts it whatever the bounds (a key the ledger already
// holds, claimed again).
func (r *Store) countKey(sc cache.Scope, k rkeys, unbounded bool) error {
	bound, all, strangers := r.cfg.MaxKeysPerTenant, r.cfg.MaxKeys, r.cfg.MaxStrangerKeys
	if unbounded {
		bound, all, strangers = -1, -1, -1
	}
	ctx, cancel := r.opCtx()
	defer cancel()
	n, err := run(ctx, r.c, quotaScript, quotaArgs{
		set: r.tenantKey(sc), member: k.h, bound: bound, liveTTL: r.cfg.LiveTTL, setTTL: r.setTTL(),
	}).AsInt64()
	if err != nil {
		return r.unavailableErr("tenant keys", err)
	}
	if n == 0 {
		return r.fullErr(0)
	}
	g, err := run(ctx, r.c, globalScript, globalArgs{
		keys: r.globalKeys(), member: k.h, all: all, strangers: strangers,
		stranger: n == 1 || n == 3, liveTTL: r.cfg.LiveTTL, setTTL: r.setTTL(),
	}).AsInt64()
	if err == nil && g == 1 {
		return nil
	}
	// Not counted in the whole: nor in its tenant's set.
	if e := r.c.Do(ctx, r.c.B().Zrem().Key(r.tenantKey(sc)).Member(k.h).Build()).Error(); e != nil {
		r.unavailable.Add(1)
	}
	if err != nil {
		return r.unavailableErr("keys", err)
	}
	return r.fullErr(int(g) - 1)
}

// fullErr is the error of a new key a bound has no room for: its
// tenant's (0), all keys' (-1) or strangers' keys' (-2).
func (r *Store) fullErr(bound int) error {
	switch bound {
	case 0:
		return fmt.Errorf("this tenant holds %d keys, the -max-keys-per-tenant bound: %w", r.cfg.MaxKeysPerTenant, cache.ErrTenantFull)
	case -1:
		return fmt.Errorf("the replicas hold %d keys, the -max-keys bound: %w", r.cfg.MaxKeys, cache.ErrStoreFull)
	default:
		return fmt.Errorf("credentials none of whose keys has completed hold %d keys, the -max-stranger-keys bound; a credential with a completed key is not refused by it: %w", r.cfg.MaxStrangerKeys, cache.ErrStoreFull)
	}
}

// keyEnded sets when sc's key stops counting against its tenant and the
// whole, now that its generation ended in state and its records expire
// in ttl (0: at once, a denied key). A failure to tell Redis leaves the
// key counted until its live score passes.
func (r *Store) keyEnded(sc cache.Scope, k rkeys, state cache.State, ttl time.Duration) {
	r.keyEnd(sc, k, ttl, false, state == cache.StateCommitUnknown)
}

// keyCommitted is keyEnded for a committed key whose records are kept
// for ttl (TTL, or a tool call's dedupe window), and whose commit makes
// its tenant known for TTL.
func (r *Store) keyCommitted(sc cache.Scope, k rkeys, ttl time.Duration) {
	r.keyEnd(sc, k, ttl, true, false)
}

func (r *Store) keyEnd(sc cache.Scope, k rkeys, ttl time.Duration, known, unknown bool) {
	ctx, cancel := r.opCtx()
	defer cancel()
	end := r.countEnd(k, ttl, known, unknown, "")
	for _, err := range []error{
		run(ctx, r.c, keyEndScript, keyEndArgs{set: r.tenantKey(sc), end: end}).Error(),
		run(ctx, r.c, globalEndScript, globalEndArgs{keys: r.globalKeys(), end: end}).Error(),
	} {
		if err != nil && !rueidis.IsRedisNil(err) {
			r.unavailable.Add(1)
		}
	}
	cancel()
	r.moreEnded(sc, k, ttl)
}

// countEnd is the end of a key's count (keyEnd and globalEnd in endLua),
// which finishScript makes on a standalone Redis and keyEndScript and
// globalEndScript on a Cluster.
type countEnd struct {
	member string        // the scope's hash
	ttl    time.Duration // the key's records expire this long from now; 0: no longer counted
	setTTL string        // the sets' expiry, ms (Store.setTTL)
	// knownFor: a commit marks the tenant known this long (TTL); 0: not.
	knownFor  time.Duration
	committed bool
	unknown   bool // the generation ended commit_unknown
	// fresh is the claim's (claimAnswer.fresh): "1" or "2" for a key it
	// counted with no record; the end scripts of a Cluster read none.
	fresh string
}

// countEnd is the end of k's count, its records expiring in ttl; known is
// a commit's end: it marks the tenant known for TTL.
func (r *Store) countEnd(k rkeys, ttl time.Duration, known, unknown bool, fresh string) countEnd {
	e := countEnd{member: k.h, ttl: ttl, setTTL: r.setTTL(), committed: known, unknown: unknown, fresh: fresh}
	if known {
		e.knownFor = r.cfg.TTL
	}
	return e
}

// finishKeys are finishScript's keys for sc: on a standalone Redis with
// those of the count, whose end the script then makes (sharedKeys).
func (r *Store) finishKeys(sc cache.Scope, k rkeys, shared bool) []string {
	if !shared {
		return k.all
	}
	return append(append(k.all[:4:4], r.tenantKey(sc), r.knownKey(sc)), r.globalKeys()...)
}

// The key count's Lua, as functions that the scripts below and, on a
// standalone Redis, the claim and finish scripts share (sharedKeys).

// nowLua defines now(): the server's clock in ms.
const nowLua = `
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`

// pruneBatch is how many expired members a pruning count removes from a
// set.
const pruneBatch = "64"

// countLua defines the key count's checks, which write nothing but the
// removal of expired members, and its writes. A count costs a ZCARD per
// set while the set is below its bound, and its ZADD (and PEXPIRE, at
// most once a minute per replica: renew, below): the member's own score is read (ZSCORE) only at the bound, and 1 count in 8
// prunes (pruning), so that a set removes up to 8 expired members for each
// it adds and holds about its unexpired keys; a set at its bound removes
// all of them before it refuses, so a key is refused only when the set
// holds its bound of unexpired keys. Scores go to Redis as strings made
// once (exp): each Lua number a command is given is converted again.
//
// tenantRoom(set, known, member, bound, now, prune) returns whether the
// tenant's set takes the member (it is in, or the tenant has room: bound
// < 0 is none) and whether the tenant is a stranger.
// globalRoom(all, strangers, member, bound on all, bound on strangers,
// stranger, now, prune) returns 1 (room), 0 (all keys hold their bound)
// or -1 (strangers' keys hold theirs).
// tenantCount(set, member, exp, setttl, renew) and globalCount(all,
// strangers, unknown, member, stranger, exp, setttl, known, renew all,
// renew strangers') add the member, live until exp (a string), or raise
// its score to exp (ZADD GT), and set each set's expiry to setttl unless
// its renew is false: the caller renewed it within setRenewEvery
// (setRenewals), which leaves it past exp. A set room found empty (or
// did not count, unbounded) is renewed whatever renew says, since a set
// whose last member went is deleted and made again by the ZADD, with no
// expiry.
const countLua = `
local function pruning(member)
  return string.byte(member, -1) % 8 == 0
end
local empty = {} -- the sets room found empty (or did not count): a ZADD makes them anew
local function room(set, member, bound, t, prune)
  if prune then
    local old = redis.call('ZRANGEBYSCORE', set, '-inf', '(' .. t, 'LIMIT', 0, ` + pruneBatch + `)
    if #old > 0 then redis.call('ZREM', set, unpack(old)) end
  end
  if bound < 0 then empty[set] = true; return true end
  local n = redis.call('ZCARD', set)
  if n == 0 then empty[set] = true end
  if n < bound then return true end
  if redis.call('ZSCORE', set, member) then return true end
  redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. t)
  n = redis.call('ZCARD', set)
  if n == 0 then empty[set] = true end
  return n < bound
end
local function tenantRoom(set, known, member, bound, t, prune)
  if not room(set, member, bound, t, prune) then return false end
  return true, redis.call('EXISTS', known) == 0
end
local function globalRoom(all, strangers, member, bound, sbound, stranger, t, prune)
  if not room(all, member, bound, t, prune) then return 0 end
  if stranger and not room(strangers, member, sbound, t, prune) then return -1 end
  return 1
end
local function add(set, member, exp, setttl, renew)
  redis.call('ZADD', set, 'GT', exp, member)
  if renew ~= false or empty[set] then redis.call('PEXPIRE', set, setttl) end
end
local function tenantCount(set, member, exp, setttl, renew)
  add(set, member, exp, setttl, renew)
end
local function globalCount(all, strangers, unknown, member, stranger, exp, setttl, known, renewAll, renewStrangers)
  add(all, member, exp, setttl, renewAll)
  if stranger then add(strangers, member, exp, setttl, renewStrangers) end
  -- A key the ledger held may be among the commit_unknown. One without a
  -- record is not, but for the few ms by which a reaped key's member can
  -- outlive its records (its end is a script after the reap's): the
  -- generation's end takes it out then (globalEnd), which spares every
  -- new key a ZREM.
  if known then redis.call('ZREM', unknown, member) end
end
`

// endLua defines the key count's update at a generation's end.
//
// keyEnd(set, known, member, ttl, exp, setttl, mark, covered) sets a
// counted key's expiry in its tenant's set to exp (a string, ttl ms from
// now; ttl 0: no longer counted), renewing the set's expiry unless covered
// (the claim's renewal is past exp), and marks the tenant known for mark
// ms after a commit ("0": not). globalEnd(all, strangers, unknown, member,
// ttl, exp, setttl, committed, unknown, now, covered, fresh) does the same
// in the sets of all keys and of strangers' keys (whose expiry it renews
// whatever covered says): a committed key leaves the strangers' set (its
// tenant is known now); a key ended commit_unknown joins the set of those
// until its records expire, and any other end takes it out. fresh is the
// claim's (claimScript): a key it counted with no record is in neither set
// but by an earlier generation's member, whose score is its records'
// expiry, now past or a few ms off (a reap's end, a script after the
// reap's), or that a lost update of the count left to count until its
// score: it is left to the pruning, and a known tenant's key is not looked
// for among strangers'. nil: not known.
const endLua = `
local function endIn(set, member, ttl, exp, setttl, covered)
  if ttl <= 0 then
    redis.call('ZREM', set, member)
  elseif redis.call('ZADD', set, 'XX', 'CH', exp, member) == 1 and not covered then
    redis.call('PEXPIRE', set, setttl)
  end
end
local function keyEnd(set, known, member, ttl, exp, setttl, mark, covered)
  if mark ~= '0' then redis.call('SET', known, '1', 'PX', mark) end
  endIn(set, member, ttl, exp, setttl, covered)
end
local function globalEnd(all, strangers, unknown, member, ttl, exp, setttl, committed, unk, t, covered, fresh)
  if unk and ttl > 0 then
    -- the expired go as the new come, so that the set is bounded by the
    -- keys in commit_unknown now, scraped or not
    redis.call('ZREMRANGEBYSCORE', unknown, '-inf', t)
    redis.call('ZADD', unknown, exp, member)
    redis.call('PEXPIRE', unknown, setttl)
  elseif fresh ~= '1' and fresh ~= '2' then
    redis.call('ZREM', unknown, member)
  end
  endIn(all, member, ttl, exp, setttl, covered)
  if fresh == '1' then return end -- a known tenant's fresh key is not among strangers'
  if committed then
    redis.call('ZREM', strangers, member)
  else
    -- the key may be there by an earlier generation's claim, not this one's
    endIn(strangers, member, ttl, exp, setttl, false)
  end
end
`

// quotaScript counts a key in its tenant's set.
//
// KEYS: the tenant's set, the tenant's known marker
// ARGV: member (the scope's hash), bound (-1: none), live ttl ms, set ttl ms
//
// Returns 1 when the key is counted (it was, or the tenant had room) and
// the tenant is a stranger, 2 when it is counted and the tenant known, 0
// when the tenant holds its bound of other unexpired keys; 2 more (3, 4)
// when the key was not counted there before (no unexpired member): this
// call added it, and a claim refused later takes out only what it added
// (countMore).
var quotaScript = newScript(nowLua + countLua + `
local set, known = KEYS[1], KEYS[2]
local member, bound, live_ttl, set_ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local t = now()
local old = tonumber(redis.call('ZSCORE', set, member))
local ok, stranger = tenantRoom(set, known, member, bound, t, pruning(member))
if not ok then return 0 end
tenantCount(set, member, tostring(t + live_ttl), set_ttl)
local added = 0
if not old or old <= t then added = 2 end
if stranger then return 1 + added end
return 2 + added
`)

// quotaArgs are quotaScript's keys and arguments.
type quotaArgs struct {
	set     string        // the account's set (accountKey); its known marker is set + ":known"
	member  string        // the scope's hash
	bound   int           // the set's bound on unexpired members; -1: none
	liveTTL time.Duration // the member counts this long, as a live key
	setTTL  string        // the set's expiry, ms (Store.setTTL)
}

func (a quotaArgs) keysArgs() ([]string, []string) {
	return []string{a.set, a.set + ":known"}, []string{a.member, strconv.Itoa(a.bound), ms(a.liveTTL), a.setTTL}
}

// globalScript counts a key in the set of all keys and, for a
// stranger's, in the set of strangers' keys; a key claimed again is
// live, and leaves the set of commit_unknown keys.
//
// KEYS: the set of all keys, the set of strangers' keys, the set of
// commit_unknown keys
// ARGV: member, bound on all (-1: none), bound on strangers' (-1: none),
// stranger (1|0), live ttl ms, set ttl ms
//
// Returns 1 when the key is counted (it was, or there was room), 0 when
// all keys hold their bound, -1 when strangers' keys hold theirs.
var globalScript = newScript(nowLua + countLua + `
local all, strangers, unknown = KEYS[1], KEYS[2], KEYS[3]
local member, all_bound, stranger_bound = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local stranger, live_ttl, set_ttl = ARGV[4] == '1', tonumber(ARGV[5]), ARGV[6]
local t = now()
local ok = globalRoom(all, strangers, member, all_bound, stranger_bound, stranger, t, pruning(member))
if ok ~= 1 then return ok end
globalCount(all, strangers, unknown, member, stranger, tostring(t + live_ttl), set_ttl, true)
return 1
`)

// globalArgs are globalScript's keys and arguments.
type globalArgs struct {
	keys           []string // Store.globalKeys
	member         string   // the scope's hash
	all, strangers int      // the bounds on all keys and on strangers' keys; -1: none
	stranger       bool     // the key is a stranger's (quotaScript's answer)
	liveTTL        time.Duration
	setTTL         string // the sets' expiry, ms (Store.setTTL)
}

func (a globalArgs) keysArgs() ([]string, []string) {
	return a.keys, []string{a.member, strconv.Itoa(a.all), strconv.Itoa(a.strangers), flag(a.stranger), ms(a.liveTTL), a.setTTL}
}

// keyEndScript sets a counted key's expiry in its tenant's set once its
// generation ended, and marks the tenant known after a commit (keyEnd).
//
// KEYS: the tenant's set, the tenant's known marker
// ARGV: member, ttl ms (from now; 0: no longer counted), set ttl ms,
// known (ms to mark the tenant known for; 0: not)
//
// Returns 1.
var keyEndScript = newScript(nowLua + endLua + `
local set, known = KEYS[1], KEYS[2]
local member, ttl, set_ttl, known_ms = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
keyEnd(set, known, member, ttl, tostring(now() + ttl), set_ttl, known_ms, false)
return 1
`)

// keyEndArgs are keyEndScript's keys and arguments: end's in set.
type keyEndArgs struct {
	set string // the account's set (accountKey); its known marker is set + ":known"
	end countEnd
}

func (a keyEndArgs) keysArgs() ([]string, []string) {
	return []string{a.set, a.set + ":known"}, []string{a.end.member, ms(a.end.ttl), a.end.setTTL, ms(a.end.knownFor)}
}

// globalEndScript is keyEndScript for the sets of all keys, of strangers'
// keys and of commit_unknown keys (globalEnd).
//
// KEYS: the set of all keys, the set of strangers' keys, the set of
// commit_unknown keys
// ARGV: member, ttl ms (0: no longer counted), set ttl ms, committed
// (1|0), commit_unknown (1|0)
//
// Returns 1.
var globalEndScript = newScript(nowLua + endLua + `
local all, strangers, unknown = KEYS[1], KEYS[2], KEYS[3]
local member, ttl, set_ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local committed, ended_unknown = ARGV[4] == '1', ARGV[5] == '1'
local t = now()
globalEnd(all, strangers, unknown, member, ttl, tostring(t + ttl), set_ttl, committed, ended_unknown, t, false)
return 1
`)

// globalEndArgs are globalEndScript's keys and arguments: end's in the
// sets of all keys, of strangers' and of commit_unknown keys.
type globalEndArgs struct {
	keys []string // Store.globalKeys
	end  countEnd
}

func (a globalEndArgs) keysArgs() ([]string, []string) {
	return a.keys, []string{a.end.member, ms(a.end.ttl), a.end.setTTL, flag(a.end.committed), flag(a.end.unknown)}
}

// unknownScript counts the keys in commit_unknown whose records have not
// expired. It only reads: a scrape writes nothing, and the expired are
// removed as new ones come (globalEnd). A plain EVALSHA, not EVALSHA_RO
// with a no-writes flag, which Redis 6.2 does not know.
//
// KEYS: the set of commit_unknown keys
//
// Returns the count.
var unknownScript = newScript(nowLua + `
return redis.call('ZCOUNT', KEYS[1], now(), '+inf')
`)

// UnknownKeys returns how many keys Redis holds in commit_unknown: those
// the store's scripts ended so, until their records expire or the key is
// claimed again. Every replica that shares the store counts the same set.
// A failure is the scrape's to report: it is not a store operation that
// failed for want of Redis (Stats.Unavailable).
func (r *Store) UnknownKeys() (int64, error) {
	ctx, cancel := r.opCtx()
	defer cancel()
	n, err := exec(ctx, r.c, unknownScript, r.globalKeys()[2:], nil).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("redis commit_unknown keys: %w: %w", cache.ErrUnavailable, err)
	}
	return n, nil
}
