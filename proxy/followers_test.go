package proxy

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mcpmock"
	"github.com/ssegate/ssegate/internal/mockllm"
)

// TestOriginHasItsPlace: with -max-followers 1, each of many keys gets
// its request and two identical non-streaming ones at once. Whichever
// claims the key is the origin: its place in the generation is taken
// before the upstream call goes out and is no follower's, so it is never
// refused, however fast the duplicates join. One of them follows, the
// other may be refused (503 capacity_exceeded: a joiner sent nothing
// upstream). Per key: exactly one answer that is the origin's (200, not
// replayed), and one upstream call.
func TestOriginHasItsPlace(t *testing.T) {
	t.Parallel()
	const keys, dups = 100, 2
	e := newEnv(t, slowMock(time.Millisecond, 16), func(_ *Config, cc *cache.Config, _ *mockllm.Config) {
		cc.MaxSubscribers = 1
	})
	fails := raceKeys(t, keys, dups, func(key string) (status int, replayed bool, errType string) {
		got := e.fetch(req{key: key, auth: "Bearer sk-order", body: joinBody})
		return got.status, got.replayed, got.errType
	})
	if len(fails) > 0 {
		t.Errorf("%d of %d keys: the origin had no place in its own generation; first: %s", len(fails), keys, fails[0])
	}
	wantCount(t, "upstream calls", e.calls(), keys)
}

// TestToolOriginHasItsPlace: TestOriginHasItsPlace for MCP tool calls:
// the caller whose tools/call claims the key has its place in the call
// before the call goes out; with -max-followers 1, concurrent re-issues
// never take it. The tool runs once per key.
func TestToolOriginHasItsPlace(t *testing.T) {
	t.Parallel()
	const keys, dups = 80, 4
	e := newMCPEnv(t, mcpmock.Config{Stateless: true, JSON: true}, func(pc *Config) {
		pc.Store = memoryStore(t, cache.Config{Limits: cache.Limits{MaxSubscribers: 1}})
	})
	var id sync.Mutex
	n := 0
	fails := raceKeys(t, keys, dups, func(key string) (status int, replayed bool, errType string) {
		id.Lock()
		n++
		callID := n
		id.Unlock()
		r := e.call(callBody(callID, "write", map[string]any{"target": key, "ms": 20}, nil), "Idempotency-Key", key)
		if len(r.messages) != 1 {
			return r.status, false, fmt.Sprintf("%d messages", len(r.messages))
		}
		m := r.messages[0]
		if r.status == http.StatusOK && (fmt.Sprint(m["id"]) != strconv.Itoa(callID) || m["result"] == nil) {
			return r.status, false, fmt.Sprintf("not the result under id %d: %v", callID, m)
		}
		if em, ok := m["error"].(map[string]any); ok {
			errType, _ = em["type"].(string)
		}
		return r.status, r.header.Get("Idempotent-Replayed") == "true", errType
	})
	if len(fails) > 0 {
		t.Errorf("%d of %d keys: the origin had no place in its own call; first: %s", len(fails), keys, fails[0])
	}
	for k := range keys {
		e.wantRuns(fmt.Sprintf("race-%d", k), 1)
	}
}

