package proxy

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/redis"
	"github.com/ssegate/ssegate/internal/redistest"
)

// TestMintedCredentials: a client that mints a credential per request,
// against an upstream that answers each with 401, fills no part of the
// ledger a known tenant needs: after a flood of such keys, far more than
// -max-keys, the known tenant's new key is a miss with one upstream call.
// A repeat of a refused key is a new miss too (the credential was
// refused, nothing was generated). With the memory store and with Redis.
func TestMintedCredentials(t *testing.T) {
	t.Parallel()
	const maxKeys, flood = 40, 300
	up := newFaultServer(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sk-known" {
			status(http.StatusUnauthorized)(0, w, r)
			return
		}
		okStream(w)
	})
	stores := map[string]func(t *testing.T) cache.Config{
		"memory": func(*testing.T) cache.Config { return cache.Config{MaxKeys: maxKeys} },
		"redis":  nil,
	}
	for name := range stores {
		t.Run(name, func(t *testing.T) {
			pc := Config{Retry: RetryConfig{BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, AttemptTimeout: 5 * time.Second}, HeadTimeout: 5 * time.Second}
			var ledger interface {
				Info(cache.Scope) (cache.KeyInfo, bool)
			}
			if name == "redis" {
				r, err := redis.New(redis.Config{URL: "redis://" + redistest.Shared(t), Prefix: redistest.Prefix(t), MaxKeys: maxKeys})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(r.Close)
				pc.Store, ledger = r, r
			}
			e := newEnvUpstream(t, up.url, nil, pc, cache.Config{MaxKeys: maxKeys})
			if ledger == nil {
				ledger = e.store
			}
			known := req{key: newKey("known"), auth: "Bearer sk-known"}
			if r := e.fetch(known); !clean(r) {
				t.Fatalf("known tenant's first key: got %d %q; want a clean stream", r.status, r.raw)
			}
			var wg sync.WaitGroup
			errs := make(chan string, flood)
			minted := make([]req, flood)
			for w := range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < flood; i += 6 {
						minted[i] = req{key: newKey("minted"), auth: fmt.Sprintf("Bearer sk-minted-%s-%d", name, i)}
						r := e.fetch(minted[i])
						if r.status != http.StatusUnauthorized {
							errs <- fmt.Sprintf("minted credential #%d: got %d %s; want the upstream's 401", i, r.status, r.raw)
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for msg := range errs {
				t.Fatal(msg)
			}
			for _, m := range minted { // the ledger holds none of them
				if ki, ok := ledger.Info(cache.Scope{Tenant: e.tenantOf(m.auth), Key: m.key}); ok {
					t.Fatalf("refused key %s: the ledger holds it, %s (%s); want it forgotten", m.key, ki.State, ki.Reason)
				}
			}
			calls := up.calls.Load()
			known.key = newKey("known")
			if r := e.fetch(known); !clean(r) || r.replayed {
				t.Fatalf("known tenant's new key after the flood: got %d %q; want a clean stream of its own", r.status, r.raw)
			}
			wantCount(t, "upstream calls for the known tenant's new key", up.calls.Load()-calls, 1)
			// A refused key, repeated: a new miss, refused again.
			again := req{key: newKey("minted"), auth: "Bearer sk-minted-again"}
			for range 2 {
				if r := e.fetch(again); r.status != http.StatusUnauthorized || r.replayed {
					t.Fatalf("refused key: got %d, replayed %v; want the upstream's own 401", r.status, r.replayed)
				}
			}
			wantCount(t, "upstream calls", up.calls.Load()-calls, 3)
		})
	}
}

// TestLiveBytesShared: tenant A's many long streams fill the live
// journals as far as its share lets them; tenant B's stream then runs to
// its clean end and is stored (where it used to be cut store_full, and
// its retry paid again), and A's next new stream is refused with 503
// capacity_exceeded before any upstream call.
func TestLiveBytesShared(t *testing.T) {
	t.Parallel()
	const chunk = 1000
	content := strings.Repeat("x", chunk)
	event := func(w http.ResponseWriter, finish string) {
		fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":%s}]}\n\n", content, finish)
		w.(http.Flusher).Flush()
	}
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	up := newFaultServer(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		if r.Header.Get("Authorization") == "Bearer sk-a" {
			for range 8 { // then a long pause
				event(w, "null")
			}
			select {
			case <-hold:
			case <-r.Context().Done():
			}
			return
		}
		for range 12 {
			event(w, "null")
		}
		event(w, `"stop"`)
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	pc := Config{Retry: RetryConfig{BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, AttemptTimeout: 30 * time.Second}, HeadTimeout: 5 * time.Second}
	e := newEnvUpstream(t, up.url, nil, pc, cache.Config{Limits: cache.Limits{MaxLiveBytes: 64 << 10, MaxLiveBytesPerTenant: 16 << 10}})

	// A opens streams, reading each until its 8 events are in, until one
	// is refused.
	var refused result
	for i := 0; refused.status == 0; i++ {
		if i == 8 {
			t.Fatalf("tenant A opened %d streams of 8 KB in 64 KB of live journals; want its new ones refused past its share", i)
		}
		calls := up.calls.Load()
		resp := e.do(req{key: newKey("a"), auth: "Bearer sk-a"})
		if resp.StatusCode != http.StatusOK {
			refused = parseResultBody(t, resp)
			wantCount(t, "upstream calls of the refused stream", up.calls.Load()-calls, 0)
			break
		}
		t.Cleanup(func() { resp.Body.Close() })
		br := bufio.NewReader(resp.Body)
		for n := 0; n < 8; {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("A's stream #%d: %v after %d events", i, err, n)
			}
			if strings.HasPrefix(line, "data: ") {
				n++
			}
		}
	}
	if refused.status != http.StatusServiceUnavailable || refused.errType != "capacity_exceeded" {
		t.Fatalf("A's stream past its share: got %d %s; want 503 capacity_exceeded", refused.status, refused.errType)
	}
	calls := up.calls.Load()
	b := req{key: newKey("b"), auth: "Bearer sk-b"}
	if r := e.fetch(b); !clean(r) || r.aborted {
		t.Fatalf("B's stream: got %d, aborted %v; want its clean end", r.status, r.aborted)
	}
	if r := e.fetch(b); !clean(r) || !r.replayed {
		t.Fatalf("B's stream again: got %d, replayed %v; want its stored replay", r.status, r.replayed)
	}
	if r := e.fetch(req{key: newKey("a"), auth: "Bearer sk-a"}); r.status != http.StatusServiceUnavailable || r.errType != "capacity_exceeded" {
		t.Fatalf("A's next stream: got %d %s; want 503 capacity_exceeded", r.status, r.errType)
	}
	wantCount(t, "upstream calls of B's stream, its replay and A's refused one", up.calls.Load()-calls, 1)
}

