package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/redis"
)

// Scenario shard: how many concurrent streams one Redis shard holds. It
// drives the Redis store itself (redis.New), not ssegate over HTTP: the
// claim, the live flight with its events appended at an LLM's pace, the
// lease renewals, the commit, and for a share of the streams a follower
// on a second store instance (another replica) that asks the owner for
// the mirror and reads it to the end. Each step keeps N streams live at
// once against a fresh private redis-server (or valkey-server): every
// stream slot starts its first stream at its own offset within one
// stream's length (the ramp), and a new one with a new key as each ends.
// After the ramp, a steady window is measured: redis-server's CPU from
// /proc (the process, and its main thread), INFO commandstats, and, from
// the drivers, the claims and commits begun in the window with their
// latency, the followers' join waits, the stores' counters and the
// drivers' own CPU. The streams are driven by child processes of the
// bench binary (shardCommand), several when one cannot keep the pace.

// shardCommand is the hidden subcommand of a driver process of scenario
// shard; its one argument is a shardDriverConfig in JSON.
const shardCommand = "shard-driver"

// shardOptions are scenario shard's flags.
type shardOptions struct {
	steps      []int
	events     int
	streamDur  time.Duration
	window     time.Duration
	follow     float64
	eventBytes int
	server     string // redis or valkey
	ioThreads  int
	procs      int // driver processes; 0: one per perProc streams
	perProc    int
	kneeCPU    float64
	kneeP99    time.Duration
	tenants    int
	tailBatch  time.Duration
	waitN      int
	replica    bool
	profile    string // a directory for the drivers' CPU profiles; "" for none
	chunk      time.Duration
	failover   bool
}

// register declares scenario shard's flags on fs and returns the
// -shard-steps value, for parse.
func (o *shardOptions) register(fs *flag.FlagSet) *string {
	steps := fs.String("shard-steps", "10000,25000,50000,100000", "scenario shard: the steps, comma-separated concurrent streams; the steps stop at the knee (-shard-knee-cpu, -shard-knee-p99) or at a step with errors")
	fs.IntVar(&o.events, "shard-events", 200, "scenario shard: events per stream")
	fs.DurationVar(&o.streamDur, "shard-stream", 10*time.Second, "scenario shard: length of one stream, its events evenly paced over it; also the ramp before the steady window")
	fs.DurationVar(&o.window, "shard-window", 10*time.Second, "scenario shard: the steady window measured at each step, after the ramp")
	fs.Float64Var(&o.follow, "shard-follow", 0.05, "scenario shard: share of the streams followed from a second store instance (another replica), in 0..1")
	fs.IntVar(&o.eventBytes, "shard-event-bytes", 32, "scenario shard: data bytes of each event")
	fs.StringVar(&o.server, "shard-server", "redis", "scenario shard: the server measured, redis (redis-server) or valkey (valkey-server)")
	fs.IntVar(&o.ioThreads, "shard-io-threads", 1, "scenario shard: the server's io-threads (1: none beside the main thread)")
	fs.IntVar(&o.procs, "shard-procs", 0, "scenario shard: driver processes of a step (0: one per -shard-per-proc streams)")
	fs.IntVar(&o.perProc, "shard-per-proc", 25000, "scenario shard: streams one driver process drives, when -shard-procs is 0")
	fs.Float64Var(&o.kneeCPU, "shard-knee-cpu", 0.90, "scenario shard: the knee: redis-server CPU, as a share of one core, past which no larger step runs")
	fs.DurationVar(&o.kneeP99, "shard-knee-p99", 50*time.Millisecond, "scenario shard: the knee: claim or commit p99 past which no larger step runs")
	fs.IntVar(&o.waitN, "shard-wait-replicas", 0, "scenario shard: the stores' -redis-wait-replicas; the step's server then has a replica")
	fs.BoolVar(&o.replica, "shard-replica", false, "scenario shard: the step's server has a replica (as with -shard-failover, without the kill): the cost of replication, beside -shard-wait-replicas")
	fs.DurationVar(&o.tailBatch, "shard-tail-batch", 0, "scenario shard: the followers' store's -redis-tail-batch (0: its default; negative: a blocking XREAD per followed stream)")
	fs.DurationVar(&o.chunk, "shard-local-chunk", time.Second, "scenario shard: an unfollowed stream's events, which Redis never sees one by one (only their count, in the renewals, and the result, in the commit), are appended in chunks of those due every this long, to spare the drivers' CPU; a followed stream's go at the pace (0: every stream at the pace)")
	fs.BoolVar(&o.failover, "shard-failover", false, "scenario shard: each step's server gets a replica, and in the middle of the window the primary is SIGKILLed and the replica promoted (the drivers reach the server through a forwarder that then points at it); the drivers count what their streams got and claim every key again after the run (a committed key that does not replay would be paid for twice)")
	fs.StringVar(&o.profile, "shard-profile", "", "scenario shard: a directory for each driver process's CPU profile of a step (shard-STREAMS-PROC.cpu.pprof)")
	fs.IntVar(&o.tenants, "shard-tenants", 64, "scenario shard: tenants the streams are spread over")
	return steps
}

// parse sets the steps and checks the flags.
func (o *shardOptions) parse(steps string) error {
	var err error
	if o.steps, err = intList(steps); err != nil {
		return fmt.Errorf("-shard-steps: %w", err)
	}
	for _, n := range o.steps {
		if n < 1 || n > 1_000_000 {
			return errors.New("-shard-steps: each step must be in 1..1000000")
		}
	}
	switch {
	case o.events < 2 || o.events > 100_000:
		return errors.New("-shard-events must be in 2..100000")
	case o.streamDur <= 0 || o.streamDur > 10*time.Minute:
		return errors.New("-shard-stream must be in (0, 10m]")
	case o.window <= 0 || o.window > time.Hour:
		return errors.New("-shard-window must be in (0, 1h]")
	case o.follow < 0 || o.follow > 1:
		return errors.New("-shard-follow must be in 0..1")
	case o.eventBytes < 1 || o.eventBytes > 1<<20:
		return errors.New("-shard-event-bytes must be in 1..1048576")
	case o.server != "redis" && o.server != "valkey":
		return errors.New("-shard-server must be redis or valkey")
	case o.ioThreads < 1 || o.ioThreads > 64:
		return errors.New("-shard-io-threads must be in 1..64")
	case o.procs < 0 || o.procs > 64:
		return errors.New("-shard-procs must be in 0..64")
	case o.perProc < 1:
		return errors.New("-shard-per-proc must be at least 1")
	case o.kneeCPU <= 0 || o.kneeP99 <= 0:
		return errors.New("-shard-knee-cpu and -shard-knee-p99 must be positive")
	case o.tenants < 1:
		return errors.New("-shard-tenants must be at least 1")
	case o.chunk < 0:
		return errors.New("-shard-local-chunk must not be negative")
	}
	return nil
}

