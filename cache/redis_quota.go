package cache

import (
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// A tenant's keys are counted in one sorted set per tenant,
// prefix:tenant:{th}, whose members are the scope hashes of its keys and
// whose scores are when each key's records expire (ms, the server's
// clock): a live generation's LiveTTL ahead, then TTL after a commit or
// FailedTTL after a failure, as st's own expiry. Expired members are
// removed (ZREMRANGEBYSCORE) when a new key is counted, so they count
// against nothing.
//
// The set is in its tenant's Cluster slot, not in the scope's, so it
// cannot be updated in the claim script: a new key is counted before it
// is claimed. The claim script reports a key it has no record of ("new")
// instead of claiming it; the tenant's set then takes the key if the
// tenant has room (atomically per tenant), and the claim runs again. A
// known key (live, committed, failed, lost) is decided in one round trip,
// as before. What this leaves open, none of which refuses a key wrongly
// for longer than LiveTTL:
//   - a key counted whose claim then fails (Redis gone between the two)
//     counts until its LiveTTL score passes;
//   - a replica that dies between a generation's end and the set's update
//     leaves the key at its live score: a failed key counts for up to
//     LiveTTL rather than FailedTTL, a committed one stops counting after
//     LiveTTL though its result is kept for TTL;
//   - a generation that outlives LiveTTL without another request for its
//     key stops counting (renewals extend st, not the set);
//   - a failure's update that lands after the key was claimed again gives
//     the new generation the failure's expiry.

// tenantKey names the set of the keys of sc's tenant. The tenant, itself
// a hash of a credential, is hashed again so that the set's name does not
// repeat what the ledger's records are named by.
func (r *Redis) tenantKey(sc Scope) string {
	return r.cfg.Prefix + ":tenant:{" + digest("tenant\x00"+sc.Tenant) + "}"
}

// setTTL is the expiry of a tenant's set, renewed at each write: past any
// of its members' scores.
func (r *Redis) setTTL() string {
	return ms(max(r.cfg.TTL, r.cfg.FailedTTL, r.cfg.LiveTTL) + time.Minute)
}

// countKey counts sc's key against its tenant's bound, as live, and
// reports whether it is counted: false when the tenant holds its bound of
// other unexpired keys. unbounded counts it whatever the bound (a key the
// ledger already holds, claimed again).
func (r *Redis) countKey(sc Scope, k rkeys, unbounded bool) (bool, error) {
	bound := strconv.Itoa(r.cfg.MaxKeysPerTenant)
	if unbounded {
		bound = "-1"
	}
	ctx, cancel := r.opCtx()
	defer cancel()
	n, err := quotaScript.Exec(ctx, r.c, []string{r.tenantKey(sc)}, []string{
		k.h, bound, ms(r.cfg.LiveTTL), r.setTTL(),
	}).AsInt64()
	if err != nil {
		return false, r.unavailableErr("tenant keys", err)
	}
	return n == 1, nil
}

// tenantFull is the error of a new key its tenant has no room for.
func (r *Redis) tenantFull() error {
	return fmt.Errorf("this tenant holds %d keys, the -max-keys-per-tenant bound: %w", r.cfg.MaxKeysPerTenant, ErrTenantFull)
}

// keyEnded sets when sc's key stops counting against its tenant, now that
// its generation ended and its records expire in ttl. A failure to tell
// Redis leaves the key counted until its live score passes.
func (r *Redis) keyEnded(sc Scope, k rkeys, ttl time.Duration) {
	ctx, cancel := r.opCtx()
	defer cancel()
	err := keyEndScript.Exec(ctx, r.c, []string{r.tenantKey(sc)}, []string{k.h, ms(ttl), r.setTTL()}).Error()
	if err != nil && !rueidis.IsRedisNil(err) {
		r.unavailable.Add(1)
	}
}

// quotaScript counts a key in its tenant's set.
//
// KEYS: the tenant's set
// ARGV: member (the scope's hash), bound (-1: none), live ttl ms, set ttl ms
//
// Returns 1 when the key is counted (it was, or the tenant had room), 0
// when the tenant holds its bound of other unexpired keys.
var quotaScript = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
local bound = tonumber(ARGV[2])
if not cur and bound >= 0 and redis.call('ZCARD', KEYS[1]) >= bound then return 0 end
local exp = now + tonumber(ARGV[3])
if not cur or tonumber(cur) < exp then redis.call('ZADD', KEYS[1], exp, ARGV[1]) end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
`)

// keyEndScript sets a counted key's expiry once its generation ended.
//
// KEYS: the tenant's set
// ARGV: member, ttl ms (from now), set ttl ms
//
// Returns 1, or 0 when the key is not counted (its score passed).
var keyEndScript = rueidis.NewLuaScript(`
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
`)
