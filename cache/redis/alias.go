package redis

import (
	"strconv"
	"strings"

	"github.com/ssegate/ssegate/cache"
)

// aliasKey is the Redis key of an alias: a hash of tenant and name, so
// that neither is in Redis in clear.
func (r *Store) aliasKey(tenant, name string) string {
	return r.cfg.Prefix + ":alias:" + digest(cache.Scope{Tenant: tenant, Key: name}.ID())
}

// SetAlias records that generation gen of sc is known upstream as name,
// for every replica, as long as a result is kept (TTL) past a live
// generation's bound (LiveTTL).
func (r *Store) SetAlias(sc cache.Scope, gen uint64, name string, base int64) {
	ctx, cancel := r.opCtx()
	defer cancel()
	v := sc.Key + "\x00" + strconv.FormatUint(gen, 10) + "\x00" + strconv.FormatInt(base, 10)
	ttl := r.cfg.TTL + r.cfg.LiveTTL
	if err := r.c.Do(ctx, r.c.B().Set().Key(r.aliasKey(sc.Tenant, name)).Value(v).Px(ttl).Build()).Error(); err != nil {
		r.cfg.Logger.Warn("redis alias", "err", err.Error()) // the provider's resume then goes to the upstream
	}
}

// ResolveAlias returns what name is an alias of for tenant.
func (r *Store) ResolveAlias(tenant, name string) (cache.Alias, bool) {
	ctx, cancel := r.opCtx()
	defer cancel()
	v, err := r.c.Do(ctx, r.c.B().Get().Key(r.aliasKey(tenant, name)).Build()).ToString()
	if err != nil {
		return cache.Alias{}, false
	}
	parts := strings.Split(v, "\x00")
	if len(parts) != 3 {
		return cache.Alias{}, false
	}
	gen, err1 := strconv.ParseUint(parts[1], 10, 64)
	base, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil {
		return cache.Alias{}, false
	}
	return cache.Alias{Key: parts[0], Gen: gen, Base: base}, true
}
