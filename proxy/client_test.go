package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/sse"
)

// readPrefix reads raw lines until n events (ids) were seen, then closes.
func readPrefix(t *testing.T, resp *http.Response, n int) (lastID string) {
	t.Helper()
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	seen := 0
	for seen < n {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d events: %v", seen, err)
		}
		if id, ok := strings.CutPrefix(line, "id: "); ok {
			lastID = strings.TrimSpace(id)
			seen++
		}
	}
	return lastID
}

// TestResume: a client reads 20 of 80 events and drops; a resume by POST
// and one by GET /streams/{key} each get exactly events 21..80, from the
// live generation and from the committed one.
func TestResume(t *testing.T) {
	for _, live := range []bool{true, false} {
		t.Run(fmt.Sprintf("live=%v", live), func(t *testing.T) {
			// 78 tokens + role chunk + finish chunk = 80 data events, then [DONE].
			e := newEnv(t, slowMock(3*time.Millisecond, 78))
			key := newKey("resume")
			full := e.fetch(req{key: newKey("reference")})
			total := len(full.events)
			if total < 80 {
				t.Fatalf("reference stream has %d events; want at least 80", total)
			}
			last := readPrefix(t, e.do(req{key: key}), 20)
			id, err := sse.ParseID(last)
			if err != nil || id.Seq != 20 {
				t.Fatalf("20th id %q: got seq %d err %v; want 20", last, id.Seq, err)
			}
			if !live {
				e.waitState(key, "", cache.StateCommitted)
			}
			for _, r := range []req{
				{key: key, lastEventID: last},
				{method: http.MethodGet, path: "/streams/" + key, lastEventID: last},
			} {
				got := e.fetch(r)
				if got.status != 200 || !got.replayed {
					t.Fatalf("%s resume: got %d replayed %v; want 200 true", r.method, got.status, got.replayed)
				}
				if len(got.events) != total-20 {
					t.Fatalf("%s resume: got %d events; want %d", r.method, len(got.events), total-20)
				}
				for i, s := range got.ids {
					want := sse.ID{Gen: id.Gen, Seq: uint64(21 + i)}.String()
					if s != want {
						t.Fatalf("%s resume: event %d has id %q; want %q", r.method, i, s, want)
					}
					if got.events[i] != full.events[20+i] {
						t.Fatalf("%s resume: event %d differs from the reference", r.method, i)
					}
				}
			}
			e.wantCalls(2) // the reference and the resumed key
		})
	}
}

// TestResumeErrors: malformed ids, ids of an aborted or older generation,
// ids beyond the stream, unknown keys.
func TestResumeErrors(t *testing.T) {
	e := newEnv(t, slowMock(0, 10))
	key := newKey("resume-err")
	first := e.fetch(req{key: key})
	e.waitState(key, "", cache.StateCommitted)
	gen, _ := sse.ParseID(first.ids[0])

	aborted := newKey("resume-aborted")
	bad := e.fetch(req{key: aborted, header: map[string]string{"X-Mock-Fault": "eof-after=4"}})
	e.waitState(aborted, "", cache.StateFailedRetryable)

	cases := []struct {
		name   string
		r      req
		status int
		typ    string
	}{
		{"malformed id", req{key: key, lastEventID: "not-an-id"}, 400, "invalid_last_event_id"},
		{"malformed id GET", req{method: http.MethodGet, path: "/streams/" + key, lastEventID: "12"}, 400, "invalid_last_event_id"},
		{"beyond the stream", req{key: key, lastEventID: sse.ID{Gen: gen.Gen, Seq: 999}.String()}, 400, "invalid_last_event_id"},
		{"older generation", req{key: key, lastEventID: sse.ID{Gen: gen.Gen - 1, Seq: 1}.String()}, 410, "stream_gone"},
		{"aborted generation", req{key: aborted, lastEventID: bad.ids[2]}, 410, "stream_gone"},
		{"aborted generation GET", req{method: http.MethodGet, path: "/streams/" + aborted, lastEventID: bad.ids[2]}, 410, "stream_gone"},
		{"unknown key GET", req{method: http.MethodGet, path: "/streams/nope"}, 404, "stream_not_found"},
		{"unknown key POST", req{key: "nope", lastEventID: first.ids[0]}, 410, "stream_gone"},
		{"other request POST", req{key: key, lastEventID: first.ids[0], body: `{"other":true}`}, 422, "idempotency_conflict"},
	}
	before := e.calls()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := e.fetch(c.r)
			if got.status != c.status || got.errType != c.typ {
				t.Fatalf("got %d %q; want %d %q", got.status, got.errType, c.status, c.typ)
			}
		})
	}
	e.wantCalls(before)

	// Resuming from the last event of a finished stream: 204, so an
	// EventSource stops reconnecting.
	end := e.fetch(req{method: http.MethodGet, path: "/streams/" + key, lastEventID: first.ids[len(first.ids)-1]})
	if end.status != 204 {
		t.Fatalf("resume at the end: got %d; want 204", end.status)
	}

	// A path-escaped key reaches the same stream.
	odd := "a/b?c"
	e.fetch(req{key: odd})
	e.waitState(odd, "", cache.StateCommitted)
	got := e.fetch(req{method: http.MethodGet, path: "/streams/a%2Fb%3Fc"})
	if got.status != 200 || got.lastData() != "[DONE]" {
		t.Fatalf("escaped key: got %d last %q; want 200 [DONE]", got.status, got.lastData())
	}
}