// raceKeys sends, for each of keys keys (race-0, race-1, ...; a few keys
// at a time), 1+dups identical requests at once through send, and
// returns what went wrong per key: not exactly one origin's answer (200,
// not replayed), or an answer that is neither a 200 nor the refusal of a
// joiner past -max-followers (503 capacity_exceeded).
func raceKeys(t *testing.T, keys, dups int, send func(key string) (status int, replayed bool, errType string)) (fails []string) {
	t.Helper()
	var mu sync.Mutex
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			key := fmt.Sprintf("race-%d", k)
			type answer struct {
				status   int
				replayed bool
				errType  string
			}
			answers := make([]answer, 1+dups)
			var each sync.WaitGroup
			for i := range answers {
				each.Add(1)
				go func() {
					defer each.Done()
					a := &answers[i]
					a.status, a.replayed, a.errType = send(key)
				}()
			}
			each.Wait()
			origins, bad := 0, ""
			for _, a := range answers {
				switch {
				case a.status == http.StatusOK && a.errType != "":
					bad = a.errType
				case a.status == http.StatusOK && !a.replayed:
					origins++
				case a.status == http.StatusOK:
				case a.status == http.StatusServiceUnavailable && a.errType == "capacity_exceeded":
				default:
					bad = fmt.Sprintf("an answer %d %q", a.status, a.errType)
				}
			}
			if origins != 1 || bad != "" {
				mu.Lock()
				fails = append(fails, fmt.Sprintf("key %s: got %d origin answers %s (answers %+v); want 1, and 200 or 503 capacity_exceeded for the rest",
					key, origins, bad, answers))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return fails
}

// TestStreamJoinersWaitingForHead: streaming requests that join a
// generation whose head has not come count among its followers
// (-max-followers 3 here, the origin not among them): the fourth gets 503
// capacity_exceeded at once. Joiners that hang up while they wait leave
// at once, well before -head-timeout (30 s): their goroutines and their
// sockets come back within two seconds, and their places are taken again.
// Once the head comes, the origin and the joiner still there get the one
// stream; one upstream call.
func TestStreamJoinersWaitingForHead(t *testing.T) {
	t.Parallel()
	const maxFollowers = 3
	goroutines := ownGoroutines(t) // before the servers: their goroutines are the test's
	release := make(chan struct{})
	up := newFaultServer(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		okStream(w)
	})
	pc := Config{Retry: RetryConfig{BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, AttemptTimeout: 30 * time.Second}, HeadTimeout: 30 * time.Second}
	e := newEnvUpstream(t, up.url, nil, pc, cache.Config{Limits: cache.Limits{MaxSubscribers: maxFollowers}})
	key := newKey("head-wait")
	addr := strings.TrimPrefix(e.url, "http://")
	_, port, _ := net.SplitHostPort(addr)
	send := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nAuthorization: Bearer sk-h\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			key, len(chatBody), chatBody)
		return c, bufio.NewReader(c)
	}
	// answer reads one answer's head and body within d; ok is false when
	// none came.
	answer := func(c net.Conn, br *bufio.Reader, d time.Duration) (status int, body string, ok bool) {
		c.SetReadDeadline(time.Now().Add(d))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return 0, "", false
		}
		defer resp.Body.Close()
		var sb strings.Builder
		if _, err := bufio.NewReader(resp.Body).WriteTo(&sb); err != nil {
			return resp.StatusCode, sb.String(), false
		}
		return resp.StatusCode, sb.String(), true
	}
	// refused reports whether a new joiner is refused at once (503
	// capacity_exceeded); one that is not, but waits, is closed.
	refused := func() bool {
		c, br := send()
		st, body, ok := answer(c, br, 300*time.Millisecond)
		c.Close()
		if ok && (st != http.StatusServiceUnavailable || !strings.Contains(body, "capacity_exceeded")) {
			t.Fatalf("joiner: got %d %s; want it to wait, or 503 capacity_exceeded", st, body)
		}
		return ok
	}

	origin, originR := send()
	waitFor(t, func() bool { return up.calls.Load() == 1 })
	_, stacks := goroutines()
	before, sockets := busyGoroutines(stacks), proxySockets(t, port)

	joiners := make([]net.Conn, maxFollowers)
	for i := range joiners {
		joiners[i], _ = send()
	}
	// Each one's place is taken as its request is decided, before it
	// waits for the head: once all of them wait, they are counted. A
	// probe sent before that could take a place, and a joiner come after
	// it be refused in its stead.
	if !within(10*time.Second, func() bool {
		_, stacks := goroutines()
		return waitingForFlight(stacks) == maxFollowers
	}) {
		_, stacks := goroutines()
		t.Fatalf("%d of %d joiners waiting for the head after 10s; want all\n%s", waitingForFlight(stacks), maxFollowers, stacks)
	}
	// A joiner past the bound is refused.
	if !within(10*time.Second, refused) {
		t.Fatalf("a joiner past -max-followers %d, with %d streaming joiners waiting for the head: never refused within 10s; want 503 capacity_exceeded",
			maxFollowers, maxFollowers)
	}
	left := time.Now()
	for _, c := range joiners {
		c.Close()
	}
	if !within(2*time.Second, func() bool {
		_, stacks := goroutines()
		return busyGoroutines(stacks) <= before && proxySockets(t, port) <= sockets
	}) {
		_, stacks := goroutines()
		t.Fatalf("%v after %d waiting joiners hung up: %d goroutines running ssegate's code, %d sockets of the proxy's; want at most %d and %d, as before they came (the head timeout is 30s)\n%s",
			time.Since(left), maxFollowers, busyGoroutines(stacks), proxySockets(t, port), before, sockets, stacks)
	}
	// Their places are free again: a new joiner waits.
	late, lateR := send()
	if st, body, ok := answer(late, lateR, 300*time.Millisecond); ok {
		t.Fatalf("joiner after the others left: got %d %s; want it to wait for the head", st, body)
	}
	late.SetReadDeadline(time.Time{})
	close(release)
	for name, cr := range map[string]struct {
		c  net.Conn
		br *bufio.Reader
	}{"origin": {origin, originR}, "late joiner": {late, lateR}} {
		cr.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(cr.br, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := parseResultBody(t, resp)
		if !clean(got) || len(got.events) != okEvents+2 {
			t.Errorf("%s: got %d, %d events ending %q; want the whole stream", name, got.status, len(got.events), got.lastData())
		}
	}
	wantCount(t, "upstream calls", up.calls.Load(), 1)
}

// waitingForFlight counts the goroutines in stacks (ownGoroutines') of
// clients that wait for a flight they joined (Proxy.waitFlight).
func waitingForFlight(stacks string) (n int) {
	for _, group := range strings.Split(stacks, "\n\n") {
		if !strings.Contains(group, "(*Proxy).waitFlight") { // inlined, under its caller's name
			continue
		}
		count, _, _ := strings.Cut(group, " @ ")
		c, _ := strconv.Atoi(count)
		n += c
	}
	return n
}

// proxySockets counts the TCP sockets on local port port (the proxy's
// listener and its accepted connections) that are not closed yet:
// established, or closed by the peer and not yet by the proxy
// (CLOSE_WAIT), as /proc/net/tcp lists them.
func proxySockets(t *testing.T, port string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp to count sockets: %v", err)
	}
	p, _ := strconv.Atoi(port)
	local := fmt.Sprintf(":%04X", p)
	n := 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasSuffix(f[1], local) {
			continue
		}
		if st := f[3]; st == "01" || st == "08" { // ESTABLISHED, CLOSE_WAIT
			n++
		}
	}
	return n
}
