package proxy

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/redistest"
	"github.com/tidwall/gjson"
)

// wsDial opens a Responses WebSocket through the proxy at base with the
// official client.
func wsDial(t *testing.T, base, apiKey string, opts ...option.RequestOption) *responses.ResponseConnection {
	t.Helper()
	cl := openai.NewClient(append([]option.RequestOption{option.WithBaseURL(base + "/v1/"), option.WithAPIKey(apiKey), option.WithMaxRetries(0)}, opts...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := cl.Responses.Connect(ctx, responses.ResponseConnectionOptions{})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(conn.Abort)
	return conn
}

// wsCreate is a response.create with input in, under key (none: "").
func wsCreate(in, key, lane string) responses.ResponsesClientEventResponseCreateParam {
	p := responses.ResponsesClientEventResponseCreateParam{
		Model: "gpt-test",
		Input: responses.ResponsesClientEventResponseCreateInputUnionParam{OfString: openai.String(in)},
	}
	if key != "" {
		p.Metadata = map[string]string{"ssegate_idempotency_key": key}
	}
	if lane != "" {
		p.StreamID = openai.String(lane)
	}
	return p
}

// wsTurnEvents reads one turn's events on conn: their types, the terminal
// included, or the error event that ended it.
func wsTurnEvents(t *testing.T, recv func(context.Context) (responses.ResponsesServerEventUnion, error)) (types []string, raw []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		ev, err := recv(ctx)
		if err != nil {
			t.Fatalf("recv after %v: %v", types, err)
		}
		types = append(types, ev.Type)
		raw = append(raw, ev.RawJSON())
		if wsTerminal(ev.Type) || ev.Type == "error" {
			return types, raw
		}
	}
}

// wantWholeTurn checks that types is a whole turn: response.created first,
// response.completed last, every event once.
func wantWholeTurn(t *testing.T, types []string, tokens int) {
	t.Helper()
	if len(types) != tokens+8 || types[0] != "response.created" || types[len(types)-1] != "response.completed" {
		t.Fatalf("turn events = %v; want %d events from response.created to response.completed", types, tokens+8)
	}
}

func TestWSRelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	conn := wsDial(t, e.url, "sk-a", option.WithHeader("OpenAI-Beta", "responses_websockets=2026-02-06"))
	ctx := context.Background()
	if beta, auth := e.mock.WebSocketHandshake(); beta != "responses_websockets=2026-02-06" || auth != "Bearer sk-a" {
		t.Errorf("upstream handshake: OpenAI-Beta %q, Authorization %q; want the client's", beta, auth)
	}
	for i := range 2 { // two turns on one socket, chained
		if err := conn.Create(ctx, wsCreate("hello", "", "")); err != nil {
			t.Fatal(err)
		}
		types, _ := wsTurnEvents(t, conn.Recv)
		wantWholeTurn(t, types, 16)
		wantCount(t, "mock websocket turns", e.mock.WebSocketTurns(), int64(i+1))
	}
	// Lanes: two turns side by side, each on its own lane.
	a, err := conn.Lane("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := conn.Lane("b")
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Create(ctx, wsCreate("one", "", "a")); err != nil {
		t.Fatal(err)
	}
	if err := conn.Create(ctx, wsCreate("two", "", "b")); err != nil {
		t.Fatal(err)
	}
	ta, _ := wsTurnEvents(t, a.Recv)
	tb, _ := wsTurnEvents(t, b.Recv)
	wantWholeTurn(t, ta, 16)
	wantWholeTurn(t, tb, 16)
	m := string(e.fetch(req{method: http.MethodGet, path: "/metrics"}).raw)
	for series, want := range map[string]float64{
		`ssegate_ws_connections`:                   1,
		`ssegate_ws_turns_total{decision="relay"}`: 4,
	} {
		if got := metricValue(t, m, series); got != want {
			t.Errorf("%s: got %v; want %v", series, got, want)
		}
	}
	// The upstream socket ends with its client.
	if got := e.mock.WebSocketConns(); got != 1 {
		t.Fatalf("upstream sockets: got %d; want 1 for the one client socket", got)
	}
	conn.Close() //nolint:errcheck // closing
	waitFor(t, func() bool { return e.mock.WebSocketConns() == 0 })
}

func TestWSHandshakeRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cl := openai.NewClient(option.WithBaseURL(e.url+"/v1/"), option.WithAPIKey("sk-a"), option.WithMaxRetries(0),
		option.WithHeader("X-Mock-WS-Status", "426"))
	_, err := cl.Responses.Connect(context.Background(), responses.ResponseConnectionOptions{})
	if err == nil || !strings.Contains(err.Error(), "got 426") {
		t.Fatalf("connect error = %v; want the upstream's 426", err)
	}
}