func parseResultBody(t *testing.T, resp *http.Response) result {
	t.Helper()
	defer resp.Body.Close()
	var sb strings.Builder
	_, err := bufio.NewReader(resp.Body).WriteTo(&sb)
	return parseResult(resp, []byte(sb.String()), err)
}

const joinBody = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Tell me a joke"}]}`

// TestWholeAnswerJoiners: clients that join a non-streaming generation
// count among its followers (-max-followers, here 2: the request that
// started it is none of them): a third joiner gets 503
// capacity_exceeded at once; one that closes its connection while it
// waits is noticed and gives back its place, which a later joiner takes;
// those still there get the one answer. One upstream call in all.
func TestWholeAnswerJoiners(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := newFaultServer(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	})
	pc := Config{Retry: RetryConfig{BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, AttemptTimeout: 30 * time.Second}, HeadTimeout: 30 * time.Second}
	e := newEnvUpstream(t, up.url, nil, pc, cache.Config{Limits: cache.Limits{MaxSubscribers: 2}})
	key := newKey("whole")
	addr := strings.TrimPrefix(e.url, "http://")
	send := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nAuthorization: Bearer sk-w\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			key, len(joinBody), joinBody)
		return c, bufio.NewReader(c)
	}
	// answer reads one answer within d; ok is false when none came.
	answer := func(c net.Conn, br *bufio.Reader, d time.Duration) (status int, body string, ok bool) {
		c.SetReadDeadline(time.Now().Add(d))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return 0, "", false
		}
		defer resp.Body.Close()
		var sb strings.Builder
		if _, err := bufio.NewReader(resp.Body).WriteTo(&sb); err != nil {
			return 0, "", false
		}
		return resp.StatusCode, sb.String(), true
	}
	waiting := func(name string, c net.Conn, br *bufio.Reader) {
		t.Helper()
		if st, body, ok := answer(c, br, 300*time.Millisecond); ok {
			t.Fatalf("%s: got %d %s before the answer; want it to wait", name, st, body)
		}
	}

	origin, originR := send()
	waitFor(t, func() bool { return up.calls.Load() == 1 })
	j1, j1R := send()
	waiting("first joiner", j1, j1R)
	j2, j2R := send()
	waiting("second joiner", j2, j2R)
	j3, j3R := send()
	if st, body, ok := answer(j3, j3R, 5*time.Second); !ok || st != http.StatusServiceUnavailable || !strings.Contains(body, "capacity_exceeded") {
		t.Fatalf("third joiner past -max-followers: got %d %s (answered %v); want 503 capacity_exceeded", st, body, ok)
	}
	j1.Close() // leaves: its place is given back
	var j4 net.Conn
	var j4R *bufio.Reader
	waitFor(t, func() bool {
		c, br := send()
		if st, _, ok := answer(c, br, 300*time.Millisecond); ok {
			if st != http.StatusServiceUnavailable {
				t.Fatalf("joiner after one left: got %d; want it to wait, or 503 until the departure is noticed", st)
			}
			c.Close()
			return false
		}
		j4, j4R = c, br
		return true
	})
	close(release)
	for name, cr := range map[string]struct {
		c  net.Conn
		br *bufio.Reader
	}{"origin": {origin, originR}, "second joiner": {j2, j2R}, "joiner that took the place": {j4, j4R}} {
		st, body, ok := answer(cr.c, cr.br, 10*time.Second)
		if !ok || st != http.StatusOK || !strings.Contains(body, `"content":"hi"`) {
			t.Errorf("%s: got %d %s (answered %v); want the one answer", name, st, body, ok)
		}
	}
	wantCount(t, "upstream calls", up.calls.Load(), 1)
}