// procsFor returns the driver processes of a step of n streams.
func (o *shardOptions) procsFor(n int) int {
	if o.procs > 0 {
		return min(o.procs, n)
	}
	return max(1, (n+o.perProc-1)/o.perProc)
}

// shardDriverConfig is what one driver process drives: its share of a
// step's stream slots (slots Proc, Proc+Procs, …, below Streams).
type shardDriverConfig struct {
	URL        string        `json:"url"`
	Prefix     string        `json:"prefix"`
	Proc       int           `json:"proc"`
	Procs      int           `json:"procs"`
	Streams    int           `json:"streams"`
	Events     int           `json:"events"`
	StreamDur  time.Duration `json:"stream_ns"`
	Follow     float64       `json:"follow"`
	EventBytes int           `json:"event_bytes"`
	Tenants    int           `json:"tenants"`
	TailBatch  time.Duration `json:"tail_batch_ns"`
	// WaitReplicas is the stores' redis.Config.WaitReplicas.
	WaitReplicas int `json:"wait_replicas,omitempty"`
	// Chunk: an unfollowed stream appends the events due every Chunk
	// at once (0: at the pace).
	Chunk time.Duration `json:"chunk_ns"`
	// Profile is a file for the process's CPU profile; "" for none.
	Profile string `json:"profile,omitempty"`
	// Recheck: after the run, claim every key again (-shard-failover).
	Recheck bool `json:"recheck,omitempty"`
	// Start is when the slots' offsets count from; the steady window is
	// [WindowStart, WindowEnd); no stream starts at or after WindowEnd.
	Start       time.Time `json:"start"`
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
}

// slotStart returns when slot i of n first starts: the slots are spread
// evenly over one stream's length.
func slotStart(start time.Time, i, n int, stream time.Duration) time.Time {
	return start.Add(time.Duration(int64(stream) * int64(i) / int64(n)))
}

// followed reports whether slot i's streams are followed at share follow:
// spread evenly, round(n×follow) of every n slots.
func followed(i int, follow float64) bool {
	return math.Floor(float64(i+1)*follow) > math.Floor(float64(i)*follow)
}

// shardDriverResult is what a driver process measured. Samples are in
// microseconds, of the operations begun in the steady window; the counts
// of errors cover the whole run.
type shardDriverResult struct {
	Claims    int64   `json:"claims"`
	Commits   int64   `json:"commits"`
	ClaimUS   []int64 `json:"claim_us"`
	CommitUS  []int64 `json:"commit_us"`
	JoinUS    []int64 `json:"join_us"`
	Followers int64   `json:"followers"` // followers that read their stream to its committed end (whole run)
	// Begun and Kept are the streams claimed and those committed, over
	// the whole run.
	Begun int64 `json:"begun"`
	Kept  int64 `json:"kept"`
	// LagUS: per stream begun in the window, how late its most belated
	// event was appended: the driver's own lag behind the pace.
	LagUS        []int64          `json:"lag_us"`
	Errors       int64            `json:"errors"`
	ErrorKinds   map[string]int64 `json:"error_kinds,omitempty"`
	ErrorSamples []string         `json:"error_samples,omitempty"`
	CPUns        int64            `json:"cpu_ns"` // the driver process's CPU over the window
	// Recheck (-shard-failover): every key claimed again after the run,
	// by what its stream got: committed keys answered by a replay, or
	// not (Lost: a retry would pay for it twice); keys that did not
	// commit, answered by a new generation (Retried) or otherwise.
	Recheck shardRecheck `json:"recheck"`
	// Store counters over the window, both instances summed.
	Store redis.Stats `json:"store"`
}

// shardRecheck counts the keys claimed again after a failover run.
type shardRecheck struct {
	Committed int64 `json:"committed"` // keys whose commit was taken
	Replayed  int64 `json:"replayed"`  // of them, answered by the replay
	Lost      int64 `json:"lost"`      // of them, a new generation: a retry pays twice
	Aborted   int64 `json:"aborted"`   // keys whose stream did not commit
	Retried   int64 `json:"retried"`   // of them, a new generation (the retry runs once)
	Other     int64 `json:"other"`     // any other answer, or an error
}

// shardDriver runs one driver process's slots.
type shardDriver struct {
	cfg    shardDriverConfig
	owner  *redis.Store
	follow *redis.Store
	data   string

	mu  sync.Mutex // guards res's samples and error samples
	res shardDriverResult

	claims, commits, followers, errs, begun, kept atomic.Int64
	// live counts the streams begun (claim sent) and not yet ended; the
	// wheel's loop stops once it is 0 after the window.
	live  atomic.Int64
	wheel *shardWheel

	// With Recheck, the keys of the streams that ended, committed or not.
	keysMu            sync.Mutex
	committed, failed []cache.Scope
}

// ended notes the key of a stream that ended, for the recheck.
func (d *shardDriver) ended(sc cache.Scope, kept bool) {
	if !d.cfg.Recheck {
		return
	}
	d.keysMu.Lock()
	if kept {
		d.committed = append(d.committed, sc)
	} else {
		d.failed = append(d.failed, sc)
	}
	d.keysMu.Unlock()
}

// recheck claims every key again: a committed one must replay, one that
// did not commit gets a new generation, which it fails at once.
func (d *shardDriver) recheck() {
	rc := &d.res.Recheck
	var mu sync.Mutex
	check := func(sc cache.Scope, kept bool) {
		b, err := d.owner.Begin(sc, "fp")
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			rc.Other++
		case kept && b.Decision == cache.Hit:
			rc.Replayed++
		case b.Decision == cache.Miss:
			if kept {
				rc.Lost++
			} else {
				rc.Retried++
			}
			b.Flight.Fail(cache.StateFailedRetryable, "bench", nil)
		default:
			rc.Other++
		}
	}
	rc.Committed, rc.Aborted = int64(len(d.committed)), int64(len(d.failed))
	work := make(chan func())
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for f := range work {
				f()
			}
		})
	}
	for _, sc := range d.committed {
		work <- func() { check(sc, true) }
	}
	for _, sc := range d.failed {
		work <- func() { check(sc, false) }
	}
	close(work)
	wg.Wait()
}

// fail counts an error, by its kind (the format's first word: claim,
// append, commit, join), keeping a few samples.
func (d *shardDriver) fail(format string, args ...any) {
	d.errs.Add(1)
	kind, _, _ := strings.Cut(format, " ")
	d.mu.Lock()
	if d.res.ErrorKinds == nil {
		d.res.ErrorKinds = map[string]int64{}
	}
	d.res.ErrorKinds[kind]++
	if len(d.res.ErrorSamples) < 5 {
		d.res.ErrorSamples = append(d.res.ErrorSamples, fmt.Sprintf(format, args...))
	}
	d.mu.Unlock()
}

