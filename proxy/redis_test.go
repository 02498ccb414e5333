package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/redis"
	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/redistest"
)

// redisEnv is ssegate with a Redis store on addr in front of the mock,
// logging to logs.
func redisEnv(t *testing.T, addr string, logs *gatetest.LogBuffer, opts ...envOption) (*env, *redis.Store) {
	t.Helper()
	return replicaEnv(t, addr, redistest.Prefix(t), logs, opts...)
}

// replicaEnv is redisEnv with the keys' prefix given: envs of one prefix
// are replicas of one deployment.
func replicaEnv(t *testing.T, addr, prefix string, logs *gatetest.LogBuffer, opts ...envOption) (*env, *redis.Store) {
	t.Helper()
	store, err := redis.New(redis.Config{URL: "redis://" + addr, Prefix: prefix,
		Lease: 3 * time.Second, Timeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	e := newEnv(t, append([]envOption{func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.Store = store
		pc.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}}, opts...)...)
	e.info = store.Info // waitState reads the key's state in Redis
	return e, store
}

// TestStoreErrorText: when Redis refuses (an ACL that forbids the claim's
// script) or cannot be reached, the 503 store_unavailable answer carries
// the cause's fixed message only, never the Redis client's error (the
// server's address, its refusal's words); the log has that error, with
// the key and the tenant's hash.
func TestStoreErrorText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		fault func(*redistest.Server) error
		want  string // in the log, not in the answer
	}{
		{"acl", func(s *redistest.Server) error {
			_, err := redistest.Command(s.Addr, time.Second, "ACL", "SETUSER", "default", "-evalsha", "-eval", "-hmget")
			return err
		}, "NOPERM"},
		{"down", func(s *redistest.Server) error { s.Stop(); return nil }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			var logs gatetest.LogBuffer
			e, _ := redisEnv(t, srv.Addr, &logs)
			if got := e.fetch(req{key: newKey("before")}); !clean(got) {
				t.Fatalf("before the fault: got %d; want a whole stream", got.status)
			}
			if err := c.fault(srv); err != nil {
				t.Fatal(err)
			}
			want := c.want
			if want == "" {
				want = srv.Addr
			}
			key := newKey("refused")
			for _, r := range []req{
				{key: key},
				{method: "GET", path: "/streams/" + key},
			} {
				got := e.fetch(r)
				if got.status != 503 || got.errType != "store_unavailable" {
					t.Fatalf("%s %s: got %d %q; want 503 store_unavailable", r.method, r.path, got.status, got.errType)
				}
				body := string(got.raw)
				for _, bad := range []string{srv.Addr, "127.0.0.1", "NOPERM", "redis", "dial", "refused"} {
					if strings.Contains(strings.ToLower(body), strings.ToLower(bad)) {
						t.Errorf("%s %s: the answer %s holds %q", r.method, r.path, body, bad)
					}
				}
			}
			waitFor(t, func() bool { return strings.Contains(logs.String(), want) })
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, "store_unavailable") && strings.Contains(line, want) {
					if !strings.Contains(line, "key="+key) || !strings.Contains(line, "tenant="+e.tenantOf("")) {
						t.Errorf("the log line %q lacks the key or the tenant", line)
					}
					return
				}
			}
			t.Errorf("no log line of the refusal names %q:\n%s", want, logs.String())
		})
	}
}

// missReply is the start of the claim script's answer that gave the key
// to its caller, as Redis sends it.
const missReply = "$4\r\nmiss\r\n"

