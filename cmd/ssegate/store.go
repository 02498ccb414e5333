package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/redis"
	"github.com/ssegate/ssegate/proxy"
)

// redisOptions are the flags of the Redis store; without -redis the
// in-memory store is used.
type redisOptions struct {
	url     string
	lease   time.Duration
	timeout time.Duration
	down    string
	abandon int
	tails   time.Duration
	waitN   int
	waitFor time.Duration
}

func (ro *redisOptions) register(fs *flag.FlagSet) {
	rd := redis.DefaultConfig()
	fs.StringVar(&ro.url, "redis", "", "share keys with other replicas through Redis: redis://[user:password@]host:port[/db], or rediss:// for TLS; a Redis Cluster: redis://host:port?addr=host2:port&addr=host3:port, db 0 only (default: an in-memory store of this process only)")
	fs.DurationVar(&ro.lease, "redis-lease", rd.Lease, "with -redis: owner lease; a replica that dies leaves its streams to be aborted and its keys freed after about this long")
	fs.StringVar(&ro.down, "redis-down", "reject", "with -redis, while Redis is unreachable: reject keyed requests (503 store_unavailable with Retry-After) or relay them unprotected (no deduplication)")
	fs.DurationVar(&ro.timeout, "redis-timeout", rd.Timeout, "with -redis: bound on one Redis operation; keyed requests get 503 store_unavailable past it")
	fs.DurationVar(&ro.tails, "redis-tail-batch", rd.TailBatch, "with -redis: how often, at most, this replica reads the streams it follows from other replicas, one read for all of those written since (each append notifies), all of them every 250ms; adds up to this to a follower's events (at most 1s; negative: a blocking read per stream)")
	fs.IntVar(&ro.waitN, "redis-wait-replicas", rd.WaitReplicas, "with -redis: replicas of the Redis server that must have each claim and each commit (WAIT) before this replica acts on it, so that a failover to one of them cannot lose it: a duplicate then never calls the upstream a second time, nor is a committed key generated again (0: none, Redis's asynchronous replication alone)")
	fs.DurationVar(&ro.waitFor, "redis-wait-timeout", rd.WaitTimeout, "with -redis-wait-replicas: longest wait for those replicas after a claim or commit; one that reached fewer goes on and is counted in ssegate_redis_waits_short_total (less than -redis-timeout)")
	fs.IntVar(&ro.abandon, "redis-abandon-max", rd.MaxAbandoning, "with -redis: claims whose reply was lost past -redis-timeout that this replica ends at once, in the background, so that their duplicates need not wait a lease; past it, such a key waits for its lease")
}

// newStore returns the store the options choose and the function that
// closes it. mem carries the bounds both stores share.
func newStore(ro *redisOptions, mem cache.Config, log *slog.Logger) (proxy.Store, func(), error) {
	if ro.url == "" {
		m, err := cache.NewMemory(mem)
		if err != nil {
			return nil, nil, err
		}
		return m, m.Close, nil
	}
	r, err := redis.New(redis.Config{
		URL: ro.url, Lease: ro.lease, Timeout: ro.timeout, MaxAbandoning: ro.abandon, TailBatch: ro.tails,
		WaitReplicas: ro.waitN, WaitTimeout: ro.waitFor,
		TTL: mem.TTL, MaxCacheBytes: mem.MaxStoreBytes, Limits: mem.Limits, MaxKeys: mem.MaxKeys,
		MissingBody: mem.MissingBody, Logger: log,
	})
	if err != nil {
		return nil, nil, err
	}
	log.Info("keys are shared through redis", "lease", ro.lease.String(), "wait_replicas", ro.waitN)
	return r, r.Close, nil
}

// deploymentSecret returns the secret of proxy.Config.Secret: -secret when
// given; else, with Redis, the one its replicas share, waiting for Redis
// until ctx ends (without it this replica's tenants would differ from the
// others'); else nil, for which the proxy draws a random one.
func deploymentSecret(ctx context.Context, flagSecret string, store proxy.Store, log *slog.Logger) ([]byte, error) {
	if flagSecret != "" {
		return []byte(flagSecret), nil
	}
	r, ok := store.(*redis.Store)
	if !ok {
		return nil, nil
	}
	for warned := false; ; warned = true {
		secret, err := r.Secret(ctx)
		if err == nil || !errors.Is(err, cache.ErrUnavailable) {
			return secret, err
		}
		if !warned {
			log.Warn("waiting for redis for the shared secret (set -secret to start without redis)", "err", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil, errors.New("stopped while waiting for redis for the shared secret")
		case <-time.After(500 * time.Millisecond):
		}
	}
}
