package redis

import (
	"strconv"

	"github.com/ssegate/ssegate/cache"
)

// stopWord ends an inbox entry that asks the owner replica to stop the
// generation it names ("<h> <gen> stop") rather than to mirror its
// journal ("<h> <gen>"). A replica that does not know the word reads the
// entry's generation as "<gen> stop", which names none: it drops it.
const stopWord = "stop"

// Stop asks for the end of the live generation gen of sc, cancelled
// (cache.Flight.Stop): at once when this replica runs it, and otherwise
// through the inbox of the replica st names its owner, which stops it
// when it takes the entry (the blocked BLPOP of Store.inbox: about one
// round trip). It returns cache.ErrNotFound when gen is not the key's
// live generation. A stop that reaches no owner (an outage of Redis, the
// owner gone) is lost: the caller sees the generation still live and may
// ask again; an owner that died is reaped by its followers as ever.
func (r *Store) Stop(sc cache.Scope, gen uint64) error {
	k := r.keys(sc)
	r.mu.Lock()
	f := r.flights[k.h]
	r.mu.Unlock()
	if f != nil && f.Gen == gen && f.Stop() {
		return nil
	}
	ctx, cancel := r.opCtx()
	vals, err := r.c.Do(ctx, r.c.B().Hmget().Key(k.st).Field("phase", "gen", "owner").Build()).ToArray()
	cancel()
	if err != nil {
		return r.unavailableErr("stop", err)
	}
	phase, _ := vals[0].ToString()
	genS, _ := vals[1].ToString()
	owner, _ := vals[2].ToString()
	if phase != "live" || genS != strconv.FormatUint(gen, 10) || owner == "" {
		return cache.ErrNotFound
	}
	if owner == r.replica {
		// Owned here, yet not in flights: it has just ended.
		return cache.ErrNotFound
	}
	ctx, cancel = r.opCtx()
	defer cancel()
	key := r.inboxKey(owner)
	for _, res := range r.c.DoMulti(ctx,
		r.c.B().Rpush().Key(key).Element(k.h+" "+genS+" "+stopWord).Build(),
		r.c.B().Pexpire().Key(key).Milliseconds(journalTTL.Milliseconds()).Build()) {
		if err := res.Error(); err != nil {
			return r.unavailableErr("stop", err)
		}
	}
	return nil
}

// stopped stops the owned flight f an inbox entry names.
func (r *Store) stopped(f *cache.Flight) {
	if _, ok := f.Backend().(*owner); ok && f.Stop() {
		r.cfg.Logger.Info("generation stopped at another replica's request", "scope", f.Scope, "generation", f.Gen)
	}
}
