package redis

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/ssegate/ssegate/cache"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/redis/rueidis"
	"github.com/ssegate/ssegate/sse"
)

// Config configures a Redis store. Its zero value, with URL set, is
// usable: every zero field takes the default documented beside it.
type Config struct {
	// URL names the server: redis://[user:password@]host:port[/db], or
	// rediss:// for TLS (rueidis.ParseURL's syntax, which also accepts
	// ?addr= for more cluster seeds). A Redis Cluster is detected from
	// the server; it has database 0 only, and New refuses another.
	URL string
	// Prefix starts every key this store writes (default "ssg"). Replicas
	// that share keys must share the prefix.
	Prefix string
	// Lease is how long an owner's lease lasts without renewal (default
	// 10s); it is renewed every Lease/3. A replica that dies leaves its
	// generation to be reaped within Lease plus the follower's idle
	// interval (Lease/2, at most 2s).
	Lease time.Duration
	// Timeout bounds one Redis operation (default 2s). A claim that takes
	// longer fails with ErrUnavailable; within it, a claim whose
	// connection failed is sent again (claimScript is safe to repeat).
	Timeout time.Duration
	// TTL is how long a committed result is kept (default 24h).
	TTL time.Duration
	// FailedTTL is how long a failed or reaped generation is remembered,
	// so that a resume with its ids gets "gone" (default 5m).
	FailedTTL time.Duration
	// LiveTTL bounds how long a live generation's records outlive their
	// last lease renewal (default 1h; renewals extend them every quarter
	// of it); it only cleans up after a whole cluster vanished.
	LiveTTL time.Duration
	// MaxCacheBytes bounds the local copy of committed results (default
	// 64 MiB). Redis holds the truth; this only saves GETs.
	MaxCacheBytes int64
	// TailBatch is how often, at most, a replica reads the journals it
	// follows on a standalone Redis: one non-blocking XREAD over those
	// notified since their last read, all of them every tailFullEvery
	// (default 5ms, at most maxTailBatch). It adds up to TailBatch
	// and a round trip to a follower's events; negative: each tail reads
	// its own journal with a blocking XREAD (as on a Cluster).
	TailBatch time.Duration
	// WaitReplicas is how many of the server's replicas must have a claim
	// or a commit before the store acts on it (Redis's WAIT, sent after
	// the script on its connection): a failover to one of them cannot
	// lose it, so a duplicate of a claimed key joins rather than calling
	// the upstream again, and a committed key replays rather than being
	// generated again. 0 (the default): none, Redis's asynchronous
	// replication alone (docs/redis.md, Failure cases).
	WaitReplicas int
	// WaitTimeout bounds that wait (default 50ms, less than Timeout): a
	// claim or commit that reached fewer replicas by then goes on, as it
	// would without the wait, and is counted (Stats.WaitsShort).
	WaitTimeout time.Duration
	// MaxAbandoning bounds the claims whose reply was lost that this
	// replica is ending at once in the background (default 1024; a Redis
	// that times out every claim makes one per keyed request). Past it,
	// such a key waits for its lease to lapse.
	MaxAbandoning int
	// Limits bound this replica's live generations, owned and followed,
	// and the keys of each tenant and of strangers (counted across
	// replicas).
	cache.Limits
	// MaxKeys bounds the unexpired keys all replicas hold together
	// (default 1,000,000): past it new keys are refused with
	// ErrStoreFull. Redis's own bound (maxmemory with noeviction) would
	// refuse every write instead. See quota.go.
	MaxKeys int
	// MissingBody is the policy for a committed key whose body is gone
	// from Redis (evicted despite the advice to forbid eviction).
	MissingBody cache.MissingBody
	// Now is the clock of the ledger's timestamps (default time.Now).
	// Leases always use the monotonic clock.
	Now func() time.Time
	// Logger receives reaps, fences and outages (default slog.Default()).
	Logger *slog.Logger
}

// DefaultConfig is the zero Config with its defaults filled in, less
// its clock and logger: the one place a default is written, which
// cmd/ssegate's flags take theirs from.
func DefaultConfig() Config {
	var c Config
	c.setDefaults()
	c.Now, c.Logger = nil, nil
	return c
}

func (c *Config) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = "ssg"
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Lease, 10*time.Second)
	def(&c.Timeout, 2*time.Second)
	def(&c.TTL, 24*time.Hour)
	def(&c.FailedTTL, 5*time.Minute)
	def(&c.LiveTTL, time.Hour)
	if c.TailBatch == 0 {
		c.TailBatch = 5 * time.Millisecond
	}
	if c.MaxCacheBytes <= 0 {
		c.MaxCacheBytes = 64 << 20
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = 1_000_000
	}
	if c.MaxStrangerKeys <= 0 {
		c.MaxStrangerKeys = max(c.MaxKeys/2, 1)
	}
	if c.MaxAbandoning <= 0 {
		c.MaxAbandoning = 1024
	}
	def(&c.WaitTimeout, 50*time.Millisecond)
	c.Limits.SetDefaults()
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Stats counts what a Redis store did; all fields are cumulative
// except LiveBytes and LiveFlights.
type Stats struct {
	Claims      int64 // claim scripts run
	Batches     int64 // append batches Redis took (on a standalone Redis, several owners' share a script call)
	Events      int64 // events appended by this replica as owner
	Commits     int64 // generations this replica committed
	Fenced      int64 // owned generations ended because another replica took them over
	Reaped      int64 // generations of dead owners this replica ended as lost
	Tails       int64 // tails started (one per followed generation)
	Reads       int64 // XREAD calls of tails
	Renewals    int64 // lease renewals of owned generations
	Asks        int64 // signals sent to owner replicas for their journals
	Mirrors     int64 // owned generations whose journal a follower asked for
	Unavailable int64 // operations that failed for want of Redis
	Abandoned   int64 // generations of claims whose reply was lost, ended failed_retryable
	Waits       int64 // WAITs for replicas sent after claims and commits (Config.WaitReplicas)
	WaitsShort  int64 // of them, those that timed out or failed with fewer replicas than asked
	LiveBytes   int64
	LiveFlights int64
	// MaxLiveBytes is this replica's bound on LiveBytes (Limits), so that
	// a dashboard can show how near it is.
	MaxLiveBytes int64
}

