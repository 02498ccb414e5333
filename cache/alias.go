package cache

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
// Redis) the way Scope.ID identifies a key: per tenant.
func aliasID(tenant, name string) string { return Scope{Tenant: tenant, Key: name}.ID() }

// SetAlias records that generation gen of sc is known upstream as name.
// A key's stream has at most one alias: a second replaces the first.
func (m *Memory) SetAlias(sc Scope, gen uint64, name string, base int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.keys[sc.ID()]
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