// inWindow reports whether t is in the steady window.
func (d *shardDriver) inWindow(t time.Time) bool {
	return !t.Before(d.cfg.WindowStart) && t.Before(d.cfg.WindowEnd)
}

// sample adds v, in µs, to the samples dst.
func (d *shardDriver) sample(dst *[]int64, v time.Duration) {
	d.mu.Lock()
	*dst = append(*dst, v.Microseconds())
	d.mu.Unlock()
}

// driveShard runs cfg's slots to the end of the window and returns what
// they measured.
func driveShard(cfg shardDriverConfig) (*shardDriverResult, error) {
	// Committed results need not outlive the run, and its recheck, which
	// must find every one still there (with -shard-wait-replicas after a
	// failover each of its claims waits the wait's timeout, for a replica
	// the new primary lacks: the recheck of 20,000 keys takes 15 s).
	ttl := time.Minute
	if cfg.Recheck {
		ttl = 10 * time.Minute
	}
	store := func() (*redis.Store, error) {
		return redis.New(redis.Config{URL: cfg.URL, Prefix: cfg.Prefix,
			TTL: ttl, FailedTTL: ttl,
			MaxKeys: 100_000_000, TailBatch: cfg.TailBatch, WaitReplicas: cfg.WaitReplicas,
			Limits: cache.Limits{MaxLiveBytes: 1 << 40, MaxLiveBytesPerTenant: 1 << 40,
				MaxKeysPerTenant: 100_000_000, MaxStrangerKeys: 100_000_000},
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	}
	owner, err := store()
	if err != nil {
		return nil, err
	}
	defer owner.Close()
	follow, err := store()
	if err != nil {
		return nil, err
	}
	defer follow.Close()
	d := &shardDriver{cfg: cfg, owner: owner, follow: follow, data: strings.Repeat("x", cfg.EventBytes)}

	var before, after redis.Stats
	var cpuBefore, cpuAfter time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		time.Sleep(time.Until(cfg.WindowStart))
		before, cpuBefore = sumStats(owner.Stats(), follow.Stats()), selfCPU()
		time.Sleep(time.Until(cfg.WindowEnd))
		after, cpuAfter = sumStats(owner.Stats(), follow.Stats()), selfCPU()
	})
	pace := cfg.StreamDur / time.Duration(cfg.Events)
	w := &shardWheel{tick: min(shardTick, max(pace/2, time.Millisecond)), base: cfg.Start, chunk: min(cfg.Chunk, cfg.StreamDur), streamDur: cfg.StreamDur}
	w.slots = make([][]*liveStream, int(max(pace, w.chunk)/w.tick)+2)
	d.wheel = w
	for i := cfg.Proc; i < cfg.Streams; i += cfg.Procs {
		d.start(w, i, 0, slotStart(cfg.Start, i, cfg.Streams, cfg.StreamDur))
	}
	wg.Go(func() { d.run(w) })
	wg.Wait()
	if cfg.Recheck {
		d.recheck()
	}
	d.res.Claims, d.res.Commits, d.res.Followers, d.res.Errors = d.claims.Load(), d.commits.Load(), d.followers.Load(), d.errs.Load()
	d.res.Begun, d.res.Kept = d.begun.Load(), d.kept.Load()
	d.res.CPUns = int64(cpuAfter - cpuBefore)
	d.res.Store = diffStats(after, before)
	return &d.res, nil
}

// selfCPU returns this process's CPU time so far (0 where /proc has none).
func selfCPU() time.Duration {
	t, _ := cpuTime([]int{os.Getpid()})
	return t
}

// shardTick is the driver's clock: every tick, one loop appends the
// events that fell due, for all the streams of the process (shardWheel),
// rather than a timer and a wake-up per event.
const shardTick = 2 * time.Millisecond

// liveStream is one stream of a slot from its claim to its last event.
type liveStream struct {
	slot, n int
	sc      cache.Scope
	t0      time.Time // its events are due at t0 + k × pace, k = 1..Events
	f       *cache.Flight
	follow  bool
	next    int           // events appended
	due     time.Time     // when the wheel is to take it next
	lag     time.Duration // how late the wheel took it at its most belated
	fw      sync.WaitGroup
}

// shardWheel is a timing wheel of the live streams by their next event's
// tick; its loop (run) owns it, and takes new streams from incoming.
type shardWheel struct {
	tick time.Duration
	// chunk and streamDur: unfollowed streams are taken at the end of
	// each chunk of their events (shardDriverConfig.Chunk).
	chunk, streamDur time.Duration
	base             time.Time
	slots            [][]*liveStream
	done             int64 // the last tick run

	mu       sync.Mutex // guards incoming
	incoming []*liveStream
}

// at returns the tick at which t falls due: the first at or after it.
func (w *shardWheel) at(t time.Time) int64 {
	return int64((t.Sub(w.base) + w.tick - 1) / w.tick)
}

// place puts s on the wheel for the tick of its next event, due at t
// (for an unfollowed stream appended in chunks, the end of t's chunk):
// the next tick to run at the earliest.
func (w *shardWheel) place(s *liveStream, t time.Time) {
	if !s.follow && w.chunk > 0 {
		c := (t.Sub(s.t0) + w.chunk - 1) / w.chunk * w.chunk
		t = s.t0.Add(min(c, w.streamDur))
	}
	s.due = t
	k := max(w.at(t), w.done+1)
	i := k % int64(len(w.slots))
	w.slots[i] = append(w.slots[i], s)
}

// add hands a claimed stream to the wheel's loop.
func (w *shardWheel) add(s *liveStream) {
	w.mu.Lock()
	w.incoming = append(w.incoming, s)
	w.mu.Unlock()
}

// run ticks the wheel until the window ended and no stream is left live.
func (d *shardDriver) run(w *shardWheel) {
	pace := d.cfg.StreamDur / time.Duration(d.cfg.Events)
	t := time.NewTicker(w.tick)
	defer t.Stop()
	for now := range t.C {
		w.mu.Lock()
		in := w.incoming
		w.incoming = nil
		w.mu.Unlock()
		for _, s := range in {
			w.place(s, s.t0.Add(time.Duration(s.next+1)*pace))
		}
		for k := w.done + 1; k <= w.at(now); k++ {
			i := k % int64(len(w.slots))
			due := w.slots[i]
			w.slots[i] = nil
			w.done = k
			for _, s := range due {
				d.step(w, s, now, pace)
			}
		}
		if now.After(d.cfg.WindowEnd) && d.live.Load() == 0 {
			return
		}
	}
}