// Store is the store of several replicas: the claim, the live journals,
// the committed results and the owner leases are kept in Redis, so that a
// request can start on one replica and be joined or resumed on another.
// It returns the same Flight and Result types as Memory, so the proxy
// cannot tell the stores apart.
//
// On the replica that claimed a key, the Flight's journal is mirrored to
// Redis in batches while the proxy appends to it, once another replica
// asks for it: a generation nobody follows from elsewhere costs Redis its
// claim, lease renewals and commit. On another replica, a join or resume
// gets a follower Flight fed by one tail per generation, which asks the
// owner for the journal and copies its encoded events byte for byte;
// local clients of both read the same journal code.
type Store struct {
	cfg   Config
	c     rueidis.Client
	codec *cache.Codec
	// results caches committed results by scope hash. Results are
	// immutable per generation, and every use checks the generation, so a
	// stale entry is never served.
	results *ristretto.Cache[string, *cache.Result]
	replica string        // names this replica in st.owner, for operators
	idle    time.Duration // how long a tail's XREAD blocks before it checks the owner

	journals *cache.Journals // the local journals: their bytes, all and per tenant, and when they seal

	mu      sync.Mutex // guards flights, owners and unknowns
	flights map[string]*cache.Flight
	owners  map[*owner]struct{} // the owners until their shutdown: renewLoop renews their leases
	// unknowns: the hashes of tool calls this replica ended
	// commit_unknown, with when their hold expires (ToolUnknowns).
	unknowns      map[string]time.Time
	unknownsSweep int // the size at which noteUnknown next drops the expired

	ctx    context.Context // cancelled by Close: ends blocking reads
	cancel context.CancelFunc
	wg     sync.WaitGroup // owners' and tails' goroutines

	claims, batches, events, commits, fenced, reaped, tails, reads, unavailable atomic.Int64
	renewals, asks, mirrors                                                     atomic.Int64

	// setRenewals spares the claims of a busy tenant the renewal of its
	// sets' expiry (claimScript).
	setRenewals setRenewals

	appends appendBatcher // owners' appends on a standalone Redis
	tailr   tailReader    // followers' reads on a standalone Redis (tails.go)

	pipe      scriptPipe   // claims and commits, sent together (pipeline.go)
	pipelines atomic.Int64 // pipelines of several calls scriptPipe sent

	waits, waitsShort atomic.Int64 // WAITs for replicas sent, and those short of them (pipeline.go)
	waitWarned        atomic.Int64 // when a short wait was last logged (unix ns)

	inboxOnce sync.Once // starts inbox and renewLoop at the first owned generation

	abandoned  atomic.Int64 // claims whose reply was lost, ended by abandon
	abandoning atomic.Int64 // abandon's goroutines running

	secretKept atomic.Bool // keepSecret runs (secret.go)
}

// New connects to Redis and returns the store; Close releases it.
// If Redis cannot be reached at start the store is still returned (with a
// single-node client that keeps reconnecting, replaced once Redis answers
// by the client the server calls for, a cluster client on a Cluster), so
// that ssegate can serve unkeyed traffic and report itself not ready
// until Redis comes.
func New(cfg Config) (*Store, error) {
	cfg.setDefaults()
	if cfg.URL == "" {
		return nil, errors.New("redis: no URL")
	}
	if cfg.WaitReplicas < 0 {
		return nil, fmt.Errorf("redis: %d replicas to wait for: at least 0", cfg.WaitReplicas)
	}
	if cfg.WaitReplicas > 0 && cfg.WaitTimeout >= cfg.Timeout {
		return nil, fmt.Errorf("redis: the wait for replicas (%v) must be shorter than the timeout of an operation (%v)", cfg.WaitTimeout, cfg.Timeout)
	}
	if cfg.TailBatch > maxTailBatch {
		return nil, fmt.Errorf("redis: tail batch %v is past its bound, %v: followers' events would wait that long", cfg.TailBatch, maxTailBatch)
	}
	opt, err := rueidis.ParseURL(cfg.URL)
	if err != nil {
		// url.Error quotes the whole URL, password included.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("redis URL: %w", err)
	}
	// Client-side caching needs RESP3 tracking and buys nothing here:
	// results are cached by generation, and st must never be cached.
	opt.DisableCache = true
	// A few microseconds of delay lets concurrent appends share a write
	// (docs/redis.md, Client and batching: 2.3x the throughput at the same latency).
	opt.MaxFlushDelay = 20 * time.Microsecond
	if opt.Dialer.Timeout == 0 {
		opt.Dialer.Timeout = cfg.Timeout
	}
	// Detect a server that stopped answering (paused, partitioned) within
	// a few timeouts rather than rueidis's default of 10s, so the next
	// command dials afresh.
	opt.ConnWriteTimeout = max(3*cfg.Timeout, time.Second)
	c, err := rueidis.NewClient(opt)
	if err != nil && isSelectError(err) {
		// Retrying cannot help: a Redis Cluster has database 0 only.
		return nil, fmt.Errorf("redis connect: %w (a Redis Cluster has database 0 only: drop /%d from the URL)", err, opt.SelectDB)
	}
	var swap *swapClient
	if err != nil && len(opt.InitAddress) == 1 && !isAuthError(err) {
		cfg.Logger.Warn("redis unreachable at start; will keep trying", "err", err.Error())
		single := opt
		single.ForceSingleClient = true
		c, err = rueidis.NewClient(single)
		if c != nil {
			err = nil
			swap = newSwapClient(c)
			c = swap
		}
	}
	if err != nil {
		return nil, fmt.Errorf("redis connect: %w", err)
	}
	codec, err := cache.NewCodec(cfg.MaxStreamBytes)
	if err != nil {
		c.Close()
		return nil, err
	}
	results, err := ristretto.NewCache(&ristretto.Config[string, *cache.Result]{
		NumCounters:        max(cfg.MaxCacheBytes/4096*10, 10_000),
		MaxCost:            cfg.MaxCacheBytes,
		BufferItems:        64,
		IgnoreInternalCost: true,
	})
	if err != nil {
		c.Close()
		codec.Close()
		return nil, fmt.Errorf("result cache: %w", err)
	}
	host, _ := os.Hostname()
	r := &Store{
		cfg: cfg, c: c, codec: codec, results: results,
		replica: fmt.Sprintf("%s/%d/%s", host, os.Getpid(), newToken()[:8]),
		idle:    min(max(cfg.Lease/2, 50*time.Millisecond), 2*time.Second),
		flights: make(map[string]*cache.Flight),
		owners:  make(map[*owner]struct{}),
	}
	r.journals = cache.NewJournals(cfg.Limits, cfg.Now)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	if swap != nil {
		// Once Redis answers, the client rueidis picks from the server
		// (a cluster client on a Cluster) replaces the single-node one.
		r.wg.Go(func() {
			swap.redial(r.ctx, opt, 500*time.Millisecond, 2*cfg.Timeout+r.idle, func(err error) {
				cfg.Logger.Warn("redis not connected yet; will keep trying", "err", err.Error())
			}, func() {
				cfg.Logger.Info("redis reachable; connected", "mode", fmt.Sprint(swap.Mode()))
				r.loadScripts()
			})
		})
	} else {
		r.loadScripts()
	}
	return r, nil
}