// A keyed turn whose client socket is cut mid-way, re-sent on a new
// socket, is delivered whole, once, from one upstream generation.
func TestWSKeyedResendNewSocket(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(20*time.Millisecond, 16))
	key := newKey("ws")
	first := wsDial(t, e.url, "sk-a")
	ctx := context.Background()
	if err := first.Create(ctx, wsCreate("hello", key, "")); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := first.Recv(ctx); err != nil {
			t.Fatal(err)
		}
	}
	first.Abort() // the client's socket drops mid-turn
	second := wsDial(t, e.url, "sk-a")
	if err := second.Create(ctx, wsCreate("hello", key, "")); err != nil {
		t.Fatal(err)
	}
	types, _ := wsTurnEvents(t, second.Recv)
	wantWholeTurn(t, types, 16)
	wantCount(t, "upstream generations", e.mock.WebSocketTurns(), 1)
	e.waitState(key, "Bearer sk-a", cache.StateCommitted)
	// GET /keys/{key} shows the key as a WebSocket turn, not a tool call.
	info := e.fetch(req{method: http.MethodGet, path: "/keys/" + key, auth: "Bearer sk-a"})
	if kind := gjson.GetBytes(info.raw, "kind").Str; kind != "websocket_turn" || gjson.GetBytes(info.raw, "tool").Exists() {
		t.Fatalf("GET /keys/{key}: %s; want kind websocket_turn and no tool", info.raw)
	}
	// Re-sent after its end: replayed from the store.
	if err := second.Create(ctx, wsCreate("hello", key, "")); err != nil {
		t.Fatal(err)
	}
	types, _ = wsTurnEvents(t, second.Recv)
	wantWholeTurn(t, types, 16)
	wantCount(t, "upstream generations", e.mock.WebSocketTurns(), 1)
	// Another body under the key: a conflict.
	if err := second.Create(ctx, wsCreate("other", key, "")); err != nil {
		t.Fatal(err)
	}
	_, raw := wsTurnEvents(t, second.Recv)
	if !strings.Contains(raw[0], `"idempotency_conflict"`) {
		t.Fatalf("got %s; want an idempotency_conflict error frame", raw[0])
	}
	// A turn's decision is counted once its frame is sent: the conflict's
	// may be counted just after the client read it.
	var m string
	waitFor(t, func() bool {
		m = string(e.fetch(req{method: http.MethodGet, path: "/metrics"}).raw)
		return strings.Contains(m, `ssegate_ws_turns_total{decision="conflict"} `)
	})
	for series, want := range map[string]float64{
		`ssegate_ws_turns_total{decision="miss"}`:     1,
		`ssegate_ws_turns_total{decision="join"}`:     1,
		`ssegate_ws_turns_total{decision="hit"}`:      1,
		`ssegate_ws_turns_total{decision="conflict"}`: 1,
		`ssegate_requests_total{decision="join"}`:     1,
	} {
		if got := metricValue(t, m, series); got != want {
			t.Errorf("%s: got %v; want %v", series, got, want)
		}
	}
}

