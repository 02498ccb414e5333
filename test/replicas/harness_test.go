package replicas_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/redistest"
	"github.com/ssegate/ssegate/sse"
)

// The lease the replicas run with: short, so that crash and pause tests
// take a second rather than half a minute.
const (
	lease   = 400 * time.Millisecond
	timeout = 500 * time.Millisecond
)

func TestMain(m *testing.M) { gatetest.Main(m) }

// env is one test's world: a Redis database of its own (or a Redis
// Cluster of its own), a counting mock upstream, and the replicas started
// on them.
type env struct {
	t        *testing.T
	redisURL string
	rc       rueidis.Client
	nodes    []rueidis.Client   // rc, or a client per primary of a cluster: what SCAN and KEYS run on
	cluster  *redistest.Cluster // the test's own cluster, or nil
	mock     *mockllm.Server
	upstream string

	mu    sync.Mutex // guards gates
	gates []*gatetest.Process
}

// databases hands out Redis databases, one per test, so tests can count
// every key of theirs (and flush them) on the Redis CI shares.
var nextDB = 1

// newEnv sets up a test on the shared Redis (db of its own) or, with srv,
// on a private server the test may stop.
func newEnv(t *testing.T, srv *redistest.Server, mock mockllm.Config) *env {
	t.Helper()
	var addr string
	db := 0
	if srv != nil {
		addr = srv.Addr
	} else {
		addr = redistest.Shared(t)
		db = nextDB
		nextDB = nextDB%15 + 1
	}
	e := &env{t: t, redisURL: fmt.Sprintf("redis://%s/%d", addr, db)}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, SelectDB: db,
		DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatalf("redis client: %v", err)
	}
	t.Cleanup(rc.Close)
	e.rc, e.nodes = rc, []rueidis.Client{rc}
	if err := rc.Do(context.Background(), rc.B().Flushdb().Build()).Error(); err != nil {
		t.Fatalf("FLUSHDB: %v", err)
	}
	e.startMock(mock)
	return e
}

// newClusterEnv sets up a test on a Redis Cluster of its own (three
// primaries, with replicas[0] Redis replicas each when given, db 0, the
// default prefix): the replicas get every primary as a seed in their
// -redis URL.
func newClusterEnv(t *testing.T, mock mockllm.Config, replicas ...int) *env {
	t.Helper()
	c := redistest.StartCluster(t, 3, replicas...)
	e := &env{t: t, redisURL: c.URL(), cluster: c}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs(), DisableCache: true})
	if err != nil {
		t.Fatalf("redis cluster client: %v", err)
	}
	t.Cleanup(rc.Close)
	e.rc = rc
	for _, s := range c.Nodes {
		n, ok := rc.Nodes()[s.Addr]
		if !ok {
			t.Fatalf("the cluster client does not know primary %s", s.Addr)
		}
		e.nodes = append(e.nodes, n)
	}
	e.startMock(mock)
	return e
}

func (e *env) startMock(mock mockllm.Config) {
	e.t.Helper()
	var err error
	e.mock = mockllm.New(mock)
	if e.upstream, err = e.mock.Start("127.0.0.1:0"); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { e.mock.Close() })
}

// backend is where a test's replicas keep their keys: the shared
// standalone Redis or a Redis Cluster.
type backend struct {
	name    string
	cluster bool
}

// newEnv sets up the test on the backend.
func (b backend) newEnv(t *testing.T, mock mockllm.Config) *env {
	t.Helper()
	if b.cluster {
		return newClusterEnv(t, mock)
	}
	return newEnv(t, nil, mock)
}

// backends runs f as a subtest on a standalone Redis, then on a Redis
// Cluster.
func backends(t *testing.T, f func(t *testing.T, be backend)) {
	for _, b := range []backend{{name: "standalone"}, {name: "cluster", cluster: true}} {
		t.Run(b.name, func(t *testing.T) { f(t, b) })
	}
}