// loadScripts loads the store's scripts ahead of their first calls
// (loadAll); a failure is logged, and each script then loads at its first
// call.
func (r *Store) loadScripts() {
	if err := loadAll(r.ctx, r.c, r.cfg.Timeout); err != nil {
		r.cfg.Logger.Warn("redis: could not load the scripts ahead; each loads at its first call", "err", err.Error())
	}
}

func isAuthError(err error) bool {
	s := strings.ToUpper(err.Error())
	return strings.Contains(s, "WRONGPASS") || strings.Contains(s, "NOAUTH") || strings.Contains(s, "NOPERM")
}

// isSelectError reports the server's refusal of the URL's database: a
// Redis Cluster refuses SELECT, a standalone server a db past its
// databases setting.
func isSelectError(err error) bool {
	s := strings.ToUpper(err.Error())
	return strings.Contains(s, "SELECT IS NOT ALLOWED") || strings.Contains(s, "DB INDEX IS OUT OF RANGE")
}

// Close ends the followers' tails (their clients get stream_aborted),
// stops the owners' lease renewals, and closes the connection. Owned
// generations still live are left to expire and be reaped; the proxy
// aborts them before closing the store.
func (r *Store) Close() {
	r.cancel()
	r.mu.Lock()
	var owners []*owner
	for _, f := range r.flights {
		if o, ok := f.Backend().(*owner); ok {
			owners = append(owners, o)
		}
	}
	r.mu.Unlock()
	for _, o := range owners {
		o.shutdown()
	}
	// The cancel ends the calls in flight but one that rueidis reads
	// synchronously (alone on its connection, its context with a
	// deadline: pipe.Do's syncDo), which ends only at its deadline or when
	// its connection closes: closing the client first ends it, within
	// rueidis's own close of a server that does not answer (a second per
	// pipelined connection). A blocking command's connection is not the
	// client's to close: the inbox's runs under blockCtx, which the cancel
	// ends; a follower's tail (follower.tail's XREAD) still ends only at its
	// own bound, idle + -redis-timeout, on a Redis that stopped answering.
	r.c.Close()
	r.wg.Wait()
	r.results.Close()
	r.codec.Close()
}

// Ping reports whether Redis answers, for readiness checks.
func (r *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	if err := r.c.Do(ctx, r.c.B().Ping().Build()).Error(); err != nil {
		return fmt.Errorf("redis ping: %w: %w", cache.ErrUnavailable, err)
	}
	return nil
}

// Stats returns the store's counters.
func (r *Store) Stats() Stats {
	r.mu.Lock()
	n := int64(len(r.flights))
	r.mu.Unlock()
	return Stats{
		Claims: r.claims.Load(), Batches: r.batches.Load(), Events: r.events.Load(),
		Commits: r.commits.Load(), Fenced: r.fenced.Load(), Reaped: r.reaped.Load(),
		Tails: r.tails.Load(), Reads: r.reads.Load(), Unavailable: r.unavailable.Load(),
		Renewals: r.renewals.Load(), Asks: r.asks.Load(), Mirrors: r.mirrors.Load(),
		Abandoned: r.abandoned.Load(), Waits: r.waits.Load(), WaitsShort: r.waitsShort.Load(),
		LiveBytes: r.journals.Bytes(), LiveFlights: n, MaxLiveBytes: r.cfg.MaxLiveBytes,
	}
}

// rkeys are the Redis keys of one scope.
type rkeys struct {
	h                  string // the scope's hash, also the local registry key
	st, lease, j, res  string
	all, withoutResult []string
	journal            []string // st, j: the append script's keys
}