// A client socket dropped mid-turn does not stop the turn: it runs to its
// end upstream and is stored.
func TestWSClientDropStores(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(10*time.Millisecond, 16))
	key := newKey("ws")
	conn := wsDial(t, e.url, "sk-a")
	if err := conn.Create(context.Background(), wsCreate("hello", key, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Recv(context.Background()); err != nil {
		t.Fatal(err)
	}
	conn.Abort()
	if got := e.mock.WebSocketConns(); got != 1 {
		t.Errorf("upstream sockets right after the client's dropped: got %d; want 1 until the keyed turn ends", got)
	}
	e.waitState(key, "Bearer sk-a", cache.StateCommitted)
	wantCount(t, "upstream generations", e.mock.WebSocketTurns(), 1)
	waitFor(t, func() bool { return e.mock.WebSocketConns() == 0 }) // then it closes
}

// 16 concurrent re-sends of one keyed turn, each on its own socket and
// lane, cost one generation; each gets the whole turn under its own lane.
func TestWSConcurrentResends(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(5*time.Millisecond, 16))
	key := newKey("ws")
	var wg sync.WaitGroup
	for i := range 16 {
		conn := wsDial(t, e.url, "sk-a")
		lane := "lane-" + string(rune('a'+i))
		l, err := conn.Lane(lane)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if err := conn.Create(context.Background(), wsCreate("hello", key, lane)); err != nil {
				t.Error(err)
				return
			}
			types, raw := wsTurnEvents(t, l.Recv)
			wantWholeTurn(t, types, 16)
			for _, r := range raw {
				if !strings.Contains(r, `"stream_id":"`+lane+`"`) {
					t.Errorf("frame %s; want stream_id %q", r, lane)
					return
				}
			}
		})
	}
	wg.Wait()
	wantCount(t, "upstream generations", e.mock.WebSocketTurns(), 1)
}

// The upstream socket dropped mid-turn: the turn is commit_unknown, its
// caller gets an error frame saying so, and a re-send is not sent again.
func TestWSUpstreamDrop(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mock.DropWebSocketAfter(6)
	key := newKey("ws")
	conn := wsDial(t, e.url, "sk-a")
	if err := conn.Create(context.Background(), wsCreate("hello", key, "")); err != nil {
		t.Fatal(err)
	}
	types, raw := wsTurnEvents(t, conn.Recv)
	if last := raw[len(raw)-1]; types[len(types)-1] != "error" || !strings.Contains(last, `"commit_unknown"`) {
		t.Fatalf("turn ended with %s; want a commit_unknown error frame", last)
	}
	e.waitState(key, "Bearer sk-a", cache.StateCommitUnknown)
	again := wsDial(t, e.url, "sk-a")
	if err := again.Create(context.Background(), wsCreate("hello", key, "")); err != nil {
		t.Fatal(err)
	}
	_, raw = wsTurnEvents(t, again.Recv)
	if !strings.Contains(raw[0], `"commit_unknown"`) {
		t.Fatalf("re-send got %s; want a commit_unknown error frame", raw[0])
	}
	wantCount(t, "upstream generations", e.mock.WebSocketTurns(), 1)
}

// Bad input: a binary frame, a frame that is not JSON, an unknown frame
// type and a response.create without a body each get an error frame, and
// the connection goes on to serve a turn; a frame past -ws-max-frame-bytes
// closes the connection with 1009.
func TestWSBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withConfig(func(c *Config) { c.WS.MaxFrameBytes = 4 << 10 }))
	u := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/responses"
	hdr := http.Header{"Authorization": {"Bearer sk-a"}}
	c, _, err := websocket.DefaultDialer.Dial(u, hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // a bound
	for _, f := range []struct {
		typ  int
		msg  string
		code string
	}{
		{websocket.BinaryMessage, `{"type":"response.create"}`, "invalid_frame"},
		{websocket.TextMessage, `not json`, "invalid_json"},
		{websocket.TextMessage, `{"type":"session.update"}`, "unknown_frame_type"},
		{websocket.TextMessage, `{"type":"response.create"}`, "empty_create"},
		{websocket.TextMessage, `{"type":"response.create","model":"m","metadata":{"ssegate_idempotency_key":"bad key\u0001"}}`, "invalid_idempotency_key"},
	} {
		if err := c.WriteMessage(f.typ, []byte(f.msg)); err != nil {
			t.Fatal(err)
		}
		_, got, err := c.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		if gjson.GetBytes(got, "type").String() != "error" || gjson.GetBytes(got, "error.code").String() != f.code {
			t.Errorf("%q got %s; want an error frame with code %s", f.msg, got, f.code)
		}
	}
	// The connection still serves a turn.
	if err := c.WriteMessage(websocket.TextMessage, []byte(`{"type":"response.create","model":"m","input":"hi"}`)); err != nil {
		t.Fatal(err)
	}
	for {
		_, got, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("turn after bad frames: %v", err)
		}
		if gjson.GetBytes(got, "type").String() == "response.completed" {
			break
		}
	}
	// A frame past the bound closes the connection with 1009.
	if err := c.WriteMessage(websocket.TextMessage, []byte(`{"type":"response.create","input":"`+strings.Repeat("x", 5<<10)+`"}`)); err != nil {
		t.Fatal(err)
	}
	_, _, err = c.ReadMessage()
	if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) {
		t.Fatalf("after a frame past -ws-max-frame-bytes: %v; want close 1009", err)
	}
}