// step appends s's events due by now and puts it back on the wheel for
// its next; after its last, it commits it on a goroutine of its own.
func (d *shardDriver) step(w *shardWheel, s *liveStream, now time.Time, pace time.Duration) {
	s.lag = max(s.lag, time.Since(s.due))
	for s.next < d.cfg.Events {
		at := s.t0.Add(time.Duration(s.next+1) * pace)
		if at.After(now) {
			w.place(s, at)
			return
		}
		if _, err := s.f.Append("", d.data); err != nil {
			d.fail("append %s #%d: %v", s.sc.Key, s.next+1, err)
			s.f.Fail(cache.StateFailedRetryable, "bench", nil)
			d.ended(s.sc, false)
			go d.end(s)
			return
		}
		s.next++
		if s.next == 1 && s.follow {
			s.fw.Go(func() { d.follower(s.sc) })
		}
	}
	go d.commit(s)
}

// start claims slot i's stream n at t0 on a goroutine of its own, then
// hands it to the wheel; no stream starts at or after the window's end.
func (d *shardDriver) start(w *shardWheel, i, n int, t0 time.Time) {
	cfg := d.cfg
	if !t0.Before(cfg.WindowEnd) {
		return
	}
	d.live.Add(1)
	go func() {
		time.Sleep(time.Until(t0))
		s := &liveStream{slot: i, n: n, t0: t0, follow: followed(i, cfg.Follow),
			sc: cache.Scope{Tenant: "t" + strconv.Itoa(i%cfg.Tenants), Key: "p" + strconv.Itoa(cfg.Proc) + "-s" + strconv.Itoa(i) + "-n" + strconv.Itoa(n)}}
		begun := time.Now()
		b, err := d.owner.Begin(s.sc, "fp")
		switch {
		case err != nil:
			d.fail("claim %s: %v", s.sc.Key, err)
		case b.Decision != cache.Miss:
			d.fail("claim %s: decision %d; want a miss", s.sc.Key, b.Decision)
		default:
			d.begun.Add(1)
			if d.inWindow(begun) {
				d.claims.Add(1)
				d.sample(&d.res.ClaimUS, time.Since(begun))
			}
			s.f = b.Flight
			s.f.Mark(cache.StateExecutionStarted, 1, 200)
			s.f.SetHead(cache.Head{Status: 200, ContentType: "text/event-stream", Stream: true})
			w.add(s)
			return
		}
		// The slot goes on with its next stream, as it would have after
		// this one.
		d.start(w, i, n+1, d.nextStart(t0))
		d.live.Add(-1)
	}()
}

// nextStart returns when the stream after one begun at t0 starts: a
// stream's length later, or now if that has passed.
func (d *shardDriver) nextStart(t0 time.Time) time.Time {
	t := t0.Add(d.cfg.StreamDur)
	if now := time.Now(); t.Before(now) {
		t = now
	}
	return t
}

// commit commits s, waits for its follower, and starts the slot's next
// stream. A commit counts in the window when it began in it.
func (d *shardDriver) commit(s *liveStream) {
	if d.inWindow(s.t0) {
		d.sample(&d.res.LagUS, s.lag)
	}
	start := time.Now()
	if !s.f.Commit(nil) {
		state, reason, _ := s.f.Outcome()
		d.fail("commit %s: not kept (%s, %s)", s.sc.Key, state, reason)
		d.ended(s.sc, false)
	} else {
		d.ended(s.sc, true)
		d.kept.Add(1)
		if d.inWindow(start) {
			d.commits.Add(1)
			d.sample(&d.res.CommitUS, time.Since(start))
		}
	}
	d.end(s)
}

// end waits for s's follower and starts the slot's next stream.
func (d *shardDriver) end(s *liveStream) {
	s.fw.Wait()
	d.start(d.wheel, s.slot, s.n+1, d.nextStart(s.t0))
	d.live.Add(-1)
}

// follower joins sc's live generation on the other instance, waits for
// its first event (the join wait) and reads it to its committed end.
func (d *shardDriver) follower(sc cache.Scope) {
	start := time.Now()
	counted := d.inWindow(start)
	b, err := d.follow.Begin(sc, "fp")
	if err != nil {
		d.fail("join %s: %v", sc.Key, err)
		return
	}
	if b.Decision != cache.Join || b.Flight == nil {
		d.fail("join %s: decision %d; want a join", sc.Key, b.Decision)
		return
	}
	f := b.Flight
	sub, err := f.Subscribe(0)
	if err != nil {
		d.fail("join %s: subscribe: %v", sc.Key, err)
		return
	}
	defer sub.Close()
	first := true
	limit := time.NewTimer(2*d.cfg.StreamDur + 30*time.Second)
	defer limit.Stop()
	for {
		p, ended := sub.Read()
		if len(p) > 0 && first {
			first = false
			if counted {
				d.sample(&d.res.JoinUS, time.Since(start))
			}
		}
		if ended {
			break
		}
		select {
		case <-sub.C():
		case <-limit.C:
			d.fail("join %s: no end after %v", sc.Key, 2*d.cfg.StreamDur+30*time.Second)
			return
		}
	}
	if state, reason, _ := f.Outcome(); state != cache.StateCommitted {
		d.fail("join %s: ended %s (%s); want committed", sc.Key, state, reason)
		return
	}
	d.followers.Add(1)
}

// sumStats adds the counters of two stores.
func sumStats(a, b redis.Stats) redis.Stats {
	return redis.Stats{Claims: a.Claims + b.Claims, Batches: a.Batches + b.Batches, Events: a.Events + b.Events,
		Commits: a.Commits + b.Commits, Fenced: a.Fenced + b.Fenced, Reaped: a.Reaped + b.Reaped, Tails: a.Tails + b.Tails,
		Reads: a.Reads + b.Reads, Renewals: a.Renewals + b.Renewals, Asks: a.Asks + b.Asks, Mirrors: a.Mirrors + b.Mirrors,
		Unavailable: a.Unavailable + b.Unavailable, Abandoned: a.Abandoned + b.Abandoned,
		Waits: a.Waits + b.Waits, WaitsShort: a.WaitsShort + b.WaitsShort}
}

// diffStats returns the cumulative counters of a minus those of b.
func diffStats(a, b redis.Stats) redis.Stats {
	neg := func(s redis.Stats) redis.Stats {
		return redis.Stats{Claims: -s.Claims, Batches: -s.Batches, Events: -s.Events, Commits: -s.Commits, Fenced: -s.Fenced,
			Reaped: -s.Reaped, Tails: -s.Tails, Reads: -s.Reads, Renewals: -s.Renewals, Asks: -s.Asks, Mirrors: -s.Mirrors,
			Unavailable: -s.Unavailable, Abandoned: -s.Abandoned, Waits: -s.Waits, WaitsShort: -s.WaitsShort}
	}
	return sumStats(a, neg(b))
}