// keys returns every key of the test's database, or of every primary of
// its cluster, matching pattern.
func (e *env) keys(pattern string) []string {
	e.t.Helper()
	var all []string
	for _, n := range e.nodes {
		ks, err := n.Do(context.Background(), n.B().Keys().Pattern(pattern).Build()).AsStrSlice()
		if err != nil {
			e.t.Fatalf("KEYS %s: %v", pattern, err)
		}
		all = append(all, ks...)
	}
	return all
}

// start runs a replica on a free loopback port with the env's flags, then
// args. It is killed (after a SIGCONT, in case the test paused it) when
// the test ends.
func (e *env) start(name string, args ...string) *gatetest.Process {
	e.t.Helper()
	g := gatetest.Config{Name: name}.Start(e.t, append([]string{"-upstream", e.upstream,
		"-redis", e.redisURL, "-redis-lease", lease.String(), "-redis-timeout", timeout.String(),
		"-heartbeat", "1h", "-log-format", "text", "-log-level", "warn"}, args...)...)
	e.mu.Lock()
	e.gates = append(e.gates, g)
	e.mu.Unlock()
	return g
}

// body is the request every test sends (a chat completion stream); the
// key makes requests distinct.
const body = `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// event is one SSE event as a client parses it.
type event struct {
	id, typ, data string
}

// stream is one client's answer, read as it comes.
type stream struct {
	status int
	header http.Header
	resp   *http.Response
	r      *bufio.Reader
	raw    []byte // every event's bytes, comments left out
	all    []byte // every byte of the body
	events []event
	err    error // how reading ended, when it did not end at EOF
	eof    bool
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}

// open sends a request and returns once the head arrived.
func open(t *testing.T, method, url, key, lastID string) *stream {
	t.Helper()
	s, err := tryOpen(method, url, key, lastID)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return s
}

func tryOpen(method, url, key, lastID string) (*stream, error) {
	var rd io.Reader
	if method == http.MethodPost {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer replicas-test")
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	return &stream{status: resp.StatusCode, header: resp.Header, resp: resp, r: bufio.NewReader(resp.Body)}, nil
}

func post(t *testing.T, g *gatetest.Process, key string) *stream {
	t.Helper()
	return open(t, http.MethodPost, g.URL+"/v1/chat/completions", key, "")
}

// next reads the next event; false at the end of the body.
func (s *stream) next() (event, bool) {
	var ev event
	var block []byte
	for {
		line, err := s.r.ReadString('\n')
		s.all = append(s.all, line...)
		if err != nil {
			if err == io.EOF {
				s.eof = true
			} else {
				s.err = err
			}
			s.resp.Body.Close()
			return event{}, false
		}
		if line == "\n" {
			if len(block) == 0 {
				continue
			}
			s.raw = append(s.raw, block...)
			s.raw = append(s.raw, '\n')
			s.events = append(s.events, ev)
			return ev, true
		}
		if strings.HasPrefix(line, ":") {
			continue // keep-alive comment: relayed, never part of the stream
		}
		block = append(block, line...)
		name, val, _ := strings.Cut(strings.TrimSuffix(line, "\n"), ":")
		val = strings.TrimPrefix(val, " ")
		switch name {
		case "id":
			ev.id = val
		case "event":
			ev.typ = val
		case "data":
			if ev.data != "" {
				ev.data += "\n"
			}
			ev.data += val
		}
	}
}

// readN reads n events.
func (s *stream) readN(t *testing.T, n int) {
	t.Helper()
	for range n {
		if _, ok := s.next(); !ok {
			t.Fatalf("stream ended after %d events; want %d (err %v)", len(s.events), n, s.err)
		}
	}
}

// readAll reads to the end of the body.
func (s *stream) readAll() *stream {
	for {
		if _, ok := s.next(); !ok {
			return s
		}
	}
}

func (s *stream) close() { s.resp.Body.Close() }

// clean reports whether the stream ended with the dialect's terminal event.
func (s *stream) clean() bool {
	return len(s.events) > 0 && s.events[len(s.events)-1].data == "[DONE]"
}

// aborted returns the code of the stream_aborted event that ended the
// stream, or "".
func (s *stream) aborted() string {
	if len(s.events) == 0 {
		return ""
	}
	last := s.events[len(s.events)-1]
	if last.typ != "error" || !strings.Contains(last.data, `"stream_aborted"`) {
		return ""
	}
	_, code, _ := strings.Cut(last.data, `"code":"`)
	code, _, _ = strings.Cut(code, `"`)
	return code
}