// keys derives a scope's keys. The hash keeps tenants and keys out of
// Redis in clear and puts all of a scope's keys in one Cluster slot.
func (r *Store) keys(sc cache.Scope) rkeys {
	h := digest(sc.ID())
	p := r.cfg.Prefix + ":{" + h + "}:"
	k := rkeys{h: h, st: p + "st", lease: p + "lease", j: p + "j", res: p + "res"}
	k.all = []string{k.st, k.lease, k.j, k.res}
	k.withoutResult = k.all[:3]
	k.journal = []string{k.st, k.j}
	return k
}

// digest is the 22-character (132-bit) hash that names s in Redis keys,
// so that tenants, keys and aliases are not in Redis in clear.
func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base64.RawURLEncoding.EncodeToString(sum[:])[:22]
}

// opCtx bounds one Redis operation.
func (r *Store) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, r.cfg.Timeout)
}

func (r *Store) unavailableErr(op string, err error) error {
	r.unavailable.Add(1)
	return fmt.Errorf("redis %s: %w: %w", op, cache.ErrUnavailable, err)
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand documents it)
	return hex.EncodeToString(b[:])
}

// Begin takes the decision of docs/design.md, Request decision, for one request with a key, atomically
// across every replica sharing the Redis: among concurrent callers for one
// scope exactly one gets Miss, whichever replica they reached. A Miss
// starts the owner's lease and journal mirror; a Join returns the local
// flight of that generation, starting a tail when this replica has none.
// An error wraps ErrUnavailable (Redis unreachable), ErrStoreFull (this
// replica's live journals are full or its tenant is past its share of
// them, or a new key finds MaxKeys keys, or MaxStrangerKeys of strangers
// when its tenant is one) or ErrTenantFull (a new key of a tenant that
// holds MaxKeysPerTenant keys); keys are counted across replicas (see
// quota.go).
func (r *Store) Begin(sc cache.Scope, fp string) (cache.Begun, error) {
	return r.beginTool(sc, fp, nil)
}

// BeginTool is Begin for an MCP tool call t (Memory.BeginTool): a key
// whose call ended commit_unknown, or whose owner died, answers Unknown.
func (r *Store) BeginTool(sc cache.Scope, fp string, t cache.Tool) (cache.Begun, error) {
	return r.beginTool(sc, fp, &t)
}

