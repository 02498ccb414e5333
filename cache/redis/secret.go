package redis

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/redis/rueidis"
)

// secretCheck is how often a store that handed out the shared secret
// checks that Redis still holds it.
var secretCheck = 10 * time.Second

// minSecret is the shortest secret Secret accepts from Redis.
const minSecret = 16

// secretKey is the Redis key of the deployment secret: one per prefix,
// outside every scope, with no TTL.
func (r *Store) secretKey() string { return r.cfg.Prefix + ":secret" }

// Secret returns the deployment secret that every replica on this Redis
// (and prefix) shares, for the proxy's tenant hash and signatures. The
// first replica to ask creates it, atomically: SET NX of 32 random bytes
// (hex), then GET, so every replica reads the one value that won. It has
// no TTL.
//
// Afterwards the store checks it every 10 s, until Close: if Redis lost it
// (a restart without persistence, an eviction), it is put back, so that a
// replica started later agrees with this one; if another value took its
// place (a replica started in between), the disagreement is logged as an
// error, since the two replicas' tenants differ. A deployment that cannot
// afford that window sets its secret itself instead.
func (r *Store) Secret(ctx context.Context) ([]byte, error) {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand documents it)
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	key := r.secretKey()
	err := r.c.Do(ctx, r.c.B().Set().Key(key).Value(hex.EncodeToString(b[:])).Nx().Build()).Error()
	if err != nil && !rueidis.IsRedisNil(err) { // nil: another replica's won
		return nil, r.unavailableErr("secret", err)
	}
	secret, err := r.c.Do(ctx, r.c.B().Get().Key(key).Build()).AsBytes()
	if err != nil {
		return nil, r.unavailableErr("secret", err)
	}
	if len(secret) < minSecret {
		return nil, fmt.Errorf("redis secret: %s holds %d bytes; want at least %d", key, len(secret), minSecret)
	}
	if r.secretKept.CompareAndSwap(false, true) {
		r.wg.Add(1)
		go r.keepSecret(secret)
	}
	return secret, nil
}

// keepSecret puts secret back into Redis whenever Redis lost it, and says
// so when another value replaced it; it ends with Close.
func (r *Store) keepSecret(secret []byte) {
	defer r.wg.Done()
	t := time.NewTicker(secretCheck)
	defer t.Stop()
	key := r.secretKey()
	differs := false // logged once per change
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := r.opCtx()
		err := r.c.Do(ctx, r.c.B().Set().Key(key).Value(string(secret)).Nx().Build()).Error()
		switch {
		case err == nil:
			r.cfg.Logger.Warn("redis had lost the shared secret; this replica's is back", "key", key)
			differs = false
		case rueidis.IsRedisNil(err):
			cur, err := r.c.Do(ctx, r.c.B().Get().Key(key).Build()).AsBytes()
			same := err != nil || bytes.Equal(cur, secret) // unreachable: nothing known
			if !same && !differs {
				r.cfg.Logger.Error("the shared secret in redis is not this replica's: replicas started since redis lost it hash credentials to other tenants; restart this replica, or set -secret on every replica",
					"key", key)
			}
			differs = !same
		}
		cancel()
	}
}