// TestDisconnectDoesNotCancel: a client that drops after 3 events does not
// stop the generation; a repeat is a hit with the full stream.
func TestDisconnectDoesNotCancel(t *testing.T) {
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

// TestAborts: an upstream that fails mid-stream or ends uncleanly gives
// the client stream_aborted; nothing is stored; the next request
// regenerates and the one after it is a hit.
func TestAborts(t *testing.T) {
	cases := []struct{ name, fault, path, body string }{
		{"reset mid-stream", "reset-after=5", "", ""},
		{"EOF without end", "eof-after=5", "", ""},
		{"[DONE] after error", "error-after=5", "", ""},
		{"hang past idle timeout", "hang-after=3", "", ""},
		{"anthropic error event", "error-after=3", "/v1/messages", `{"model":"claude","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`},
		{"anthropic EOF", "eof-after=3", "/v1/messages", `{"model":"claude","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`},
		{"responses error", "error-after=3", "/v1/responses", `{"model":"gpt-4o","stream":true,"input":"hi"}`},
		{"responses EOF", "eof-after=3", "/v1/responses", `{"model":"gpt-4o","stream":true,"input":"hi"}`},
	}
	e := newEnv(t, slowMock(0, 20), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.UpstreamIdleTimeout = 300 * time.Millisecond
	})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.mock.ResetCalls()
			key := newKey("abort")
			bad := e.fetch(req{key: key, path: c.path, body: c.body, header: map[string]string{"X-Mock-Fault": c.fault}})
			if bad.status != 200 || !bad.aborted {
				t.Fatalf("got status %d, %d events, aborted %v, last %q; want 200 ending in stream_aborted", bad.status, len(bad.events), bad.aborted, bad.lastData())
			}
			ki := e.waitState(key, "", cache.StateFailedRetryable)
			if ki.BodyStored {
				t.Fatalf("an aborted stream was stored")
			}
			fresh := e.fetch(req{key: key, path: c.path, body: c.body})
			if fresh.replayed || fresh.aborted || fresh.status != 200 {
				t.Fatalf("next: got status %d replayed %v aborted %v; want a fresh clean stream", fresh.status, fresh.replayed, fresh.aborted)
			}
			e.waitState(key, "", cache.StateCommitted)
			hit := e.fetch(req{key: key, path: c.path, body: c.body})
			if !hit.replayed || string(eventBytes(hit.raw)) != string(eventBytes(fresh.raw)) {
				t.Fatalf("third: replayed %v, same as second %v; want a replay of the second", hit.replayed, string(hit.raw) == string(fresh.raw))
			}
			e.wantCalls(2)
		})
	}
}