func (r *Store) beginTool(sc cache.Scope, fp string, t *cache.Tool) (cache.Begun, error) {
	if err := r.journals.Full(); err != nil {
		return cache.Begun{}, err
	}
	k := r.keys(sc)
	// A committed tool call is never run again (Memory.beginTool).
	refuse := r.cfg.MissingBody == cache.Refuse || t != nil
	ask := askCount // a key with no record is counted against its tenant first
	// On a standalone Redis the claim counts the key itself: one round
	// trip where a Cluster takes three (claimScript).
	shared := r.sharedKeys()
	keys := k.all
	var admitErr error
	// moreCounted: the key is counted in the sets of the scope's accounts
	// after its first (countMore); a claim that a bound then refuses takes
	// it out of them.
	moreCounted := len(more(sc)) == 0
	countedMore := false // by this claim, against the bound
	// addedMore are the sets this claim's count added the key to, which
	// it takes out again unless it takes the key; hadMore those that
	// counted it already, by another claim of it that may take it out.
	var addedMore, hadMore []string
	// untaken takes out what this claim added, when it does not take the
	// key.
	untaken := func() {
		if len(addedMore) > 0 {
			r.uncountMore(addedMore, k)
			addedMore = nil
		}
	}
	if shared {
		keys = r.finishKeys(sc, k, true) // the same keys
		// A tenant past its share of the live journals gets no new key;
		// its hits and joins are answered as usual.
		if admitErr = r.journals.Admit(sc); admitErr != nil || !moreCounted {
			ask = askRefuse
		}
	}
	// The token is chosen before the claim is sent, so that a claim sent
	// again after its reply was lost finds the key live under it and takes
	// it (claimScript). A claim whose outcome stays unknown is abandoned.
	tok := newToken()
	var tool string
	var utl time.Duration
	if t != nil {
		tool, utl = t.Name, t.KeepFor(cache.StateCommitUnknown, r.cfg.TTL, r.cfg.FailedTTL)
		if tool == "" {
			tool = "?" // a tool call must be known as one
		}
	}
	// A replay can find its result expired between the claim and the GET;
	// the claim then decides again, which is bounded by the TTL's arrival.
	for range 4 {
		sent := time.Now() // the lease runs from no earlier than this
		ctx, cancel := r.opCtx()
		r.claims.Add(1)
		args := claimArgs{keys: keys, fp: fp, tok: tok, owner: r.replica, lease: r.cfg.Lease, liveTTL: r.cfg.LiveTTL,
			now: r.cfg.Now(), refuseGone: refuse, ask: ask, tool: tool, unknownTTL: utl}
		var sets []string // the count's sets, in the order of renew's flags
		renew := ""
		if shared {
			sets = []string{keys[4], keys[6], keys[7]} // the tenant's set, all keys', strangers' (finishKeys)
			renew = r.setRenewals.flags(sent, sets...)
			args.count = &claimCount{perTenant: r.cfg.MaxKeysPerTenant, all: r.cfg.MaxKeys,
				strangers: r.cfg.MaxStrangerKeys, setTTL: r.setTTL(), member: k.h, renew: renew}
		}
		out, err := scriptStrings(r.runPiped(ctx, claimScript, args))
		cancel()
		if err != nil {
			// Redis may come back from an older snapshot or a replica
			// behind: the sets' expiries this replica renewed may be gone.
			r.setRenewals.forget()
			if !r.abandon(sc, k, tok, sent, err, addedMore) {
				untaken() // the claim did not run
			}
			return cache.Begun{}, r.unavailableErr("claim", err)
		}
		a, err := parseClaimAnswer(out)
		if err != nil {
			untaken()
			return cache.Begun{}, fmt.Errorf("redis claim: %w", err)
		}
		if a.verdict != claimNew && a.verdict != claimReplay && a.verdict != claimMiss {
			untaken() // the key is not this claim's
		}
		if a.heldReaped > 0 {
			r.heldReaped(sc, k, a.heldReaped)
		}
		switch a.verdict {
		case claimNew:
			if admitErr != nil {
				return cache.Begun{}, admitErr
			}
			if err := r.journals.Admit(sc); err != nil {
				return cache.Begun{}, err
			}
			if !moreCounted {
				var err error
				addedMore, hadMore, err = r.countMore(sc, k, false)
				if err != nil {
					return cache.Begun{}, err
				}
				moreCounted, countedMore = true, true
			}
			if shared {
				ask = askCount // the claim counts the rest
				continue
			}
			if err := r.countKey(sc, k, false); err != nil {
				untaken()
				return cache.Begun{}, err
			}
			ask = askClaim
			continue
		case claimFull:
			untaken()
			return cache.Begun{}, r.fullErr(a.full)
		case claimStale:
			// Only a copy that arrives after its caller gave up reads
			// this; a caller that does has had its generation ended.
			return cache.Begun{}, r.unavailableErr("claim", errors.New("the claim's generation ended before its answer came"))
		case claimConflict:
			return cache.Begun{Decision: cache.Conflict}, nil
		case claimUnknown:
			return cache.Begun{Decision: cache.Unknown}, nil
		case claimStopped:
			return cache.Begun{Decision: cache.Cancelled}, nil
		case claimGone:
			return cache.Begun{Decision: cache.Gone}, nil
		case claimReplay:
			res, err := r.result(sc, k, a.gen)
			if errors.Is(err, cache.ErrNotFound) {
				continue
			}
			untaken()
			if err != nil {
				return cache.Begun{}, err
			}
			return cache.Begun{Decision: cache.Hit, Result: res}, nil
		case claimJoin:
			return cache.Begun{Decision: cache.Join, Flight: r.follow(sc, k, a.gen, fp)}, nil
		}
		if a.counted {
			// The count renewed the sets its flags asked it to; the
			// strangers' set only for a stranger's key, which only a
			// fresh key's answer tells.
			var done []string
			for i, set := range sets {
				if renew[i] == '1' && (i < 2 || a.fresh == "2") {
					done = append(done, set)
				}
			}
			r.setRenewals.renewed(sent, done...)
		}
		if ask == askCount && !a.counted {
			// A key the ledger held (failed, lost, or without its body)
			// starts again: it counts as live.
			if err := r.countKey(sc, k, true); err != nil {
				r.cfg.Logger.Warn("a key claimed again is not counted for its tenant", "scope", sc, "err", err.Error())
			}
		}
		if len(more(sc)) > 0 && !countedMore {
			// A key the ledger held starts again: it counts as live in
			// every account.
			if _, _, err := r.countMore(sc, k, true); err != nil {
				r.cfg.Logger.Warn("a key claimed is not counted for its credentials", "scope", sc, "err", err.Error())
			}
		} else if len(hadMore) > 0 {
			// Another claim of the key counted it there first, and takes
			// it out if a bound refuses it: count it again.
			if _, _, err := r.countMore(cache.Scope{Accounts: append([]string{""}, hadMore...)}, k, true); err != nil {
				r.cfg.Logger.Warn("a key claimed is not counted for its credentials", "scope", sc, "err", err.Error())
			}
		}
		if a.reaped {
			r.cfg.Logger.Warn("reaped a generation whose owner's lease expired",
				"scope", sc, "state", cache.StateCommitUnknown)
			r.reaped.Add(1)
		}
		r.recordAccounts(sc, k)
		f := r.own(sc, k, a.gen, tok, fp, sent, a.fresh, t)
		return cache.Begun{Decision: cache.Miss, Flight: f, Regenerated: a.regenerated}, nil
	}
	return cache.Begun{}, r.unavailableErr("claim", errors.New("the committed result kept expiring"))
}

// recordAccounts keeps sc's accounts in k's record for the generation it
// claimed, so that a replica that tails it (Attach) charges the tail's
// live bytes to them, and a reap it does ends the key's count in their
// sets, whatever scope the resume came with: a resume URL carries no
// credential, and a client could otherwise open each tail under a
// tenant of its own. A scope without Accounts records none (the claim
// cleared the last generation's): its followers' scope, of the same
// tenant, is its own. Best effort: a failure, or a tail opened before
// the record, charges the follower's own scope's accounts.
func (r *Store) recordAccounts(sc cache.Scope, k rkeys) {
	if len(sc.Accounts) == 0 {
		return
	}
	ctx, cancel := r.opCtx()
	defer cancel()
	err := r.c.Do(ctx, r.c.B().Hset().Key(k.st).FieldValue().FieldValue("acc", strings.Join(sc.Accounts, " ")).Build()).Error()
	if err != nil {
		r.unavailable.Add(1)
		r.cfg.Logger.Warn("a claim's accounts are not recorded for its followers", "scope", sc, "err", err.Error())
	}
}

// sharedKeys reports whether the scripts may touch keys of different
// hash slots: on a standalone Redis (or one behind Sentinel), not on a
// Cluster. Then a claim counts its key and a finish ends its count in the
// same script, rather than in scripts of their own.
func (r *Store) sharedKeys() bool { return r.c.Mode() != rueidis.ClientModeCluster }

