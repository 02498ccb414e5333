package proxy

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/ssegate/ssegate/cache"
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
	e := newEnv(t)
	conn := wsDial(t, e.url, "sk-a")
	ctx := context.Background()
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
}

func TestWSHandshakeRefused(t *testing.T) {
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
}

// A client socket dropped mid-turn does not stop the turn: it runs to its
// end upstream and is stored.
func TestWSClientDropStores(t *testing.T) {
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
	e.waitState(key, "Bearer sk-a", cache.StateCommitted)
	wantCount(t, "upstream generations", e.mock.WebSocketTurns(), 1)
}

// 16 concurrent re-sends of one keyed turn, each on its own socket and
// lane, cost one generation; each gets the whole turn under its own lane.
func TestWSConcurrentResends(t *testing.T) {
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