// -ws-max-turns: the turn past it gets an error frame; -ws-max-conns: the
// connection past it gets 503.
func TestWSBounds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withConfig(func(c *Config) { c.WS.MaxTurns = 1; c.WS.MaxConns = 1 }))
	conn := wsDial(t, e.url, "sk-a")
	ctx := context.Background()
	if err := conn.Create(ctx, wsCreate("one", "", "")); err != nil {
		t.Fatal(err)
	}
	types, _ := wsTurnEvents(t, conn.Recv)
	wantWholeTurn(t, types, 16)
	if err := conn.Create(ctx, wsCreate("two", "", "")); err != nil {
		t.Fatal(err)
	}
	_, raw := wsTurnEvents(t, conn.Recv)
	if !strings.Contains(raw[0], `"max_turns"`) {
		t.Fatalf("turn past -ws-max-turns got %s; want a max_turns error frame", raw[0])
	}
	cl := openai.NewClient(option.WithBaseURL(e.url+"/v1/"), option.WithAPIKey("sk-a"), option.WithMaxRetries(0))
	_, err := cl.Responses.Connect(ctx, responses.ResponseConnectionOptions{})
	if err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("connection past -ws-max-conns: %v; want 503", err)
	}
}

// A keyed turn re-sent on the same socket while it runs joins it, on the
// re-send's lane; a turn's response id resumes over HTTP.
func TestWSJoinSameSocketAndHTTPResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(10*time.Millisecond, 16))
	key := newKey("ws")
	conn := wsDial(t, e.url, "sk-a")
	second, err := conn.Lane("again")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := conn.Create(ctx, wsCreate("hello", key, "")); err != nil {
		t.Fatal(err)
	}
	ev, err := conn.Recv(ctx)
	if err != nil || ev.Type != "response.created" {
		t.Fatalf("first event %v, %v; want response.created", ev.Type, err)
	}
	if err := conn.Create(ctx, wsCreate("hello", key, "again")); err != nil {
		t.Fatal(err)
	}
	joined, _ := wsTurnEvents(t, second.Recv)
	wantWholeTurn(t, joined, 16)
	rest, _ := wsTurnEvents(t, conn.Recv)
	wantWholeTurn(t, append([]string{ev.Type}, rest...), 16)
	wantCount(t, "upstream generations", e.mock.WebSocketTurns(), 1)
	e.waitState(key, "Bearer sk-a", cache.StateCommitted)
	// GET /v1/responses/{id}?stream=true&starting_after=N, as for an SSE turn.
	id := gjson.Get(ev.RawJSON(), "response.id").String()
	got := e.fetch(req{method: "GET", auth: "Bearer sk-a", path: "/v1/responses/" + id + "?stream=true&starting_after=20"})
	if got.status != 200 || len(got.events) != 3 || got.events[2].Type != "response.completed" {
		t.Fatalf("HTTP resume of %s: %d, %d events; want 200 with the 3 events after 20", id, got.status, len(got.events))
	}
	wantCount(t, "upstream generations", e.mock.Generations(), 1)
}

// -ws-dedupe-window keys an unkeyed turn by its tenant and body: an
// unmodified client's re-send after a drop joins the first.
func TestWSDedupeWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(10*time.Millisecond, 16), withConfig(func(c *Config) { c.WS.DedupeWindow = time.Minute }))
	first := wsDial(t, e.url, "sk-a")
	ctx := context.Background()
	if err := first.Create(ctx, wsCreate("hello", "", "")); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	first.Abort()
	second := wsDial(t, e.url, "sk-a")
	if err := second.Create(ctx, wsCreate("hello", "", "")); err != nil {
		t.Fatal(err)
	}
	types, _ := wsTurnEvents(t, second.Recv)
	wantWholeTurn(t, types, 16)
	// Another tenant's identical turn is its own.
	other := wsDial(t, e.url, "sk-b")
	if err := other.Create(ctx, wsCreate("hello", "", "")); err != nil {
		t.Fatal(err)
	}
	types, _ = wsTurnEvents(t, other.Recv)
	wantWholeTurn(t, types, 16)
	wantCount(t, "upstream generations", e.mock.WebSocketTurns(), 2)
}

