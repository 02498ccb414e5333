package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
)

// TestSlowOrigin: the client whose request started the generation is
// written by the generation while it keeps up; when it falls behind, a
// goroutine of its own takes over from the exact byte where the
// generation's last write stopped. A client that catches up gets the
// whole stream, byte for byte; one that stalls is dropped after
// -slow-client-timeout, and neither the generation nor a joiner waits.
func TestSlowOrigin(t *testing.T) {
	// Not parallel: it times the joiner of a 12 MB stream. Its two cases
	// run at once, each with a proxy of its own: the joiner's bound (8 s)
	// is four times its time alone.
	t.Run("behind, then catches up", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, slowMock(time.Millisecond, 1500), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
			pc.SlowClientTimeout = 10 * time.Second
		})
		key := newKey("behind")
		conn := keyedConn(t, e, key, "X-Mock-Chunk-Bytes: 8000\r\n") // ~12 MB: more than socket buffers hold
		// Read nothing while the generation runs, so that its writes fill
		// the socket buffers, then read all.
		e.waitState(key, "", cache.StateCommitted)
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("reading the stream: %v (after %d bytes)", err, len(raw))
		}
		got := parseResult(resp, raw, nil)
		if n := len(got.events); n != 1503 || got.events[n-1].Data != "[DONE]" || got.aborted {
			t.Fatalf("got %d events (aborted %v); want 1503 ending [DONE]", n, got.aborted)
		}
		if n := testutil.ToFloat64(e.proxy.m.originHandoffs); n != 1 {
			t.Fatalf("clients_behind_total = %v; want 1 (the test must make the client fall behind)", n)
		}
		replay := e.fetch(req{key: key})
		if !replay.replayed || string(eventBytes(raw)) != string(replay.raw) {
			t.Fatalf("the stream the slow client got differs from the recorded one")
		}
		if testutil.ToFloat64(e.proxy.m.slowDropped) != 0 {
			t.Fatalf("a client that caught up was counted as dropped")
		}
		e.wantCalls(1)
	})
	t.Run("stalled: dropped, the generation goes on", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, slowMock(time.Millisecond, 1500), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
			pc.SlowClientTimeout = time.Second
		})
		key := newKey("stalled")
		conn := keyedConn(t, e, key, "X-Mock-Chunk-Bytes: 8000\r\n") // ~12 MB
		e.waitState(key, "", cache.StateExecutionStarted)
		start := time.Now()
		joiner := e.fetch(req{key: key})
		if n := len(joiner.events); n != 1503 || joiner.events[n-1].Data != "[DONE]" || !joiner.replayed {
			t.Fatalf("joiner: got %d events; want 1503 ending [DONE]", n)
		}
		if took := time.Since(start); took > 8*time.Second {
			t.Fatalf("the joiner took %v", took)
		}
		e.waitState(key, "", cache.StateCommitted)
		waitFor(t, func() bool { return testutil.ToFloat64(e.proxy.m.slowDropped) == 1 })
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		slowRaw, _ := io.ReadAll(conn)
		if strings.Contains(string(slowRaw), "data: [DONE]") || !strings.Contains(string(slowRaw), "200 OK") {
			t.Fatalf("stalled client: got %d bytes (whole stream or no head); want a prefix, then the end of the connection", len(slowRaw))
		}
		e.wantCalls(1)
	})
}

// TestDisconnectDoesNotCancel: a client that drops after 3 events does not
// stop the generation; a repeat is a hit with the full stream.
func TestDisconnectDoesNotCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(3*time.Millisecond, 60))
	key := newKey("drop")
	readPrefix(t, e.do(req{key: key}), 3)
	e.waitState(key, "", cache.StateCommitted)
	got := e.fetch(req{key: key})
	if !got.replayed || got.lastData() != "[DONE]" || len(got.events) != 63 {
		t.Fatalf("repeat: replayed %v last %q events %d; want true [DONE] 63", got.replayed, got.lastData(), len(got.events))
	}
	e.wantCalls(1)
}

// TestShortStreamsAreWhole: one-token streams, with and without a key,
// from several clients at once, each arrive whole from one upstream call:
// they end about when the client's connection is taken over. It does not
// reliably catch the take-over reading "no head yet" before "ended" (it
// passed three runs against that bug); TestHeadAndEndDuringTakeOver
// forces that interleaving.
func TestShortStreamsAreWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(0, 1))
	const workers, each = 4, 200
	var wg sync.WaitGroup
	errs := make(chan string, workers*each)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				key := ""
				if i%4 != 0 { // most with a key, some without
					key = fmt.Sprintf("short-%d-%d", w, i)
				}
				r := e.fetch(req{key: key})
				if r.status != 200 || len(r.events) < 2 || r.lastData() != "[DONE]" {
					errs <- fmt.Sprintf("%s: %d, %d events, last %q", key, r.status, len(r.events), r.lastData())
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	n := 0
	for msg := range errs {
		if n++; n <= 5 {
			t.Error(msg)
		}
	}
	if n > 0 {
		t.Fatalf("%d of %d short streams were not whole", n, workers*each)
	}
	e.wantCalls(workers * each)
}

// TestHeadAndEndDuringTakeOver: the take-over looks at the flight while
// the generation sets the head of a short stream and ends it; the client
// still gets the whole stream, not an empty answer.
func TestHeadAndEndDuringTakeOver(t *testing.T) {
	// Not parallel: it sets testHookAdvance, which every proxy in the test
	// binary calls (a hook of one proxy's own would take a change to
	// origin.go).
	var calls atomic.Int64
	lookedAt := make(chan struct{}) // closed by the hook: the take-over looked at the flight
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		select {
		case <-lookedAt: // the head comes after the take-over's look
		case <-r.Context().Done():
			return
		case <-time.After(10 * time.Second): // no take-over: the hook says so
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	e := newEnvUpstream(t, up.URL, nil, Config{}, cache.Config{})
	var once sync.Once
	hook := func(f *cache.Flight) {
		once.Do(func() {
			if _, ok := f.Head(); ok {
				t.Error("the head came before the take-over; the test shows nothing")
			}
			close(lookedAt)
			<-f.Done() // the generation sets the head and ends meanwhile
		})
	}
	testHookAdvance.Store(&hook)
	defer testHookAdvance.Store(nil)
	r := e.fetch(req{key: newKey("head-end")})
	if r.status != 200 || len(r.events) != 2 || r.lastData() != "[DONE]" {
		t.Fatalf("got %d with %d events %q; want the whole stream", r.status, len(r.events), r.raw)
	}
	if calls.Load() != 1 {
		t.Fatalf("%d upstream calls; want 1", calls.Load())
	}
}