// TestClaimReplyLost: a claim that ran in Redis but whose answer never
// reached its replica makes one generation for the intent, and nobody
// waits a lease on a generation that no replica runs. Replica A reaches
// Redis through a relay that loses the claim's answer; replica B reaches
// it directly; both call the same upstream.
//
//   - cut: the connection is cut once the claim ran. A's claim is sent
//     again with its token, recognises its own claim and takes it: the
//     client gets the whole stream, B's duplicate replays it.
//   - timeout: the answer is held past A's timeout, then cut. A answers
//     503 store_unavailable (nothing went upstream) and ends the
//     generation its claim made; B, which joined it meanwhile, gets the
//     same retryable 503 at once rather than after a lease; the retry
//     makes the one generation.
func TestClaimReplyLost(t *testing.T) {
	t.Parallel()
	const lease, timeout = 8 * time.Second, time.Second
	for _, hold := range []time.Duration{0, timeout + 200*time.Millisecond} {
		name := "cut"
		if hold > 0 {
			name = "timeout"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			relay := redistest.NewRelay(t, srv.Addr)
			prefix := redistest.Prefix(t)
			var logs gatetest.LogBuffer
			store := func(addr string) *redis.Store {
				s, err := redis.New(redis.Config{URL: "redis://" + addr, Prefix: prefix,
					Lease: lease, Timeout: timeout, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(s.Close)
				return s
			}
			mock, upURL := startMock(t, mockllm.Config{Tokens: 16})
			a := newEnvUpstream(t, upURL, mock, Config{Store: store(relay.Addr)}, cache.Config{})
			b := newEnvUpstream(t, upURL, mock, Config{Store: store(srv.Addr)}, cache.Config{})
			key := newKey("lost")

			lost := relay.LoseReply(missReply, hold)
			if hold == 0 {
				got := a.fetch(req{key: key})
				select {
				case <-lost:
				default:
					t.Fatal("no claim's reply was lost")
				}
				if !clean(got) || got.replayed {
					t.Fatalf("A: got %d %q; want the whole stream of its own generation", got.status, got.errType)
				}
				if dup := b.fetch(req{key: key}); !clean(dup) || !dup.replayed || !bytes.Equal(eventBytes(dup.raw), eventBytes(got.raw)) {
					t.Fatalf("B: got %d replayed %v; want A's stream replayed", dup.status, dup.replayed)
				}
				a.wantCalls(1)
				return
			}

			first := make(chan result, 1)
			go func() { first <- a.fetch(req{key: key}) }()
			select {
			case <-lost:
			case got := <-first:
				t.Fatalf("A answered %d %q before its claim's reply was lost", got.status, got.errType)
			}
			start := time.Now()
			joined := b.fetch(req{key: key})
			if took := time.Since(start); joined.status != 503 || joined.errType != "store_unavailable" ||
				joined.header.Get("Retry-After") == "" || took > lease/2 {
				t.Fatalf("B, joined meanwhile: got %d %q after %v; want 503 store_unavailable with Retry-After, well within the lease (%v)",
					joined.status, joined.errType, took, lease)
			}
			if got := <-first; got.status != 503 || got.errType != "store_unavailable" || got.header.Get("Retry-After") == "" {
				t.Fatalf("A: got %d %q; want 503 store_unavailable with Retry-After", got.status, got.errType)
			}
			a.wantCalls(0)
			// The client retries as it was told to, on either replica.
			var got result
			for i := range 20 {
				if got = []*env{a, b}[i%2].fetch(req{key: key}); got.status != 503 {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if !clean(got) {
				t.Fatalf("the retry: got %d %q; want the whole stream", got.status, got.errType)
			}
			a.wantCalls(1)
			if !strings.Contains(logs.String(), "reply was lost") {
				t.Errorf("the log does not say a claim's reply was lost:\n%s", logs.String())
			}
		})
	}
}

// TestAppendReplyLost: a journal batch that Redis appended but whose
// answer was lost (the connection cut after it ran) is sent again, finds
// its own events in the journal and goes on: the stream ends whole and
// is stored, with one upstream call, rather than the owner taking its
// own events for another replica's and aborting a healthy stream. The
// journal is mirrored because a duplicate on another replica follows it.
func TestAppendReplyLost(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	relay := redistest.NewRelay(t, srv.Addr)
	var logs gatetest.LogBuffer
	prefix := redistest.Prefix(t)
	e, _ := replicaEnv(t, relay.Addr, prefix, &logs, slowMock(20*time.Millisecond, 30))
	other, _ := replicaEnv(t, srv.Addr, prefix, &logs)
	key := newKey("append")
	resp := e.do(req{key: key})
	br := bufio.NewReader(resp.Body)
	var raw bytes.Buffer
	for ids := 0; ids < 3; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d events: %v", ids, err)
		}
		raw.WriteString(line)
		if strings.HasPrefix(line, "id: ") {
			ids++
		}
	}
	// The duplicate's head comes with the first mirrored batch: from then
	// on the owner appends, and the next "ok" is an append's.
	join := other.do(req{key: key})
	lost := relay.LoseReply("*1\r\n$2\r\nok\r\n", 0)
	rest, err := io.ReadAll(br)
	resp.Body.Close()
	raw.Write(rest)
	got := parseResult(resp, raw.Bytes(), err)
	jraw, jerr := io.ReadAll(join.Body)
	join.Body.Close()
	if dup := parseResult(join, jraw, jerr); !clean(dup) || !bytes.Equal(eventBytes(dup.raw), eventBytes(got.raw)) {
		t.Fatalf("the duplicate on the other replica: got %d, last event %q; want the whole stream", dup.status, dup.lastData())
	}
	select {
	case <-lost:
	default:
		t.Fatal("no append's answer was lost")
	}
	if !clean(got) || got.aborted {
		t.Fatalf("got %d, last event %q; want the whole stream", got.status, got.lastData())
	}
	if dup := e.fetch(req{key: key}); !clean(dup) || !dup.replayed || !bytes.Equal(eventBytes(dup.raw), eventBytes(got.raw)) {
		t.Fatalf("duplicate: got %d replayed %v; want the stream replayed", dup.status, dup.replayed)
	}
	e.wantCalls(1)
}

// TestRedisDrainWhileHeadAwaited: with the Redis store, a drain that ends
// once the request was written upstream and while its head is awaited
// answers the client with the outcome unknown (502, never 503 or
// Retry-After), the upstream is called once, and the key ends
// commit_unknown in Redis, for every replica to see. (A Redis paused
// meanwhile is test/replicas' TestRedisPausedWhileHeadAwaited.)
func TestRedisDrainWhileHeadAwaited(t *testing.T) {
	t.Parallel()
	// A stream's connection is taken over at once; a request that is not
	// a stream's waits for its answer in its handler (answerInHandler).
	for _, body := range []struct{ name, body string }{{"stream", chatBody}, {"not a stream", plainBody}} {
		t.Run(body.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			store, err := redis.New(redis.Config{URL: "redis://" + srv.Addr, Prefix: redistest.Prefix(t),
				Lease: time.Second, Timeout: 300 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(store.Close)
			up := newRawUpstream(t, func(u *rawUpstream, c net.Conn) {
				readRequest(c)
				u.stall() // no head, ever
			})
			e, key, done := fetchAwaitingHead(t, up, "drain", body.body, func(pc *Config) { pc.Store = store })
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if err := e.proxy.Shutdown(ctx); err == nil {
				t.Error("Shutdown with a head still awaited past the drain: got nil; want the drain's error")
			}
			unknownAnswer(t, "client", <-done, 502)
			sc := cache.Scope{Tenant: e.tenantOf(""), Key: key}
			var last cache.KeyInfo
			if !within(10*time.Second, func() bool {
				last, _ = store.Info(sc)
				return last.State == cache.StateCommitUnknown
			}) {
				t.Fatalf("key in Redis: %+v; want commit_unknown", last)
			}
			wantCount(t, "upstream calls", up.calls.Load(), 1)
		})
	}
}