// serveShardDriver is the driver process: it drives the config in arg and
// writes its result as JSON to stdout.
func serveShardDriver(arg string) error {
	var cfg shardDriverConfig
	if err := json.Unmarshal([]byte(arg), &cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if cfg.Profile != "" {
		f, err := os.Create(cfg.Profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res, err := driveShard(cfg)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// shardRow is one step of scenario shard.
type shardRow struct {
	Server    string `json:"server"` // redis-server or valkey-server, with version
	IOThreads int    `json:"io_threads"`
	Streams   int    `json:"streams"`
	Follow    num    `json:"follow"` // the share followed
	// Failover: the primary was killed mid-window and its replica
	// promoted (-shard-failover); ErrorKinds and Recheck say what the
	// streams got.
	Failover   bool             `json:"failover,omitempty"`
	ErrorKinds map[string]int64 `json:"error_kinds,omitempty"`
	Recheck    shardRecheck     `json:"recheck"`
	Procs      int              `json:"driver_processes"`
	WindowSec  num              `json:"window_s"`
	Claims     int64            `json:"claims"`
	Commits    int64            `json:"commits"`
	Followers  int64            `json:"followers_whole"`
	Begun      int64            `json:"streams_begun"` // over the whole step, as Kept
	Kept       int64            `json:"streams_committed"`
	Errors     int64            `json:"errors"`
	// CPU as a share of one core over the window: redis-server's process
	// (every thread) and its main thread; the drivers' together, and the
	// busiest driver's.
	ServerCPU     num `json:"server_cpu_core_share"`
	ServerMainCPU num `json:"server_main_thread_core_share"`
	DriverCPU     num `json:"driver_cpu_core_share"`
	DriverMaxCPU  num `json:"driver_max_process_core_share"`
	// Per stream (per commit in the window): every command the server
	// counted (INFO commandstats, all clients, the commands scripts call
	// included), script calls among them, the server's reads of client
	// sockets (round trips; INFO stats total_reads_processed) and bytes
	// read; the store's own calls by kind are in Store (its counters).
	CommandsPerStream num `json:"commands_per_stream"`
	ReadsPerStream    num `json:"round_trips_per_stream"`
	InBytesPerStream  num `json:"net_input_bytes_per_stream"`
	ScriptsPerStream  num `json:"script_calls_per_stream"`
	ScriptUSPerCall   num `json:"script_usec_per_call"`
	// ServerUSPerStream is redis-server's CPU per stream. IdleCPU is an
	// idle server's CPU (a second one started beside it, measured over
	// the same window: its cron) as a share of one core, and
	// NetUSPerStream the CPU per stream net of it.
	ServerUSPerStream num            `json:"server_cpu_us_per_stream"`
	IdleCPU           num            `json:"idle_server_cpu_core_share"`
	NetUSPerStream    num            `json:"server_cpu_us_per_stream_net_of_idle"`
	Calls             map[string]cmd `json:"commandstats"`
	Store             redis.Stats    `json:"store"`
	ClaimP50us        num            `json:"claim_p50_us"`
	ClaimP99us        num            `json:"claim_p99_us"`
	CommitP50us       num            `json:"commit_p50_us"`
	CommitP99us       num            `json:"commit_p99_us"`
	JoinP50us         num            `json:"join_wait_p50_us"`
	JoinP99us         num            `json:"join_wait_p99_us"`
	JoinSamples       int            `json:"join_samples"`
	LagP99us          num            `json:"driver_lag_p99_us"`
	// PaceUS is the time between a stream's events; DriverBound says
	// why the drivers may not have kept the pace (a driver near a core,
	// or a lag p99 past the pace): the step wants more -shard-procs.
	PaceUS      num    `json:"pace_us"`
	DriverBound string `json:"driver_bound,omitempty"`
	// Knee says why no larger step ran after this one; "" when it held.
	Knee         string   `json:"knee,omitempty"`
	ErrorSamples []string `json:"error_samples,omitempty"`
}

// serverReading is what is read of the server at either end of the
// window; serverReading.sub makes the window's figures of two.
type serverReading struct {
	at        time.Time
	cpu, main time.Duration // the process's CPU, and its main thread's
	calls     map[string]cmd
	reads     int64 // INFO stats total_reads_processed: reads of client sockets, each a round trip's request (or several pipelined)
	inBytes   int64 // INFO stats total_net_input_bytes
}

// readServer reads the server at addr, whose process is pid.
func readServer(addr string, pid int) (serverReading, error) {
	x := serverReading{at: time.Now()}
	var err [4]error
	x.cpu, err[0] = cpuTime([]int{pid})
	x.main, err[1] = threadCPU(pid)
	x.calls, err[2] = commandStats(addr)
	var lines []string
	lines, err[3] = redisInfo(addr, "stats")
	for _, l := range lines {
		k, v, _ := strings.Cut(strings.TrimSpace(l), ":")
		switch k {
		case "total_reads_processed":
			x.reads, _ = strconv.ParseInt(v, 10, 64)
		case "total_net_input_bytes":
			x.inBytes, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return x, errors.Join(err[:]...)
}

// sub returns the figures of the window from b to x.
func (x serverReading) sub(b serverReading) serverWindow {
	return serverWindow{wall: x.at.Sub(b.at), cpu: x.cpu - b.cpu, main: x.main - b.main,
		calls: diffCommands(x.calls, b.calls), reads: x.reads - b.reads, inBytes: x.inBytes - b.inBytes}
}

// serverWindow is what the server did over the steady window; idle is
// what an idle server's process spent over the same window.
type serverWindow struct {
	wall, cpu, main time.Duration
	idle            time.Duration
	calls           map[string]cmd
	reads, inBytes  int64
}

// cmd is one command's line of INFO commandstats.
type cmd struct {
	Calls int64   `json:"calls"`
	USec  float64 `json:"usec"`
}

// commandStats reads INFO commandstats of the server at addr.
func commandStats(addr string) (map[string]cmd, error) {
	lines, err := redisInfo(addr, "commandstats")
	if err != nil {
		return nil, err
	}
	out := map[string]cmd{}
	for _, l := range lines {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		c, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd || c == "info" {
			continue
		}
		var x cmd
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				x.Calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				x.USec, _ = strconv.ParseFloat(v, 64)
			}
		}
		out[c] = x
	}
	return out, nil
}

// diffCommands returns the calls and time of each command in after
// beyond before, leaving out those not called.
func diffCommands(after, before map[string]cmd) map[string]cmd {
	out := map[string]cmd{}
	for k, a := range after {
		b := before[k]
		if d := (cmd{Calls: a.Calls - b.Calls, USec: a.USec - b.USec}); d.Calls > 0 {
			out[k] = d
		}
	}
	return out
}

// threadCPU returns the CPU time of pid's main thread.
func threadCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/stat", pid, pid))
	if err != nil {
		return 0, err
	}
	f := statFields(b)
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/task/%d/stat", pid, pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("malformed /proc/%d/task/%d/stat", pid, pid)
	}
	return time.Duration(u+s) * clockTick, nil
}

// pctUS returns the q-th percentile of samples in µs (NaN for none).
func pctUS(samples []int64, q float64) num {
	if len(samples) == 0 {
		return nan
	}
	d := make([]time.Duration, len(samples))
	for i, s := range samples {
		d[i] = time.Duration(s)
	}
	slices.Sort(d)
	return num(percentile(d, q))
}

// fill computes the row's figures from the drivers' results and what the
// server did over the window.
func (row *shardRow) fill(res []*shardDriverResult, w serverWindow) {
	window, cpu, calls := w.wall, w.cpu, w.calls
	var claim, commit, join, lag []int64
	var driverCPU, driverMax time.Duration
	row.WindowSec = num(window.Seconds())
	for _, r := range res {
		row.Claims += r.Claims
		row.Commits += r.Commits
		row.Followers += r.Followers
		row.Begun += r.Begun
		row.Kept += r.Kept
		row.Errors += r.Errors
		for k, v := range r.ErrorKinds {
			if row.ErrorKinds == nil {
				row.ErrorKinds = map[string]int64{}
			}
			row.ErrorKinds[k] += v
		}
		rc := &row.Recheck
		rc.Committed, rc.Replayed, rc.Lost = rc.Committed+r.Recheck.Committed, rc.Replayed+r.Recheck.Replayed, rc.Lost+r.Recheck.Lost
		rc.Aborted, rc.Retried, rc.Other = rc.Aborted+r.Recheck.Aborted, rc.Retried+r.Recheck.Retried, rc.Other+r.Recheck.Other
		for _, e := range r.ErrorSamples {
			if len(row.ErrorSamples) < 5 {
				row.ErrorSamples = append(row.ErrorSamples, e)
			}
		}
		claim, commit = append(claim, r.ClaimUS...), append(commit, r.CommitUS...)
		join, lag = append(join, r.JoinUS...), append(lag, r.LagUS...)
		driverCPU += time.Duration(r.CPUns)
		driverMax = max(driverMax, time.Duration(r.CPUns))
		row.Store = sumStats(row.Store, r.Store)
	}
	share := func(d time.Duration) num { return num(ratio(float64(d), float64(window))) }
	row.ServerCPU, row.ServerMainCPU = share(cpu), share(w.main)
	row.DriverCPU, row.DriverMaxCPU = share(driverCPU), share(driverMax)
	row.Calls = calls
	var all, scripts int64
	var scriptUS float64
	for name, c := range calls {
		all += c.Calls
		if name == "evalsha" || name == "eval" || name == "fcall" {
			scripts += c.Calls
			scriptUS += c.USec
		}
	}
	streams := float64(row.Commits)
	row.CommandsPerStream = num(ratio(float64(all), streams))
	row.ScriptsPerStream = num(ratio(float64(scripts), streams))
	row.ScriptUSPerCall = num(ratio(scriptUS, float64(scripts)))
	row.ServerUSPerStream = num(ratio(us(cpu), streams))
	row.IdleCPU = share(w.idle)
	row.NetUSPerStream = num(ratio(us(cpu)-us(w.idle), streams))
	row.ReadsPerStream = num(ratio(float64(w.reads), streams))
	row.InBytesPerStream = num(ratio(float64(w.inBytes), streams))
	row.ClaimP50us, row.ClaimP99us = pctUS(claim, 50), pctUS(claim, 99)
	row.CommitP50us, row.CommitP99us = pctUS(commit, 50), pctUS(commit, 99)
	row.JoinP50us, row.JoinP99us, row.JoinSamples = pctUS(join, 50), pctUS(join, 99), len(join)
	row.LagP99us = pctUS(lag, 99)
}

// driverBound says why row's drivers may not have kept the pace: ""
// when none was near a core and the lag p99 stayed within the pace.
func (row *shardRow) driverBound() string {
	var why []string
	if row.DriverMaxCPU > 0.9 {
		why = append(why, fmt.Sprintf("the busiest driver at %.0f %% of a core", 100*float64(row.DriverMaxCPU)))
	}
	if row.LagP99us > row.PaceUS {
		why = append(why, fmt.Sprintf("lag p99 %.1f ms past the pace of %.1f ms", float64(row.LagP99us)/1000, float64(row.PaceUS)/1000))
	}
	return strings.Join(why, "; ")
}

// knee says why a step past row's should not run: "" when row held.
func (row *shardRow) knee(o *shardOptions) string {
	var why []string
	if row.Errors > 0 {
		why = append(why, fmt.Sprintf("%d errors", row.Errors))
	}
	if float64(row.ServerMainCPU) > o.kneeCPU || float64(row.ServerCPU) > o.kneeCPU && row.IOThreads == 1 {
		why = append(why, fmt.Sprintf("server CPU %.0f %% of a core > %.0f %%", 100*float64(max(row.ServerMainCPU, row.ServerCPU)), 100*o.kneeCPU))
	}
	lim := float64(o.kneeP99.Microseconds())
	if float64(row.ClaimP99us) > lim || float64(row.CommitP99us) > lim {
		why = append(why, fmt.Sprintf("claim/commit p99 %.1f/%.1f ms > %v", float64(row.ClaimP99us)/1000, float64(row.CommitP99us)/1000, o.kneeP99))
	}
	if row.Claims == 0 || row.Commits == 0 {
		why = append(why, "no claim or commit in the window")
	}
	return strings.Join(why, "; ")
}

// shard runs scenario shard.
func (r *runner) shard() {
	o := &r.opt.shard
	name := o.server + "-server"
	bin, err := exec.LookPath(name)
	if err != nil {
		r.notes = append(r.notes, name+" is not on PATH: scenario shard was skipped")
		r.logf("  %s is not on PATH: skipped", name)
		return
	}
	label := name
	if v := redisVersion(bin); v != "" {
		label += " " + v
	}
	switch {
	case o.waitN > 0:
		label += fmt.Sprintf(", a replica, WAIT %d", o.waitN)
	case o.replica || o.failover:
		label += ", a replica"
	}
	for _, n := range o.steps {
		row, err := r.shardStep(bin, label, n)
		if err != nil {
			r.notes = append(r.notes, fmt.Sprintf("scenario shard, %d streams: %v", n, err))
			r.logf("  %d streams: %v", n, err)
			return
		}
		r.shardRows = append(r.shardRows, row)
		r.logf("  %d streams: server CPU %.0f %% of a core (main thread %.0f %%), claim p99 %.1f ms, commit p99 %.1f ms, %.2f round trips and %.2f commands/stream, %d errors; drivers %.0f %%",
			n, 100*float64(row.ServerCPU), 100*float64(row.ServerMainCPU), float64(row.ClaimP99us)/1000, float64(row.CommitP99us)/1000,
			float64(row.ReadsPerStream), float64(row.CommandsPerStream), row.Errors, 100*float64(row.DriverCPU))
		if row.Knee != "" {
			r.logf("  the knee: %s", row.Knee)
			return
		}
	}
}

// shardStep runs one step of n streams on a fresh server.
func (r *runner) shardStep(bin, label string, n int) (*shardRow, error) {
	o := &r.opt.shard
	var extra []string
	if o.ioThreads > 1 {
		extra = append(extra, "--io-threads", strconv.Itoa(o.ioThreads))
	}
	rs, err := r.env.startRedis(bin, extra...)
	if err != nil {
		return nil, err
	}
	defer rs.stop()
	pid, primary := rs.cmd.Process.Pid, rs
	// An idle server beside it, measured over the same window, says what
	// the server spends on its own (its cron) under the machine's load.
	idle, err := r.env.startRedis(bin, extra...)
	if err != nil {
		return nil, err
	}
	defer idle.stop()
	url := "redis://" + rs.addr + "/0"
	var replica *server
	var fw *forwarder
	if o.failover || o.replica || o.waitN > 0 {
		_, port, _ := net.SplitHostPort(rs.addr)
		if replica, err = r.env.startRedis(bin, append(extra, "--replicaof", "127.0.0.1", port)...); err != nil {
			return nil, err
		}
		defer replica.stop()
		if err := waitReplica(replica.addr, 10*time.Second); err != nil {
			return nil, err
		}
		if fw, err = newForwarder(rs.addr); err != nil {
			return nil, err
		}
		defer fw.close()
		url = "redis://" + fw.addr() + "/0"
	}
	procs := o.procsFor(n)
	row := &shardRow{Server: label, IOThreads: o.ioThreads, Streams: n, Follow: num(o.follow), Procs: procs, Failover: o.failover}
	start := time.Now().Add(time.Second) // the drivers' start-up
	ws := start.Add(o.streamDur + time.Second)
	we := ws.Add(o.window)
	cmds := make([]*exec.Cmd, procs)
	outs := make([]*bytes.Buffer, procs)
	for p := range procs {
		cfg := shardDriverConfig{URL: url, Recheck: o.failover, Prefix: "shard", Proc: p, Procs: procs, Streams: n,
			Events: o.events, StreamDur: o.streamDur, Follow: o.follow, EventBytes: o.eventBytes, Tenants: o.tenants, TailBatch: o.tailBatch, WaitReplicas: o.waitN, Chunk: o.chunk,
			Start: start, WindowStart: ws, WindowEnd: we}
		if o.profile != "" {
			cfg.Profile = filepath.Join(o.profile, fmt.Sprintf("shard-%d-%d.cpu.pprof", n, p))
		}
		arg, _ := json.Marshal(cfg)
		c := exec.Command(r.env.self, shardCommand, string(arg))
		outs[p] = &bytes.Buffer{}
		log, err := os.OpenFile(filepath.Join(r.env.logDir, fmt.Sprintf("shard-driver-%d.log", p)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		defer log.Close()
		c.Stdout, c.Stderr = outs[p], log
		ownGroup(c)
		if err := c.Start(); err != nil {
			return nil, fmt.Errorf("start driver: %w", err)
		}
		cmds[p] = c
	}
	defer func() {
		for _, c := range cmds {
			if c != nil && c.ProcessState == nil {
				killGroup(c.Process)
			}
		}
	}()
	r.logf("  %d streams: %d driver process(es), ramp until %s, window until %s", n, procs, ws.Format("15:04:05"), we.Format("15:04:05"))
	time.Sleep(time.Until(ws))
	if o.failover {
		// The figures of the window are the replica's, which is the
		// primary after the failover.
		rs, pid = replica, replica.cmd.Process.Pid
	}
	from, err := readServer(rs.addr, pid)
	if err != nil {
		return nil, fmt.Errorf("measure the server: %w", err)
	}
	idleFrom, err := cpuTime([]int{idle.cmd.Process.Pid})
	if err != nil {
		return nil, fmt.Errorf("measure the idle server: %w", err)
	}
	if o.failover {
		time.Sleep(time.Until(ws.Add(o.window / 2)))
		if err := failover(primary, replica, fw); err != nil {
			return nil, err
		}
		r.logf("  %d streams: the primary SIGKILLed and its replica promoted at %s", n, time.Now().Format("15:04:05.000"))
	}
	time.Sleep(time.Until(we))
	to, err := readServer(rs.addr, pid)
	if err != nil {
		return nil, fmt.Errorf("measure the server: %w", err)
	}
	idleTo, err := cpuTime([]int{idle.cmd.Process.Pid})
	if err != nil {
		return nil, fmt.Errorf("measure the idle server: %w", err)
	}
	res := make([]*shardDriverResult, procs)
	for p, c := range cmds {
		if err := c.Wait(); err != nil {
			return nil, fmt.Errorf("driver %d: %w (see %s)", p, err, filepath.Join(r.env.logDir, fmt.Sprintf("shard-driver-%d.log", p)))
		}
		res[p] = &shardDriverResult{}
		if err := json.Unmarshal(outs[p].Bytes(), res[p]); err != nil {
			return nil, fmt.Errorf("driver %d: result: %w", p, err)
		}
	}
	w := to.sub(from)
	w.idle = idleTo - idleFrom
	row.fill(res, w)
	row.PaceUS = num(o.streamDur.Microseconds() / int64(o.events))
	row.DriverBound = row.driverBound()
	row.Knee = row.knee(o)
	return row, nil
}

// shardAbout says how scenario shard runs and what its table holds.
const shardAbout = "The Redis store itself (`redis.New`, no HTTP) with N streams live at once against a fresh private server per step: each stream is a claim, " +
	"its events appended at an even pace over the stream's length (`-shard-stream`, `-shard-events`), the lease renewals, and the commit; " +
	"a share of them (`-shard-follow`) is followed from a second store instance (another replica) that asks the owner for the mirror and reads it to the committed end. " +
	"Each slot starts its first stream at its own offset within one stream's length and a new key as each ends, so N stay live; after that ramp, a steady window (`-shard-window`) is measured. " +
	"Server CPU = the server process's user+system time from /proc over the window, as a share of one core (main thread apart: with io-threads the main thread is the limit). " +
	"Round trips / stream = the server's reads of client sockets (INFO stats total_reads_processed) per commit in the window: one read takes a request, or several that rueidis pipelined; " +
	"commands / stream = every command the server counted (INFO commandstats, all clients, the commands scripts call included) per commit; " +
	"script calls and their µs per call likewise. Claim and commit latency: of those begun in the window; join wait: from the follower's Begin to its first event. " +
	"Driver CPU = the driver processes' CPU over the window (share of one core, all and the busiest); driver lag p99 = how late the latest event of a stream was appended, a sign the driver could not keep the pace. " +
	"A step with errors fails; the steps stop at the knee."

// writeShard writes scenario shard's table.
func (rep *report) writeShard(b *strings.Builder) {
	if len(rep.Shard) == 0 {
		return
	}
	fmt.Fprintf(b, "### (shard) Concurrent streams one Redis shard holds\n\n%s\n\n", shardAbout)
	head := []string{"server", "streams", "drivers", "server CPU % core (main thread)", "server CPU µs / stream", "round trips / stream", "commands / stream", "script calls / stream", "µs / script call",
		"idle server CPU % core", "server CPU µs / stream net of idle",
		"claim p50 / p99 ms", "commit p50 / p99 ms", "join wait p50 / p99 ms (n)", "driver CPU % core (busiest)", "driver lag p99 ms", "errors"}
	cols := make([]column, len(head))
	for i, h := range head {
		cols[i] = column{head: h, align: "---:"}
	}
	cols[0].align = "---"
	writeHead(b, cols)
	ms := func(x num) string { return fmtNum(float64(x)/1000, 2) }
	for _, r := range rep.Shard {
		srv := r.Server
		if r.IOThreads > 1 {
			srv += fmt.Sprintf(" (io-threads %d)", r.IOThreads)
		}
		cells := []string{srv, strconv.Itoa(r.Streams), strconv.Itoa(r.Procs),
			fmtNum(100*float64(r.ServerCPU), 1) + " (" + fmtNum(100*float64(r.ServerMainCPU), 1) + ")",
			fmtNum(float64(r.ServerUSPerStream), 1), fmtNum(float64(r.ReadsPerStream), 2), fmtNum(float64(r.CommandsPerStream), 2), fmtNum(float64(r.ScriptsPerStream), 2), fmtNum(float64(r.ScriptUSPerCall), 1),
			fmtNum(100*float64(r.IdleCPU), 1), fmtNum(float64(r.NetUSPerStream), 1),
			ms(r.ClaimP50us) + " / " + ms(r.ClaimP99us), ms(r.CommitP50us) + " / " + ms(r.CommitP99us),
			ms(r.JoinP50us) + " / " + ms(r.JoinP99us) + fmt.Sprintf(" (%d)", r.JoinSamples),
			fmtNum(100*float64(r.DriverCPU), 0) + " (" + fmtNum(100*float64(r.DriverMaxCPU), 0) + ")", ms(r.LagP99us), strconv.FormatInt(r.Errors, 10)}
		fmt.Fprintf(b, "| %s |\n", strings.Join(cells, " | "))
	}
	b.WriteString("\n")
	writeShardCommands(b, rep.Shard)
	for _, r := range rep.Shard {
		var calls []string
		for name, c := range r.Calls {
			calls = append(calls, fmt.Sprintf("%s %d (%.1f µs/call)", name, c.Calls, ratio(c.USec, float64(c.Calls))))
		}
		slices.Sort(calls)
		fmt.Fprintf(b, "- %d streams: %d claims, %d commits in %.1f s; store calls: %d claims, %d append batches, %d renewals, %d asks, %d reads; commandstats: %s\n",
			r.Streams, r.Claims, r.Commits, float64(r.WindowSec), r.Store.Claims, r.Store.Batches, r.Store.Renewals, r.Store.Asks, r.Store.Reads, strings.Join(calls, ", "))
		if r.DriverBound != "" {
			fmt.Fprintf(b, "- %d streams: the drivers may not have kept the pace (%s): run the step from more processes (-shard-procs)\n", r.Streams, r.DriverBound)
		}
		if r.Failover {
			rc := r.Recheck
			fmt.Fprintf(b, "- %d streams, failover (the primary SIGKILLed mid-window, its replica promoted; the server's figures are the replica's): %d streams begun, %d committed; errors by kind %v; claimed again after: %d committed keys replayed, %d not (a retry would pay twice), %d that did not commit got a new generation, %d other\n",
				r.Streams, r.Begun, r.Kept, r.ErrorKinds, rc.Replayed, rc.Lost, rc.Retried, rc.Other)
			if r.Store.Waits > 0 {
				fmt.Fprintf(b, "- %d streams, failover: WAITs for the replica after claims and commits in the window (-shard-wait-replicas): %d, of them short (timed out or failed: after the promotion the new primary has no replica) %d\n",
					r.Streams, r.Store.Waits, r.Store.WaitsShort)
			}
		}
		if r.Knee != "" {
			fmt.Fprintf(b, "- %d streams: the knee: %s\n", r.Streams, r.Knee)
		}
		for _, e := range r.ErrorSamples {
			fmt.Fprintf(b, "- %d streams: error: %s\n", r.Streams, e)
		}
	}
	b.WriteString("\n")
}

// shardCommandsAbout says what writeShardCommands's table holds.
const shardCommandsAbout = "Where the server's time goes, per stream (per commit in the window), by command (INFO commandstats): calls, µs per call and µs per stream. " +
	"A script's µs (evalsha) include those of the commands it calls, which are listed under their own names too; so the sum of the column exceeds the commands' time. " +
	"Beside the commands, the server spends its time reading and writing sockets (a round trip each) and on its own cron: " +
	"the idle server's CPU over the same window is subtracted in *net of idle*."

// writeShardCommands writes, per step, the server's time by command.
func writeShardCommands(b *strings.Builder, rows []*shardRow) {
	fmt.Fprintf(b, "#### (shard) Where the server's time goes, per stream\n\n%s\n\n", shardCommandsAbout)
	writeHead(b, []column{{head: "server", align: "---"}, {head: "streams", align: "---:"}, {head: "follow", align: "---:"}, {head: "command", align: "---"},
		{head: "calls / stream", align: "---:"}, {head: "µs / call", align: "---:"}, {head: "µs / stream", align: "---:"}})
	for _, r := range rows {
		names := slices.Collect(maps.Keys(r.Calls))
		slices.SortFunc(names, func(x, y string) int { return cmp.Compare(r.Calls[y].USec, r.Calls[x].USec) })
		streams := float64(r.Commits)
		for _, name := range names {
			c := r.Calls[name]
			fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s |\n", r.Server, r.Streams, fmtNum(float64(r.Follow), 2), name,
				fmtNum(ratio(float64(c.Calls), streams), 2), fmtNum(ratio(c.USec, float64(c.Calls)), 1), fmtNum(ratio(c.USec, streams), 1))
		}
		fmt.Fprintf(b, "| %s | %d | %s | **server CPU** (idle server's, net of idle) | | | %s (%s, %s) |\n", r.Server, r.Streams, fmtNum(float64(r.Follow), 2),
			fmtNum(float64(r.ServerUSPerStream), 1), fmtNum(float64(r.ServerUSPerStream-r.NetUSPerStream), 1), fmtNum(float64(r.NetUSPerStream), 1))
	}
	b.WriteString("\n")
}