// TestDialects: each dialect's clean stream through ssegate is committed
// and replayed; requests that ask for usage are held to it.
func TestDialects(t *testing.T) {
	e := newEnv(t, slowMock(0, 12))
	cases := []struct{ name, path, body, last string }{
		{"openai chat", "/v1/chat/completions", chatBody, "[DONE]"},
		{"openai chat with usage", "/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`, "[DONE]"},
		{"openai chat length", "/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":3,"messages":[]}`, "[DONE]"},
		{"openai responses", "/v1/responses", `{"model":"m","stream":true,"input":"hi"}`, "response.completed"},
		{"anthropic", "/v1/messages", `{"model":"claude","stream":true,"max_tokens":100,"messages":[]}`, "message_stop"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.mock.ResetCalls()
			key := newKey("dialect")
			first := e.fetch(req{key: key, path: c.path, body: c.body})
			if first.aborted || first.status != 200 {
				t.Fatalf("got %d aborted %v (%q); want a clean stream", first.status, first.aborted, first.lastData())
			}
			last := first.events[len(first.events)-1]
			if last.Data != c.last && last.Type != c.last {
				t.Fatalf("last event %q/%q; want %q", last.Type, last.Data, c.last)
			}
			e.waitState(key, "", cache.StateCommitted)
			second := e.fetch(req{key: key, path: c.path, body: c.body})
			if !second.replayed || string(second.raw) != string(first.raw) {
				t.Fatalf("replay differs or not flagged")
			}
			e.wantCalls(1)
		})
	}
}

// TestSlowSubscriberDropped: a joiner whose connection accepts nothing is
// dropped after -slow-client-timeout, and neither the generation nor a
// fast joiner waits for it.
func TestSlowSubscriberDropped(t *testing.T) {
	e := newEnv(t, slowMock(time.Millisecond, 1500), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.SlowClientTimeout = time.Second
	})
	key := newKey("slow")
	hdr := map[string]string{"X-Mock-Chunk-Bytes": "8000"} // ~12 MB in all: more than socket buffers hold
	start := time.Now()
	fast := e.do(req{key: key, header: hdr})
	// The slow client: a raw connection with a small receive buffer that
	// sends the same request and then reads nothing.
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nX-Mock-Chunk-Bytes: 8000\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(chatBody), chatBody)

	body, err := io.ReadAll(fast.Body)
	fast.Body.Close()
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := parseEvents(body)
	if n := len(evs); n != 1503 || evs[n-1].Data != "[DONE]" {
		t.Fatalf("fast client: got %d events; want 1503 ending [DONE]", n)
	}
	// 1,500 events at 1 ms: the fast client must not have waited for the
	// slow one's 1 s stalls, let alone its whole stream.
	if took > 8*time.Second {
		t.Fatalf("fast client took %v", took)
	}
	e.waitState(key, "", cache.StateCommitted)
	// The slow client now reads what it was sent: a prefix, then the end
	// of the connection, without the stream's end.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	slowRaw, _ := io.ReadAll(conn)
	if strings.Contains(string(slowRaw), "data: [DONE]") {
		t.Fatalf("slow client received the whole stream (%d bytes); want it dropped", len(slowRaw))
	}
	if !strings.Contains(string(slowRaw), "200 OK") {
		t.Fatalf("slow client got no answer head")
	}
	e.wantCalls(1)
}

// TestHeartbeat: an idle stream gets keep-alive comments, which are not
// part of the recorded stream.
func TestHeartbeat(t *testing.T) {
	e := newEnv(t, slowMock(120*time.Millisecond, 4), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.Heartbeat = 30 * time.Millisecond
	})
	key := newKey("hb")
	first := e.fetch(req{key: key})
	if !strings.Contains(string(first.raw), ": ping\n\n") {
		t.Fatalf("no keep-alive comment in a stream with 120 ms gaps and a 30 ms heartbeat")
	}
	e.waitState(key, "", cache.StateCommitted)
	replay := e.fetch(req{key: key})
	if strings.Contains(string(replay.raw), ": ping") {
		t.Fatalf("keep-alive comments were recorded")
	}
	if string(eventBytes(first.raw)) != string(replay.raw) {
		t.Fatalf("replay differs from the original's events")
	}
}

// TestMissingBody: when the body store no longer holds a committed body,
// a duplicate regenerates (the default, counted) or gets 410 (policy).
func TestMissingBody(t *testing.T) {
	for _, policy := range []cache.MissingBody{cache.Regenerate, cache.Refuse} {
		t.Run(fmt.Sprint(policy), func(t *testing.T) {
			e := newEnv(t, slowMock(0, 10), func(_ *Config, cc *cache.Config, _ *mockllm.Config) { cc.MissingBody = policy })
			key := newKey("evicted")
			e.fetch(req{key: key})
			e.waitState(key, "", cache.StateCommitted)
			e.store.DropBody(cache.Scope{Tenant: "anonymous", Key: key})
			got := e.fetch(req{key: key})
			if policy == cache.Regenerate {
				if got.status != 200 || got.replayed || got.lastData() != "[DONE]" {
					t.Fatalf("got %d replayed %v; want a fresh generation", got.status, got.replayed)
				}
				e.wantCalls(2)
			} else {
				if got.status != 410 || got.errType != "stream_gone" {
					t.Fatalf("got %d %q; want 410 stream_gone", got.status, got.errType)
				}
				e.wantCalls(1)
			}
			if s := e.store.Stats(); s.BodyMissing != 1 {
				t.Fatalf("BodyMissing: got %d; want 1", s.BodyMissing)
			}
		})
	}
	// A body the store refused outright (larger than the whole store).
	e := newEnv(t, slowMock(0, 10), func(_ *Config, cc *cache.Config, _ *mockllm.Config) { cc.MaxStoreBytes = 100 }) // less than one compressed body
	key := newKey("refused")
	e.fetch(req{key: key})
	ki := e.waitState(key, "", cache.StateCommitted)
	if ki.BodyStored {
		t.Fatalf("a body larger than the store is reported stored")
	}
	again := e.fetch(req{key: key})
	if again.replayed || again.status != 200 {
		t.Fatalf("got %d replayed %v; want a fresh generation", again.status, again.replayed)
	}
	e.wantCalls(2)
}

// TestStreamBound: a stream over the per-stream bound is aborted with a
// message naming the bound, and nothing is stored.
func TestStreamBound(t *testing.T) {
	e := newEnv(t, slowMock(0, 200), func(_ *Config, cc *cache.Config, _ *mockllm.Config) { cc.MaxStreamBytes = 8 << 10 })
	key := newKey("bound")
	got := e.fetch(req{key: key})
	if !got.aborted || !strings.Contains(got.lastData(), "max_stream_bytes") {
		t.Fatalf("got aborted %v last %q; want stream_aborted naming max_stream_bytes", got.aborted, got.lastData())
	}
	e.waitState(key, "", cache.StateFailedRetryable)
}

// TestStoredCompact: a committed stream is kept compressed: at most 0.35×
// its raw SSE bytes, for the mock's stream and for a recorded real one.
func TestStoredCompact(t *testing.T) {
	recorded, err := os.ReadFile("../sse/testdata/openai-chat-text.sse")
	if err != nil {
		t.Fatal(err)
	}
	fs := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write(recorded)
	})
	for _, c := range []struct {
		name     string
		upstream string
	}{{"mock, 200 tokens", ""}, {"recorded OpenAI stream", fs.url}} {
		t.Run(c.name, func(t *testing.T) {
			var e *env
			if c.upstream == "" {
				e = newEnv(t, slowMock(0, 200))
			} else {
				e = newEnvUpstream(t, c.upstream, nil, Config{}, cache.Config{})
			}
			key := newKey("compact")
			got := e.fetch(req{key: key})
			ki := e.waitState(key, "", cache.StateCommitted)
			stored := e.store.Stats().StoredBytes
			ratio := float64(stored) / float64(len(got.raw))
			t.Logf("raw %d bytes, stored %d bytes: %.3f×", len(got.raw), stored, ratio)
			if !ki.BodyStored || ratio > 0.35 {
				t.Fatalf("stored %d of %d raw bytes (%.3f×); want at most 0.35×", stored, len(got.raw), ratio)
			}
			if again := e.fetch(req{key: key}); !again.replayed || string(again.raw) != string(got.raw) {
				t.Fatalf("the replay of the compressed body differs from the original")
			}
		})
	}
}

// TestKeepAliveAfterStream: after a complete streamed answer the client's
// connection serves its next request, also when the client sent that
// request before reading the answer (pipelining), and after many streams.
func TestKeepAliveAfterStream(t *testing.T) {
	e := newEnv(t, slowMock(0, 3))
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(conn)
	request := func(key string) string {
		return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(chatBody), chatBody)
	}
	read := func() {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("reading an answer on the kept-alive connection: %v", err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.Contains(string(body), "data: [DONE]") {
			t.Fatalf("got %d %q (%v); want a whole stream", resp.StatusCode, body, err)
		}
	}
	for i := range 50 {
		fmt.Fprint(conn, request(fmt.Sprint("ka-", i)))
		read()
	}
	// Two requests at once: the second is already read by the server when
	// the first stream ends.
	fmt.Fprint(conn, request("ka-p1")+request("ka-p2"))
	read()
	read()
	e.wantCalls(52)
}

// throttled reads at most rate bytes per second on average.
type throttled struct {
	r     io.Reader
	rate  float64
	start time.Time
	n     int
}

func (t *throttled) Read(p []byte) (int, error) {
	if t.start.IsZero() {
		t.start = time.Now()
	}
	if len(p) > 8<<10 {
		p = p[:8<<10]
	}
	n, err := t.r.Read(p)
	t.n += n
	if ahead := time.Duration(float64(t.n)/t.rate*float64(time.Second)) - time.Since(t.start); ahead > 0 {
		time.Sleep(ahead)
	}
	return n, err
}

// TestSlowReaderGetsWholeReplay: "slow" means no progress for
// -slow-client-timeout, never "a big result". A client that reads a
// 10 MB replay steadily, at a pace that takes several times the bound,
// gets it whole in a correct chunked framing; one that stops reading is
// still dropped after about the bound.
func TestSlowReaderGetsWholeReplay(t *testing.T) {
	const slow = 500 * time.Millisecond
	e := newEnv(t, slowMock(0, 1250), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.SlowClientTimeout = slow
	})
	key := newKey("big")
	hdr := map[string]string{"X-Mock-Chunk-Bytes": "8000"} // ~10 MB in all
	first := e.fetch(req{key: key, header: hdr})
	if first.lastData() != "[DONE]" || len(first.raw) < 9<<20 {
		t.Fatalf("first: %d bytes, last %q; want about 10 MB ending [DONE]", len(first.raw), first.lastData())
	}
	e.waitState(key, "", cache.StateCommitted)
	dial := func() net.Conn { return dialSmall(t, e, key, chatBody) }

	t.Run("steady reader", func(t *testing.T) {
		conn := dial()
		defer conn.Close()
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		const rate = 3 << 20 // bytes/s: about 3.3 s for the whole, over six bounds
		start := time.Now()
		resp, err := http.ReadResponse(bufio.NewReader(&throttled{r: conn, rate: rate}), nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(resp.Body) // the chunked reader checks the framing
		took := time.Since(start)
		if err != nil {
			t.Fatalf("after %d bytes in %v: %v; want the whole replay", len(raw), took, err)
		}
		if resp.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(eventBytes(raw), eventBytes(first.raw)) {
			t.Fatalf("got %d bytes (replayed %q); want the %d bytes of the original", len(raw), resp.Header.Get("Idempotent-Replayed"), len(first.raw))
		}
		if took < 2*slow {
			t.Fatalf("read in %v; the reader must take longer than -slow-client-timeout (%v) for this to test anything", took, slow)
		}
		if n := testutil.ToFloat64(e.proxy.m.slowDropped); n != 0 {
			t.Fatalf("slow clients dropped: got %v; want 0", n)
		}
	})

	t.Run("stopped reader", func(t *testing.T) { wantDropped(t, e, dial, slow) })
	e.wantCalls(1)
}

// TestSlowReaderGetsWholeStoredBody: the same for a stored non-streaming
// body: written in pieces, each with its own -slow-client-timeout, so a
// steady reader slower than size/bound gets it whole and a reader that
// stops is dropped (before, fasthttp wrote it with no deadline at all, and
// a client that stopped reading held its connection forever).
func TestSlowReaderGetsWholeStoredBody(t *testing.T) {
	const slow = 500 * time.Millisecond
	e := newEnv(t, slowMock(0, 1250), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.SlowClientTimeout = slow
	})
	key := newKey("bigbody")
	const body = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Tell me a joke"}]}`
	hdr := map[string]string{"X-Mock-Chunk-Bytes": "8000"}
	first := e.fetch(req{key: key, body: body, header: hdr})
	if first.status != 200 || len(first.raw) < 4<<20 {
		t.Fatalf("first: %d, %d bytes; want 200 and several MB", first.status, len(first.raw))
	}
	e.waitState(key, "", cache.StateCommitted)
	dial := func() net.Conn { return dialSmall(t, e, key, body) }
	t.Run("steady reader", func(t *testing.T) {
		conn := dial()
		defer conn.Close()
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		rate := float64(len(first.raw)) / 3 // about 3 s for the whole: six bounds
		resp, err := http.ReadResponse(bufio.NewReader(&throttled{r: conn, rate: rate}), nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(resp.Body)
		if err != nil || !bytes.Equal(raw, first.raw) || resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("got %d of %d bytes, err %v, replayed %q; want the whole stored body", len(raw), len(first.raw), err, resp.Header.Get("Idempotent-Replayed"))
		}
	})
	t.Run("stopped reader", func(t *testing.T) { wantDropped(t, e, dial, slow) })
	e.wantCalls(1)
}

// dialSmall sends a keyed POST of body on a connection with a small
// receive buffer (set before any byte, so there is no window to fill).
func dialSmall(t *testing.T, e *env, key, body string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	conn.(*net.TCPConn).SetReadBuffer(16 << 10)
	request := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	return conn
}

// wantDropped: a client that reads nothing of its answer is dropped after
// about -slow-client-timeout (slow).
func wantDropped(t *testing.T, e *env, dial func() net.Conn, slow time.Duration) {
	t.Helper()
	before := testutil.ToFloat64(e.proxy.m.slowDropped)
	conn := dial()
	defer conn.Close()
	start := time.Now()
	waitFor(t, func() bool { return testutil.ToFloat64(e.proxy.m.slowDropped) > before })
	if took := time.Since(start); took < slow*7/8 || took > 4*slow {
		t.Fatalf("dropped after %v; want about -slow-client-timeout (%v)", took, slow)
	}
}
