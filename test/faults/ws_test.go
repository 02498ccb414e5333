package faults_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/poll"
	"github.com/ssegate/ssegate/proxy"
	"github.com/tidwall/gjson"
)

// TestFaultsWebSocket drives keyed Responses WebSocket turns through
// ssegate under random faults, with the official client: several callers
// per key, each on a socket of its own and a random lane, some cutting
// their socket mid-turn, and upstream sockets dropped mid-turn. The
// invariant: one generation per key, whatever the callers did; a caller
// that got response.completed got the whole turn (every sequence number
// from 0, in order, once); one that read to its end without it got an
// error frame saying why, never a cut passed as whole; and a key's turn
// ends committed (a re-send replays it, with no generation) or
// commit_unknown (a re-send is told so).
func TestFaultsWebSocket(t *testing.T) {
	seed, rounds := seeds(t)
	for r := range rounds {
		s := seed + int64(r)
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) { wsRound(t, s) })
	}
}

func wsRound(t *testing.T, seed int64) {
	rng := rand.New(rand.NewPCG(uint64(seed), 40))
	mock := mockllm.New(mockllm.Config{Delay: 4 * time.Millisecond, Tokens: 24})
	mockURL, err := mock.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mock.Close() })
	store, err := cache.NewMemory(cache.Config{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	p, err := proxy.New(proxy.Config{Upstreams: []string{mockURL}, Store: store,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := p.Server()
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	t.Cleanup(func() {
		p.Abort()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.ShutdownWithContext(ctx) //nolint:errcheck // a test's end
		p.Wait(ctx)                  //nolint:errcheck // a test's end
	})
	base := "http://" + ln.Addr().String() + "/v1/"
	client := openai.NewClient(option.WithBaseURL(base), option.WithAPIKey("sk-faults"), option.WithMaxRetries(0))
	const turnEvents = 24 + 8

	keys := 3 + rng.IntN(4)
	type caller struct {
		key    string
		start  time.Duration
		cutAt  int // events read before the socket is cut; -1: read to the end
		lane   string
		events []string
		seqs   []int64
		err    error
	}
	var cs []*caller
	drops := map[string]int{} // key -> the upstream drops after this many events, set before its first send
	for k := range keys {
		key := fmt.Sprintf("wsf-%d-%d", seed, k)
		if rng.IntN(3) == 0 {
			drops[key] = rng.IntN(turnEvents)
		}
		for range 1 + rng.IntN(4) {
			c := &caller{key: key, start: time.Duration(rng.IntN(150)) * time.Millisecond, cutAt: -1}
			if rng.IntN(5) < 2 {
				c.cutAt = rng.IntN(turnEvents)
			}
			if rng.IntN(2) == 0 {
				c.lane = fmt.Sprintf("lane-%d", rng.IntN(3))
			}
			cs = append(cs, c)
		}
	}
	// The first caller of a key with a drop arms it, alone, before any
	// other caller sends: the mock's drop is its next turn's.
	var armMu sync.Mutex
	armed := map[string]bool{}
	var wg sync.WaitGroup
	begin := time.Now()
	for _, c := range cs {
		wg.Go(func() {
			time.Sleep(time.Until(begin.Add(c.start))) // the plan's spread of callers in time
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			conn, err := client.Responses.Connect(ctx, responses.ResponseConnectionOptions{})
			if err != nil {
				c.err = err
				return
			}
			defer conn.Abort()
			recv := conn.Recv
			create := responses.ResponsesClientEventResponseCreateParam{
				Model:    "ws-model-" + c.key,
				Input:    responses.ResponsesClientEventResponseCreateInputUnionParam{OfString: openai.String("turn " + c.key)},
				Metadata: map[string]string{"ssegate_idempotency_key": c.key},
			}
			if c.lane != "" {
				lane, err := conn.Lane(c.lane)
				if err != nil {
					c.err = err
					return
				}
				recv = lane.Recv
				create.StreamID = openai.String(c.lane)
			}
			armMu.Lock()
			if n, ok := drops[c.key]; ok && !armed[c.key] {
				armed[c.key] = true
				mock.DropWebSocketAfter(n)
			}
			err = conn.Create(ctx, create)
			armMu.Unlock()
			if err != nil {
				c.err = err
				return
			}
			for c.cutAt < 0 || len(c.events) < c.cutAt {
				ev, err := recv(ctx)
				if err != nil {
					c.err = err
					return
				}
				c.events = append(c.events, ev.Type)
				c.seqs = append(c.seqs, gjson.Get(ev.RawJSON(), "sequence_number").Int())
				if ev.Type == "response.completed" || ev.Type == "error" {
					return
				}
			}
		})
	}
	wg.Wait()
	// Every key's turn ends, its callers gone or not.
	deadline := time.Now().Add(10 * time.Second)
	for _, key := range keyList(cs, func(c *caller) string { return c.key }) {
		var st cache.State
		if !poll.Until(time.Until(deadline), func() bool { // the store's state has no signal to wait on
			st = keyState(t, base, key)
			return st == cache.StateCommitted || st == cache.StateCommitUnknown || st == cache.StateFailedRetryable
		}) {
			t.Fatalf("seed %d: key %s did not end: %s", seed, key, st)
		}
	}
	for _, c := range cs {
		who := fmt.Sprintf("seed %d: key %s, caller cut at %d, lane %q", seed, c.key, c.cutAt, c.lane)
		if c.err != nil && c.cutAt < 0 {
			t.Errorf("%s: %v after %v", who, c.err, c.events)
			continue
		}
		if n := len(c.events); n > 0 && c.events[n-1] == "response.completed" {
			if n != turnEvents || c.events[0] != "response.created" {
				t.Errorf("%s: response.completed after %d events; want the whole turn of %d", who, n, turnEvents)
			}
			for i, s := range c.seqs {
				if s != int64(i) {
					t.Errorf("%s: sequence numbers %v; want 0..%d in order", who, c.seqs, turnEvents-1)
					break
				}
			}
		} else if c.cutAt < 0 && (n == 0 || c.events[n-1] != "error") {
			t.Errorf("%s: ended after %v without response.completed or an error frame", who, c.events)
		}
	}
	for _, key := range keyList(cs, func(c *caller) string { return c.key }) {
		if got := mock.CallsFor("ws-model-" + key); got > 1 {
			t.Errorf("seed %d: key %s: %d generations; want at most one", seed, key, got)
		}
	}
	if t.Failed() {
		return
	}
	// A re-send of each key, after its end: a replay of a committed turn,
	// the outcome-unknown error of the others, never a new generation.
	for _, key := range keyList(cs, func(c *caller) string { return c.key }) {
		before := mock.CallsFor("ws-model-" + key)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := client.Responses.Connect(ctx, responses.ResponseConnectionOptions{})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		err = conn.Create(ctx, responses.ResponsesClientEventResponseCreateParam{
			Model:    "ws-model-" + key,
			Input:    responses.ResponsesClientEventResponseCreateInputUnionParam{OfString: openai.String("turn " + key)},
			Metadata: map[string]string{"ssegate_idempotency_key": key},
		})
		var last string
		for err == nil {
			var ev responses.ResponsesServerEventUnion
			if ev, err = conn.Recv(ctx); err == nil {
				last = ev.Type
				if last == "response.completed" || last == "error" {
					break
				}
			}
		}
		conn.Abort()
		cancel()
		state := keyState(t, base, key)
		switch {
		case err != nil:
			t.Errorf("seed %d: re-send of %s: %v", seed, key, err)
		case state == cache.StateCommitted && last != "response.completed":
			t.Errorf("seed %d: re-send of committed %s ended with %s; want the replay", seed, key, last)
		case state == cache.StateCommitUnknown && last != "error":
			t.Errorf("seed %d: re-send of commit_unknown %s ended with %s; want the outcome-unknown error", seed, key, last)
		}
		if after := mock.CallsFor("ws-model-" + key); after != before && state != cache.StateFailedRetryable {
			t.Errorf("seed %d: re-send of %s (%s) made a generation", seed, key, state)
		}
	}
}

// keyList is the distinct keys of cs, in order.
func keyList[C any](cs []C, key func(C) string) []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range cs {
		if k := key(c); !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// keyState is the state of key for the test's credential, from GET
// /keys/{key}.
func keyState(t *testing.T, base, key string) cache.State {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, strings.TrimSuffix(base, "/v1/")+"/keys/"+key, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sk-faults")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return cache.State(gjson.GetBytes(b, "state").String())
}