// Two replicas sharing Redis: a keyed turn started on one and re-sent on
// the other joins it from the shared journal, with no generation on the
// second replica's upstream; after its end, the second replays it.
func TestWSTwoReplicasRedis(t *testing.T) {
	t.Parallel()
	var logs gatetest.LogBuffer
	addr, prefix := redistest.Shared(t), redistest.Prefix(t)
	secret := withConfig(func(c *Config) { c.Secret = []byte("ws-replicas-share-this-secret") })
	a, _ := replicaEnv(t, addr, prefix, &logs, slowMock(20*time.Millisecond, 16), secret)
	b, _ := replicaEnv(t, addr, prefix, &logs, secret)
	key := newKey("ws")
	ctx := context.Background()
	onA := wsDial(t, a.url, "sk-a")
	if err := onA.Create(ctx, wsCreate("hello", key, "")); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := onA.Recv(ctx); err != nil {
			t.Fatal(err)
		}
	}
	onA.Abort()
	onB := wsDial(t, b.url, "sk-a")
	if err := onB.Create(ctx, wsCreate("hello", key, "")); err != nil {
		t.Fatal(err)
	}
	types, _ := wsTurnEvents(t, onB.Recv)
	wantWholeTurn(t, types, 16)
	a.waitState(key, "Bearer sk-a", cache.StateCommitted)
	if err := onB.Create(ctx, wsCreate("hello", key, "")); err != nil {
		t.Fatal(err)
	}
	types, _ = wsTurnEvents(t, onB.Recv)
	wantWholeTurn(t, types, 16)
	wantCount(t, "generations on replica a's upstream", a.mock.WebSocketTurns(), 1)
	wantCount(t, "generations on replica b's upstream", b.mock.WebSocketTurns(), 0)
}

// -ws-idle-timeout closes a connection that sent nothing and runs no
// turn (1000); a drain closes one that runs no turn (1001).
func TestWSIdleAndDrain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withConfig(func(c *Config) { c.WS.IdleTimeout = 300 * time.Millisecond }))
	dial := func() *websocket.Conn {
		c, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(e.url, "http")+"/v1/responses",
			http.Header{"Authorization": {"Bearer sk-a"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // a bound
		return c
	}
	idle := dial()
	if _, _, err := idle.ReadMessage(); !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
		t.Fatalf("idle connection: %v; want close 1000", err)
	}
	e = newEnv(t) // idle far off: only the drain closes it
	draining := dial()
	e.proxy.Drain()
	if _, _, err := draining.ReadMessage(); !websocket.IsCloseError(err, websocket.CloseGoingAway) {
		t.Fatalf("connection at a drain: %v; want close 1001", err)
	}
}

// A keyed turn re-sent on the same socket and the same lane while it runs
// is a no-op: the caller already gets that turn's frames on that lane,
// each once (a re-send on another lane joins under its own, as
// TestWSJoinSameSocketAndHTTPResume shows). The next turn's frames follow
// the turn's end with nothing of the turn repeated.
func TestWSResendSameLane(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(10*time.Millisecond, 16))
	conn := wsDial(t, e.url, "sk-a")
	ctx := context.Background()
	for _, lane := range []string{"", "a"} {
		key := newKey("ws-same-lane")
		recv := conn.Recv
		if lane != "" {
			l, err := conn.Lane(lane)
			if err != nil {
				t.Fatal(err)
			}
			recv = l.Recv
		}
		if err := conn.Create(ctx, wsCreate("hello", key, lane)); err != nil {
			t.Fatal(err)
		}
		ev, err := recv(ctx)
		if err != nil || ev.Type != "response.created" {
			t.Fatalf("lane %q: first event %v, %v; want response.created", lane, ev.Type, err)
		}
		for range 2 { // re-sent while it runs, twice
			if err := conn.Create(ctx, wsCreate("hello", key, lane)); err != nil {
				t.Fatal(err)
			}
		}
		rest, _ := wsTurnEvents(t, recv)
		wantWholeTurn(t, append([]string{ev.Type}, rest...), 16)
		// The next turn on the lane: its own response.created comes next.
		if err := conn.Create(ctx, wsCreate("next", "", lane)); err != nil {
			t.Fatal(err)
		}
		next, _ := wsTurnEvents(t, recv)
		wantWholeTurn(t, next, 16)
	}
	wantCount(t, "upstream generations", e.mock.WebSocketTurns(), 4)
	m := string(e.fetch(req{method: http.MethodGet, path: "/metrics"}).raw)
	if got := metricValue(t, m, `ssegate_ws_turns_total{decision="duplicate"}`); got != 4 {
		t.Errorf(`ssegate_ws_turns_total{decision="duplicate"}: got %v; want 4`, got)
	}
}