// ids parses the stream's event ids (the abort event has none).
func (s *stream) ids(t *testing.T) []sse.ID {
	t.Helper()
	var ids []sse.ID
	for _, ev := range s.events {
		if ev.id == "" {
			continue
		}
		id, err := sse.ParseID(ev.id)
		if err != nil {
			t.Fatalf("event id %q: %v", ev.id, err)
		}
		ids = append(ids, id)
	}
	return ids
}

// contiguous checks that the stream's ids are after+1, after+2, … of one
// generation, and returns that generation.
func contiguous(t *testing.T, s *stream, after sse.ID) uint64 {
	t.Helper()
	ids := s.ids(t)
	gen := after.Gen
	for i, id := range ids {
		if gen == 0 {
			gen = id.Gen
		}
		if id.Gen != gen || id.Seq != after.Seq+uint64(i)+1 {
			t.Fatalf("event %d: id %v; want %d-%d (one generation, no gap, no duplicate)", i, id, gen, after.Seq+uint64(i)+1)
		}
	}
	return gen
}

// commits returns the commits Redis recorded for each key of the test's
// database; the finish script counts them.
func (e *env) commits() map[string]int64 {
	e.t.Helper()
	ctx := context.Background()
	out := map[string]int64{}
	for _, k := range e.keys("ssg:*:st") {
		n, err := e.rc.Do(ctx, e.rc.B().Hget().Key(k).Field("commits").Build()).AsInt64()
		if err != nil && !rueidis.IsRedisNil(err) {
			e.t.Fatalf("HGET %s commits: %v", k, err)
		}
		out[k] = n
	}
	return out
}

// wanted reports whether a follower asked for a journal of the test.
func (e *env) wanted() bool {
	for _, k := range e.keys("ssg:*:st") {
		if v, _ := e.rc.Do(context.Background(), e.rc.B().Hget().Key(k).Field("want").Build()).ToString(); v == "1" {
			return true
		}
	}
	return false
}

// atMostOneCommit checks the invariant over every key of the test, and
// returns the total.
func (e *env) atMostOneCommit() int64 {
	e.t.Helper()
	var total int64
	for k, n := range e.commits() {
		if n > 1 {
			e.t.Fatalf("key %s: %d commits; want at most one", k, n)
		}
		total += n
	}
	return total
}

// clusterOK reports whether every one of servers says its cluster is ok:
// after a failover, that they all know the new topology, which is what a
// replica's Redis client then learns.
func clusterOK(servers ...*redistest.Server) bool {
	for _, s := range servers {
		info, err := redistest.Command(s.Addr, time.Second, "CLUSTER", "INFO")
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			return false
		}
	}
	return true
}

// unstored returns the generations, by key, whose whole answer reached its
// clients while the store refused its commit (docs/design.md, "An answer
// received whole is never dropped"), from every replica's warnings: a
// repeat of such a key may start a new generation, so its clean streams
// need not match another's.
func (e *env) unstored() map[string]map[uint64]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]map[uint64]bool{}
	for _, g := range e.gates {
		for line := range strings.Lines(g.Logs()) {
			if !strings.Contains(line, "whole answer not stored") {
				continue
			}
			var key string
			var gen uint64
			for f := range strings.FieldsSeq(line) {
				if v, ok := strings.CutPrefix(f, "key="); ok {
					key = v
				} else if v, ok := strings.CutPrefix(f, "generation="); ok {
					fmt.Sscan(v, &gen)
				}
			}
			if key == "" || gen == 0 {
				e.t.Fatalf("%s: a warning without its key or generation: %s", g.Name, line)
			}
			if out[key] == nil {
				out[key] = map[uint64]bool{}
			}
			out[key][gen] = true
		}
	}
	return out
}
