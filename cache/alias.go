package cache

import (
	"strconv"
	"strings"
)

// An Alias is the name an upstream gave a key's stream (an OpenAI
// Responses id, from its response.created event), so that the provider's
// own resume API (GET /v1/responses/{id}?stream=true&starting_after=N)
// can be answered from the journal. Aliases are per tenant: another
// tenant's name resolves to nothing. An alias lives as long as the key's
// ledger entry (in memory) or its result (in Redis), and names one
// generation: after a regeneration the old name no longer resolves to it.
type Alias struct {
	Key string // the idempotency key
	Gen uint64 // the generation the upstream named
	// Base is the upstream's sequence number of the stream's first event:
	// the event with sequence number n is event n-Base+1 of the journal.
	Base int64
}

// aliasID identifies tenant's alias name (in Memory.aliases; hashed, in
// Redis) the way Scope.id identifies a key: per tenant.
func aliasID(tenant, name string) string { return Scope{Tenant: tenant, Key: name}.id() }

// SetAlias records that generation gen of sc is known upstream as name.
// A key's stream has at most one alias: a second replaces the first.
func (m *Memory) SetAlias(sc Scope, gen uint64, name string, base int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.keys[sc.id()]
	if e == nil || e.gen != gen {
		return
	}
	m.unaliasLocked(e)
	id := aliasID(sc.Tenant, name)
	if prev, ok := m.aliases[id]; ok {
		prev.e.alias = "" // the name now names this stream (an upstream that reuses ids)
	}
	e.alias = id
	m.aliases[id] = aliasEntry{e: e, a: Alias{Key: sc.Key, Gen: gen, Base: base}}
}

// unaliasLocked drops e's alias.
func (m *Memory) unaliasLocked(e *entry) {
	if ae, ok := m.aliases[e.alias]; ok && ae.e == e {
		delete(m.aliases, e.alias)
	}
	e.alias = ""
}

// aliasEntry is an alias and the ledger entry it names.
type aliasEntry struct {
	e *entry
	a Alias
}

// ResolveAlias returns what name is an alias of for tenant.
func (m *Memory) ResolveAlias(tenant, name string) (Alias, bool) {
	now := m.cfg.Now()
	m.mu.RLock()
	defer m.mu.RUnlock()
	ae, ok := m.aliases[aliasID(tenant, name)]
	if !ok || m.knownLocked(ae.e.id, now) != ae.e {
		return Alias{}, false
	}
	return ae.a, true
}

// aliasKey is the Redis key of an alias: a hash of tenant and name, so
// that neither is in Redis in clear.
func (r *Redis) aliasKey(tenant, name string) string {
	return r.cfg.Prefix + ":alias:" + digest(aliasID(tenant, name))
}

// SetAlias records that generation gen of sc is known upstream as name,
// for every replica, as long as a result is kept (TTL) past a live
// generation's bound (LiveTTL).
func (r *Redis) SetAlias(sc Scope, gen uint64, name string, base int64) {
	ctx, cancel := r.opCtx()
	defer cancel()
	v := sc.Key + "\x00" + strconv.FormatUint(gen, 10) + "\x00" + strconv.FormatInt(base, 10)
	ttl := r.cfg.TTL + r.cfg.LiveTTL
	if err := r.c.Do(ctx, r.c.B().Set().Key(r.aliasKey(sc.Tenant, name)).Value(v).Px(ttl).Build()).Error(); err != nil {
		r.cfg.Logger.Warn("redis alias", "err", err.Error()) // the provider's resume then goes to the upstream
	}
}

// ResolveAlias returns what name is an alias of for tenant.
func (r *Redis) ResolveAlias(tenant, name string) (Alias, bool) {
	ctx, cancel := r.opCtx()
	defer cancel()
	v, err := r.c.Do(ctx, r.c.B().Get().Key(r.aliasKey(tenant, name)).Build()).ToString()
	if err != nil {
		return Alias{}, false
	}
	parts := strings.Split(v, "\x00")
	if len(parts) != 3 {
		return Alias{}, false
	}
	gen, err1 := strconv.ParseUint(parts[1], 10, 64)
	base, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil {
		return Alias{}, false
	}
	return Alias{Key: parts[0], Gen: gen, Base: base}, true
}