// A WebSocket handshake fails over as an HTTP call that sent nothing
// does: with the first upstream down (its connection refused) or
// answering 503, the second takes the socket, and its turn runs there; a
// 4xx (426, 401) from the first is passed back, and the second never
// sees the handshake.
func TestWSFailover(t *testing.T) {
	t.Parallel()
	// Its connections are refused; its port stays held, so that no other
	// test's upstream takes it and counts these handshakes and turns.
	down, _ := refusedAddr(t)
	downURL := "http://" + down
	for _, c := range []struct {
		name   string
		status int // the first upstream's answer to the handshake; 0: it is down
		pass   bool
	}{
		{name: "refused", status: 0},
		{name: "503", status: http.StatusServiceUnavailable},
		{name: "426", status: http.StatusUpgradeRequired, pass: true},
		{name: "401", status: http.StatusUnauthorized, pass: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			first := downURL
			var firstCalls func() int64
			if c.status != 0 {
				fs := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(c.status)
					w.Write([]byte(`{"error":{"message":"no","type":"test"}}`)) //nolint:errcheck // the test's answer
				})
				first, firstCalls = fs.url, fs.calls.Load
			}
			mock, second := startMock(t, mockllm.Config{Tokens: 16})
			e := newEnvUpstream(t, second, mock, Config{Upstreams: []string{first, second},
				Retry: RetryConfig{BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}}, cache.Config{})
			cl := openai.NewClient(option.WithBaseURL(e.url+"/v1/"), option.WithAPIKey("sk-a"), option.WithMaxRetries(0))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			conn, err := cl.Responses.Connect(ctx, responses.ResponseConnectionOptions{})
			if c.pass {
				if err == nil || !strings.Contains(err.Error(), strconv.Itoa(c.status)) {
					t.Fatalf("connect: %v; want the first upstream's %d", err, c.status)
				}
				if _, auth := mock.WebSocketHandshake(); auth != "" {
					t.Fatalf("the second upstream saw a handshake (Authorization %q); want the %d passed back", auth, c.status)
				}
				wantCount(t, "handshakes at the first upstream", firstCalls(), 1)
				return
			}
			if err != nil {
				t.Fatalf("connect with the first upstream %s: %v; want the second to take the socket", c.name, err)
			}
			t.Cleanup(conn.Abort)
			if err := conn.Create(ctx, wsCreate("hello", newKey("ws-failover"), "")); err != nil {
				t.Fatal(err)
			}
			types, _ := wsTurnEvents(t, conn.Recv)
			wantWholeTurn(t, types, 16)
			wantCount(t, "turns at the second upstream", mock.WebSocketTurns(), 1)
			if firstCalls != nil {
				wantCount(t, "handshakes at the first upstream", firstCalls(), 1)
			}
		})
	}
	// The circuits: once the first upstream failed -breaker-failures
	// handshakes in a row, its circuit is open and the next handshake
	// goes straight to the second.
	t.Run("circuit", func(t *testing.T) {
		fs := newFaultServer(t, func(_ int64, w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		mock, second := startMock(t, mockllm.Config{Tokens: 16})
		e := newEnvUpstream(t, second, mock, Config{Upstreams: []string{fs.url, second},
			Retry: RetryConfig{BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, BreakerFailures: 2, BreakerOpen: time.Minute}}, cache.Config{})
		for i := range 3 {
			conn := wsDial(t, e.url, "sk-a")
			conn.Abort()
			if want := int64(min(i+1, 2)); fs.calls.Load() != want {
				t.Fatalf("handshake %d: the first upstream got %d; want %d", i+1, fs.calls.Load(), want)
			}
		}
	})
}