// heldReaped tells what a claim did that reaped a dead owner's tool call
// to commit_unknown, held for hold (claimScript), as a follower's reap
// does: logs and counts it, and ends its count with that hold.
func (r *Store) heldReaped(sc cache.Scope, k rkeys, hold time.Duration) {
	r.cfg.Logger.Warn("reaped a tool call whose owner's lease expired",
		"scope", sc, "state", cache.StateCommitUnknown)
	r.reaped.Add(1)
	r.keyEnded(sc, k, cache.StateCommitUnknown, hold)
	r.noteUnknown(k, r.cfg.Now().Add(hold))
}

// abandon ends, in the background, the generation a claim may have made
// although its caller never learnt it: a claim that failed without a
// Redis error reply (a timeout, a connection cut after the command went
// out, past rueidis's retries) may have run. Unended, its key would stay
// live with a lease and no owner: duplicates would join a generation
// that never gets an event and end, a lease later, reaped as if a
// generation had been lost. abandonScript ends it failed_retryable as
// soon as Redis answers, so that its joiners get a retryable error at
// once and the caller's retry (told 503 store_unavailable, Retry-After)
// claims the key. The claim may also not have reached Redis yet: the
// script fences its token first, so that the claim, should it land
// later, takes nothing. It keeps trying for as long as a fence is kept
// (FailedTTL, or the lease if longer), and gives up then. At most MaxAbandoning run at once.
//
// added are the sets of the scope's accounts after its first the claim
// added its key to (countMore): abandon takes the key out of them when it
// finds the claim never ran. It reports false when it does not take the
// claim over: the claim did not run (Redis answered it with an error, or
// it was never sent), or nothing will end it here (closing, or too many
// abandoning); the caller then takes the key out of added itself, since
// a key whose claim ran but is abandoned by no one is reaped a lease
// later, while a count left in those sets would refuse keys for LiveTTL.
func (r *Store) abandon(sc cache.Scope, k rkeys, tok string, sent time.Time, err error, added []string) bool {
	if _, ok := rueidis.IsRedisErr(err); ok {
		return false // Redis answered: the script did not run
	}
	if errors.Is(err, errClientChanged) {
		return false // not sent: its keys were a standalone Redis's (exec)
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return false // not sent: no connection
	}
	if r.ctx.Err() != nil {
		return false // closing: the lease ends it
	}
	if r.abandoning.Add(1) > int64(r.cfg.MaxAbandoning) {
		r.abandoning.Add(-1)
		return false
	}
	r.cfg.Logger.Warn("a claim's outcome is unknown; ending the generation it may have made",
		"scope", sc, "err", err.Error())
	r.wg.Go(func() {
		defer r.abandoning.Add(-1)
		backoff := 10 * time.Millisecond
		for time.Since(sent) < max(r.cfg.Lease, r.cfg.FailedTTL) {
			ctx, cancel := r.opCtx()
			n, err := run(ctx, r.c, abandonScript, abandonArgs{
				keys: k.withoutResult, tok: tok, stTTL: r.cfg.FailedTTL, now: r.cfg.Now(),
			}).AsInt64()
			cancel()
			if err == nil {
				if n == 1 {
					r.abandoned.Add(1)
					r.cfg.Logger.Warn("ended the generation of a claim whose reply was lost",
						"scope", sc, "state", cache.StateFailedRetryable)
					r.keyEnded(sc, k, cache.StateFailedRetryable, r.cfg.FailedTTL)
				} else if len(added) > 0 {
					// The claim never ran (its token is fenced) or its
					// generation was ended by another: what it counted
					// in the other accounts' sets is not a live key's.
					r.uncountMore(added, k)
				}
				return
			}
			select {
			case <-r.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
		}
	})
	return true
}

func nowMS(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// Attach finds what a resume reads, as Memory.Attach documents. A live
// generation is served from this replica's flight of it (a tail when
// another replica owns it); a resume past what the tail has copied waits
// for the tail to catch up, bounded by the lease, since the owner's own
// client may be a batch ahead of Redis.
func (r *Store) Attach(sc cache.Scope, fp string, after sse.ID, hasAfter bool) (*cache.Flight, *cache.Result, error) {
	k := r.keys(sc)
	ctx, cancel := r.opCtx()
	vals, err := r.c.Do(ctx, r.c.B().Hmget().Key(k.st).Field("phase", "gen", "fp", "acc").Build()).ToArray()
	cancel()
	if err != nil {
		return nil, nil, r.unavailableErr("attach", err)
	}
	phase, _ := vals[0].ToString()
	genS, _ := vals[1].ToString()
	stfp, _ := vals[2].ToString()
	if acc, _ := vals[3].ToString(); acc != "" {
		// The tail is charged to the accounts of the claim it follows,
		// whatever the resume's own (recordAccounts).
		sc.Accounts = strings.Fields(acc)
	}
	if phase == "" {
		return nil, nil, cache.ErrNotFound
	}
	if fp != "" && stfp != fp {
		return nil, nil, cache.ErrConflict
	}
	gen, err := strconv.ParseUint(genS, 10, 64)
	if err != nil {
		return nil, nil, fmt.Errorf("redis attach: generation %q: %w", genS, err)
	}
	if hasAfter && after.Gen != gen {
		return nil, nil, cache.ErrGone
	}
	switch phase {
	case "live":
		f := r.follow(sc, k, gen, stfp)
		if hasAfter && after.Seq > 0 {
			if err := r.catchUp(f, after.Seq); err != nil {
				return nil, nil, err
			}
		}
		return f, nil, nil
	case "done":
		res, err := r.result(sc, k, gen)
		if errors.Is(err, cache.ErrNotFound) {
			return nil, nil, cache.ErrGone
		}
		if err != nil {
			return nil, nil, err
		}
		if hasAfter && res.Head.Stream && after.Seq > uint64(res.Events()) {
			return nil, nil, cache.ErrPosition
		}
		return nil, res, nil
	default:
		return nil, nil, cache.ErrGone
	}
}

// catchUp waits until f holds seq events, f ends, or the owner has had a
// lease's time to get them to Redis.
func (r *Store) catchUp(f *cache.Flight, seq uint64) error {
	if uint64(f.Events()) >= seq {
		return nil
	}
	sub, err := f.Subscribe(0)
	if err != nil {
		return err
	}
	defer sub.Close()
	t := time.NewTimer(r.cfg.Lease + r.idle)
	defer t.Stop()
	for uint64(f.Events()) < seq {
		select {
		case <-sub.C():
			for {
				p, ended := sub.Read()
				if ended && uint64(f.Events()) < seq {
					if state, _, _ := f.Outcome(); state == cache.StateCommitted {
						return cache.ErrPosition
					}
					return cache.ErrGone
				}
				if ended || len(p) == 0 {
					break
				}
			}
		case <-t.C:
			return nil // the proxy's Subscribe reports the position
		}
	}
	return nil
}

// result returns the committed result of gen: the local copy, or Redis's.
// ErrNotFound means Redis no longer holds it (or holds another
// generation's).
func (r *Store) result(sc cache.Scope, k rkeys, gen uint64) (*cache.Result, error) {
	if res, ok := r.results.Get(k.h); ok && res.Gen == gen && res.Scope.Same(sc) {
		return res, nil
	}
	ctx, cancel := r.opCtx()
	b, err := r.c.Do(ctx, r.c.B().Get().Key(k.res).Build()).AsBytes()
	cancel()
	if rueidis.IsRedisNil(err) {
		return nil, cache.ErrNotFound
	}
	if err != nil {
		return nil, r.unavailableErr("result", err)
	}
	res, err := r.codec.Decode(b, sc)
	if err != nil {
		return nil, fmt.Errorf("redis result: %w", err)
	}
	if res.Gen != gen {
		return nil, cache.ErrNotFound
	}
	r.keep(k, res)
	return res, nil
}

// keep caches a committed result locally. ristretto may drop it; that
// costs a GET later, nothing else.
func (r *Store) keep(k rkeys, res *cache.Result) {
	if res.Unpack() != nil {
		return
	}
	r.results.SetWithTTL(k.h, res, res.Cost(), r.cfg.TTL)
}

// own registers the flight this replica just claimed and starts its
// journal mirror and lease.
// fresh is the claim's (claimAnswer.fresh), for the finish.
func (r *Store) own(sc cache.Scope, k rkeys, gen uint64, tok, fp string, claimed time.Time, fresh string, t *cache.Tool) *cache.Flight {
	o := newOwner(r, k, tok, gen, claimed)
	o.fresh = fresh
	f := r.journals.NewFlight(o, sc, gen, fp, t)
	o.f = f
	r.mu.Lock()
	r.flights[k.h] = f
	r.mu.Unlock()
	o.start()
	r.inboxOnce.Do(func() {
		r.wg.Go(r.inbox)
		r.wg.Go(r.renewLoop)
	})
	return f
}

// inboxKey names the list where followers ask the replica named replica
// for journals: its own hash tag, since it serves every scope.
func (r *Store) inboxKey(replica string) string {
	return r.cfg.Prefix + ":inbox:{" + digest(replica) + "}"
}

// inbox takes the asks of followers on other replicas, "<h> <gen>" each,
// and starts the mirror of the owned generation they name. An ask lost
// here (an outage, a failover) is found by the owner's next renewal.
func (r *Store) inbox() {
	key := r.inboxKey(r.replica)
	backoff := 5 * time.Millisecond
	for r.ctx.Err() == nil {
		ctx, cancel := r.blockCtx(r.idle + r.cfg.Timeout)
		kv, err := r.c.Do(ctx, r.c.B().Blpop().Key(key).Timeout(r.idle.Seconds()).Build()).AsStrSlice()
		cancel()
		switch {
		case rueidis.IsRedisNil(err):
			continue
		case err != nil:
			if r.ctx.Err() != nil {
				return
			}
			r.unavailable.Add(1)
			select {
			case <-r.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, r.idle)
			continue
		}
		backoff = 5 * time.Millisecond
		if len(kv) == 2 {
			r.asked(kv[1])
		}
		// A burst of asks is taken in one more round trip, not one each.
		ctx, cancel = r.opCtx()
		more, _ := r.c.Do(ctx, r.c.B().Lpop().Key(key).Count(maxBatch).Build()).AsStrSlice()
		cancel()
		for _, v := range more {
			r.asked(v)
		}
	}
}

// blockCtx bounds a blocking command by d and ends it when the store
// closes. Its context has no deadline, on purpose: rueidis sends a
// command whose context has a deadline, when it is alone on its
// connection (a blocking command always is: a connection of its own),
// synchronously, bounded by the deadline only (pipe.Do's syncDo), so that
// Close's cancel would not end it and Close would wait for the deadline
// on a Redis that stopped answering. Without a deadline the command goes
// through the connection's queue, where the cancel, or the timer's, ends
// it at once.
func (r *Store) blockCtx(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.ctx)
	t := time.AfterFunc(d, cancel)
	return ctx, func() {
		t.Stop()
		cancel()
	}
}

// asked starts the mirror of the owned generation an ask names, if this
// replica still owns it.
func (r *Store) asked(v string) {
	h, gen, _ := strings.Cut(v, " ")
	gen, word, _ := strings.Cut(gen, " ")
	r.mu.Lock()
	f := r.flights[h]
	r.mu.Unlock()
	if f == nil || strconv.FormatUint(f.Gen, 10) != gen {
		return
	}
	if word == stopWord {
		r.stopped(f)
		return
	}
	if o, ok := f.Backend().(*owner); ok {
		o.ask()
	}
}

// follow returns this replica's flight of a live generation: the one it
// owns or already tails, or a new follower with its tail. One tail per
// generation per replica serves all of its local clients.
func (r *Store) follow(sc cache.Scope, k rkeys, gen uint64, fp string) *cache.Flight {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f := r.flights[k.h]; f != nil && f.Gen == gen {
		select {
		case <-f.Done():
		default:
			return f
		}
	}
	fl := &follower{r: r, k: k, gen: strconv.FormatUint(gen, 10), tok: newToken()}
	f := r.journals.NewFlight(fl, sc, gen, fp, nil)
	fl.f = f
	r.flights[k.h] = f
	r.tails.Add(1)
	r.wg.Add(1)
	go fl.tail()
	return f
}

// forget removes f from the local registry, unless a newer flight of the
// scope replaced it.
func (r *Store) forget(k rkeys, f *cache.Flight) {
	r.mu.Lock()
	if r.flights[k.h] == f {
		delete(r.flights, k.h)
	}
	r.mu.Unlock()
}

func (r *Store) reserve(f *cache.Flight, n int) error { return r.journals.Reserve(f, n) }

func (r *Store) release(f *cache.Flight, n int) { r.journals.Release(f, n) }

// Info returns what Redis knows of a key. It reports false when the key
// is unknown and also when Redis cannot be asked.
func (r *Store) Info(sc cache.Scope) (cache.KeyInfo, bool) {
	k := r.keys(sc)
	ctx, cancel := r.opCtx()
	defer cancel()
	rs := r.c.DoMulti(ctx,
		r.c.B().Hgetall().Key(k.st).Build(),
		r.c.B().Pttl().Key(k.st).Build(),
		r.c.B().Exists().Key(k.res).Build())
	m, err := rs[0].AsStrMap()
	if err != nil || m["phase"] == "" {
		// No record; or only the fence of an abandoned claim (abandonScript).
		return cache.KeyInfo{}, false
	}
	ttl, _ := rs[1].AsInt64()
	hasRes, _ := rs[2].AsInt64()
	num := func(f string) int { n, _ := strconv.Atoi(m[f]); return n }
	at := func(f string) time.Time {
		n, err := strconv.ParseInt(m[f], 10, 64)
		if err != nil {
			return time.Time{}
		}
		return time.UnixMilli(n)
	}
	gen, _ := strconv.ParseUint(m["gen"], 10, 64)
	ki := cache.KeyInfo{
		State: cache.State(m["state"]), Generation: gen, Attempts: num("attempts"),
		LastStatus: num("status"), Events: num("events"), Bytes: num("bytes"),
		Reason: m["reason"], Model: m["model"], Tool: m["tool"], Created: at("created"), Updated: at("updated"),
		BodyStored: m["phase"] == "done" && hasRes == 1,
	}
	if fb := m["fallbacks"]; fb != "" {
		json.Unmarshal([]byte(fb), &ki.Fallbacks) //nolint:errcheck // written by this package; unreadable means none
	}
	if m["phase"] != "live" && ttl > 0 {
		ki.Expires = r.cfg.Now().Add(time.Duration(ttl) * time.Millisecond)
	}
	r.mu.Lock()
	f := r.flights[k.h]
	r.mu.Unlock()
	if f != nil && f.Gen == gen {
		ki.Events = max(ki.Events, f.Events())
	}
	return ki, true
}

// Forget deletes a key that is not running, and its stored answer:
// ErrLive while its generation runs, ErrNotFound when Redis holds
// nothing for it.
func (r *Store) Forget(sc cache.Scope) error {
	k := r.keys(sc)
	ctx, cancel := r.opCtx()
	defer cancel()
	out, err := run(ctx, r.c, forgetScript, forgetArgs{keys: k.all, fenceTTL: max(r.cfg.Lease, r.cfg.FailedTTL)}).ToString()
	if err != nil {
		return r.unavailableErr("forget", err)
	}
	switch out {
	case "live":
		return cache.ErrLive
	case "none":
		return cache.ErrNotFound
	}
	r.keyEnded(sc, k, "", 0)
	r.mu.Lock()
	delete(r.unknowns, k.h)
	r.mu.Unlock()
	return nil
}

// ToolUnknowns returns how many tool calls this replica saw end
// commit_unknown whose hold has not expired: Redis keeps no count of its
// own, so replicas each report those they know.
func (r *Store) ToolUnknowns() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropUnknownsLocked()
	return int64(len(r.unknowns))
}

// dropUnknownsLocked forgets the held tool calls whose hold expired.
func (r *Store) dropUnknownsLocked() {
	now := r.cfg.Now()
	for h, t := range r.unknowns {
		if now.After(t) {
			delete(r.unknowns, h)
		}
	}
}

// noteUnknown notes a tool call of this replica that ended commit_unknown,
// for ToolUnknowns.
func (r *Store) noteUnknown(k rkeys, until time.Time) {
	r.mu.Lock()
	if r.unknowns == nil {
		r.unknowns = map[string]time.Time{}
	}
	r.unknowns[k.h] = until
	if len(r.unknowns) >= r.unknownsSweep {
		// The expired go once the map doubled since the last sweep, so
		// that it is bounded by the calls held now, scraped or not.
		r.dropUnknownsLocked()
		r.unknownsSweep = max(1024, 2*len(r.unknowns))
	}
	r.mu.Unlock()
}
