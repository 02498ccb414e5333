package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/redistest"
	"github.com/tidwall/gjson"
)

// A long Responses stream: long enough that only a stop ends it while a
// test looks.
const stopBody = `{"model":"gpt-4o-mini","stream":true,"input":"Tell me a long story"}`

// liveClient is a client of a keyed stream, read in the background: done
// is closed with res, the whole answer, once the stream ended.
type liveClient struct {
	res  result
	done chan struct{}
}

// startClient sends r and reads its answer in the background, once its
// first event came (so that the generation is known to run, and, for a
// Responses stream, its id to name it).
func startClient(t *testing.T, e *env, r req) (*liveClient, string) {
	t.Helper()
	resp := e.do(r)
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("%s %s: got %d; want 200", r.method, r.path, resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	var head strings.Builder
	for seen := false; !seen; {
		line, err := br.ReadString('\n')
		if err != nil {
			resp.Body.Close()
			t.Fatalf("before the first delta: %v (%q)", err, head.String())
		}
		head.WriteString(line)
		if strings.Contains(line, `"response.output_text.delta"`) || strings.Contains(line, `"delta"`) {
			seen = true
		}
	}
	id := gjson.Get(dataOf(head.String(), "response.created"), "response.id").Str
	c := &liveClient{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer resp.Body.Close()
		rest, err := io.ReadAll(br)
		c.res = parseResult(resp, append([]byte(head.String()), rest...), err)
	}()
	return c, id
}

// dataOf is the data of the event of type typ in raw, or "".
func dataOf(raw, typ string) string {
	for _, block := range strings.Split(raw, "\n\n") {
		if strings.Contains(block, "event: "+typ+"\n") {
			for _, line := range strings.Split(block, "\n") {
				if d, ok := strings.CutPrefix(line, "data: "); ok {
					return d
				}
			}
		}
	}
	return ""
}

// wantCancelled checks that c's stream ended with stream_aborted, code
// cancelled, within 5 s.
func wantCancelled(t *testing.T, who string, c *liveClient) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the stream did not end within 5s of the stop", who)
	}
	n := len(c.res.events)
	if !c.res.aborted || gjson.Get(c.res.events[n-1].Data, "error.code").Str != "cancelled" {
		last := ""
		if n > 0 {
			last = c.res.events[n-1].Data
		}
		t.Fatalf("%s: got %d events ending %q (aborted %v); want stream_aborted with code cancelled", who, n, last, c.res.aborted)
	}
	for _, ev := range c.res.events {
		if ev.Type == "response.completed" {
			t.Fatalf("%s: got response.completed; want the stream cut", who)
		}
	}
}

// wantUpstreamStops checks that the upstream stops writing the stream
// within a second of the stop.
func wantUpstreamStops(t *testing.T, e *env, stopped time.Time) {
	t.Helper()
	if !within(time.Second-time.Since(stopped), func() bool { return e.mock.Active() == 0 }) {
		t.Fatalf("the upstream still writes %d streams a second after the stop", e.mock.Active())
	}
	t.Logf("upstream stream ended %v after the stop was sent", time.Since(stopped).Round(time.Millisecond))
}

// cancelAs is openai-go's client.Responses.Cancel(ctx, id) through e
// with credential key.
func cancelAs(e *env, key string, ctx context.Context, id string) (*responses.Response, error) {
	c := responsesClient(e, key)
	return c.Responses.Cancel(ctx, id)
}

// statusOf is what a failed check of a cancel says of its answer.
func statusOf(r *responses.Response) string {
	if r == nil {
		return "no response"
	}
	return "status " + string(r.Status) + " " + r.RawJSON()
}

// keyState reads GET /keys/{key} on e.
func keyState(t *testing.T, e *env, key, auth string) string {
	t.Helper()
	r := e.fetch(req{method: http.MethodGet, path: "/keys/" + key, auth: auth})
	if r.status != http.StatusOK {
		t.Fatalf("GET /keys/%s: got %d %s", key, r.status, r.raw)
	}
	return gjson.GetBytes(r.raw, "state").Str
}

// TestStopResponsesCancel: openai-go's Responses.Cancel of a keyed
// Responses stream's id, in memory. Another tenant's cancel of the id is
// 404 and leaves the stream running; the tenant's own ends the upstream
// call within a second, the client that made the stream and one that
// joined it get stream_aborted with code cancelled, nothing is stored,
// and GET /keys/{key} says cancelled. A repeat of the key is refused
// (409 stream_cancelled) with no second upstream call; a second cancel
// answers cancelled again; an unknown id, and an unkeyed stream's, is 404
// stream_not_found, not relayed upstream.
func TestStopResponsesCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(20*time.Millisecond, 2000))
	key := newKey("stop-responses")
	origin, id := startClient(t, e, req{path: "/v1/responses", key: key, auth: "Bearer sk-one", body: stopBody})
	if !strings.HasPrefix(id, "resp_") {
		t.Fatalf("response id: got %q", id)
	}
	joiner, _ := startClient(t, e, req{path: "/v1/responses", key: key, auth: "Bearer sk-one", body: stopBody})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	_, err := cancelAs(e, "sk-two", ctx, id)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("another tenant's cancel: got %v; want 404", err)
	}
	if st := keyState(t, e, key, "Bearer sk-one"); st != string(cache.StateExecutionStarted) || e.mock.Active() != 1 {
		t.Fatalf("after another tenant's cancel: state %s, %d upstream streams; want execution_started, 1", st, e.mock.Active())
	}

	stopped := time.Now()
	r, err := cancelAs(e, "sk-one", ctx, id)
	if err != nil || r.ID != id || r.Status != responses.ResponseStatusCancelled {
		t.Fatalf("cancel: got %v, %s; want the response, cancelled", err, statusOf(r))
	}
	wantUpstreamStops(t, e, stopped)
	wantCancelled(t, "the stream's own client", origin)
	wantCancelled(t, "a client that joined", joiner)
	if st := keyState(t, e, key, "Bearer sk-one"); st != string(cache.StateCancelled) {
		t.Fatalf("GET /keys/{key}: state %s; want cancelled", st)
	}
	// Held as long as an answer would be (-ttl), not a failed key's minutes.
	info := e.fetch(req{method: http.MethodGet, path: "/keys/" + key, auth: "Bearer sk-one"})
	expires, _ := time.Parse(time.RFC3339Nano, gjson.GetBytes(info.raw, "expires").Str)
	if until := time.Until(expires); until < time.Hour {
		t.Fatalf("the cancelled key expires in %v; want it held for -ttl", until)
	}

	again := e.fetch(req{path: "/v1/responses", key: key, auth: "Bearer sk-one", body: stopBody})
	if again.status != http.StatusConflict || again.errType != "stream_cancelled" {
		t.Fatalf("repeat of the key: got %d %q; want 409 stream_cancelled", again.status, again.errType)
	}
	if r, err := cancelAs(e, "sk-one", ctx, id); err != nil || r.Status != responses.ResponseStatusCancelled {
		t.Fatalf("second cancel: got %v, %s; want cancelled again", err, statusOf(r))
	}
	_, err = cancelAs(e, "sk-one", ctx, "resp_unknown")
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Type != "stream_not_found" {
		t.Fatalf("cancel of an unknown id: got %v; want 404 stream_not_found", err)
	}
	e.wantCalls(1)
	// An unkeyed stream's id names nothing ssegate holds: 404, not relayed.
	unkeyed := e.fetch(req{path: "/v1/responses", auth: "Bearer sk-one", body: stopBody, header: map[string]string{"X-Mock-Tokens": "2"}})
	uid := gjson.Get(unkeyed.events[0].Data, "response.id").Str
	if r := e.fetch(req{path: "/v1/responses/" + uid + "/cancel", auth: "Bearer sk-one", body: "{}"}); r.status != http.StatusNotFound || r.errType != "stream_not_found" {
		t.Fatalf("cancel of an unkeyed stream's id %q: got %d %q; want 404 stream_not_found", uid, r.status, r.errType)
	}
	e.wantCalls(2)
	if r := e.fetch(req{method: http.MethodGet, path: "/streams/" + key, auth: "Bearer sk-one"}); r.status == http.StatusOK && !r.aborted {
		t.Fatalf("GET /streams/{key} after the stop: got a stream %d; want no stored answer", r.status)
	}
	scrape := e.fetch(req{method: http.MethodGet, path: "/metrics"})
	if v := metricValue(t, string(scrape.raw), `ssegate_stops_total{result="stopped"}`); v != 2 {
		t.Errorf("ssegate_stops_total{result=stopped}: got %v; want 2", v)
	}
	if v := metricValue(t, string(scrape.raw), `ssegate_stops_total{result="not_found"}`); v != 3 {
		t.Errorf("ssegate_stops_total{result=not_found}: got %v; want 3", v)
	}
}

// TestStopStreamDelete: DELETE /streams/{key}, as curl sends it, of a
// keyed chat stream, in memory: another tenant's is 404 stream_not_found
// and the stream runs on; the tenant's answers 200 with the key's info,
// cancelled, the upstream call ends within a second and the client gets
// stream_aborted code cancelled. An unknown key is 404; a key whose
// stream ended committed is 409 stream_ended, its answer kept.
func TestStopStreamDelete(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(20*time.Millisecond, 2000))
	key := newKey("stop-delete")
	client, _ := startClient(t, e, req{key: key, auth: "Bearer sk-one"})

	other := e.fetch(req{method: http.MethodDelete, path: "/streams/" + key, auth: "Bearer sk-two"})
	if other.status != http.StatusNotFound || other.errType != "stream_not_found" {
		t.Fatalf("another tenant's DELETE: got %d %q; want 404 stream_not_found", other.status, other.errType)
	}
	if e.mock.Active() != 1 {
		t.Fatalf("after another tenant's DELETE: %d upstream streams; want 1", e.mock.Active())
	}
	stopped := time.Now()
	r := e.fetch(req{method: http.MethodDelete, path: "/streams/" + key, auth: "Bearer sk-one"})
	if r.status != http.StatusOK || gjson.GetBytes(r.raw, "state").Str != "cancelled" || gjson.GetBytes(r.raw, "key").Str != key {
		t.Fatalf("DELETE: got %d %s; want 200 with the key's info, cancelled", r.status, r.raw)
	}
	wantUpstreamStops(t, e, stopped)
	wantCancelled(t, "the client", client)
	e.waitState(key, "Bearer sk-one", cache.StateCancelled)

	if r := e.fetch(req{method: http.MethodDelete, path: "/streams/no-such-key", auth: "Bearer sk-one"}); r.status != http.StatusNotFound || r.errType != "stream_not_found" {
		t.Fatalf("DELETE of an unknown key: got %d %q; want 404 stream_not_found", r.status, r.errType)
	}
	short := newKey("stop-ended")
	if r := e.fetch(req{key: short, auth: "Bearer sk-one", header: map[string]string{"X-Mock-Tokens": "2"}}); !clean(r) {
		t.Fatalf("short stream: got %d; want it whole", r.status)
	}
	e.waitState(short, "Bearer sk-one", cache.StateCommitted)
	if r := e.fetch(req{method: http.MethodDelete, path: "/streams/" + short, auth: "Bearer sk-one"}); r.status != http.StatusConflict || r.errType != "stream_ended" {
		t.Fatalf("DELETE of an ended stream: got %d %q %s; want 409 stream_ended", r.status, r.errType, r.raw)
	}
	e.waitState(short, "Bearer sk-one", cache.StateCommitted)
	e.wantCalls(2)
	// DELETE /keys/{key} frees a cancelled key: a repeat then runs.
	if r := e.fetch(req{method: http.MethodDelete, path: "/keys/" + key, auth: "Bearer sk-one"}); r.status != http.StatusNoContent {
		t.Fatalf("DELETE /keys/{key} of the cancelled key: got %d; want 204", r.status)
	}
	if r := e.fetch(req{key: key, auth: "Bearer sk-one", header: map[string]string{"X-Mock-Tokens": "2"}}); r.status != http.StatusOK {
		t.Fatalf("repeat after DELETE /keys/{key}: got %d; want a new generation", r.status)
	}
	e.wantCalls(3)
}

// TestStopRedisReplicas: two replicas on Redis. A keyed Responses stream
// runs on one (its owner), a client follows it on the other; the stop
// comes to the replica that does not own the flight, from openai-go's
// Responses.Cancel: the owner is told through Redis, its upstream call
// ends within a second, the owner's client and the other replica's
// follower both get stream_aborted code cancelled, the key is cancelled
// in Redis, and a repeat of the key on either replica is refused with no
// second upstream call. Another tenant's DELETE /streams/{key} on the
// other replica is 404 and leaves the stream running; a second stream is
// stopped by DELETE /streams/{key} there.
func TestStopRedisReplicas(t *testing.T) {
	t.Parallel()
	var logs gatetest.LogBuffer
	prefix := redistest.Prefix(t)
	addr := redistest.Shared(t)
	// The replicas of one deployment share the secret that names tenants.
	shared := withConfig(func(pc *Config) { pc.Secret = []byte("a secret the replicas share") })
	a, _ := replicaEnv(t, addr, prefix, &logs, shared, slowMock(20*time.Millisecond, 2000))
	b, _ := replicaEnv(t, addr, prefix, &logs, shared, slowMock(20*time.Millisecond, 2000))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	key := newKey("stop-redis")
	origin, id := startClient(t, a, req{path: "/v1/responses", key: key, auth: "Bearer sk-one", body: stopBody})
	follower, _ := startClient(t, b, req{method: http.MethodGet, path: "/streams/" + key, auth: "Bearer sk-one"})
	if r := b.fetch(req{method: http.MethodDelete, path: "/streams/" + key, auth: "Bearer sk-two"}); r.status != http.StatusNotFound {
		t.Fatalf("another tenant's DELETE on the other replica: got %d; want 404", r.status)
	}
	if st := keyState(t, b, key, "Bearer sk-one"); st != string(cache.StateExecutionStarted) || a.mock.Active() != 1 {
		t.Fatalf("after another tenant's stop: state %s, %d upstream streams; want execution_started, 1", st, a.mock.Active())
	}
	stopped := time.Now()
	r, err := cancelAs(b, "sk-one", ctx, id)
	if err != nil || r.Status != responses.ResponseStatusCancelled {
		t.Fatalf("cancel on the other replica: got %v, %s; want cancelled", err, statusOf(r))
	}
	wantUpstreamStops(t, a, stopped)
	wantCancelled(t, "the owner replica's client", origin)
	wantCancelled(t, "the other replica's follower", follower)
	a.waitState(key, "Bearer sk-one", cache.StateCancelled)
	for name, e := range map[string]*env{"owner": a, "other": b} {
		if r := e.fetch(req{path: "/v1/responses", key: key, auth: "Bearer sk-one", body: stopBody}); r.status != http.StatusConflict || r.errType != "stream_cancelled" {
			t.Fatalf("repeat on the %s replica: got %d %q; want 409 stream_cancelled", name, r.status, r.errType)
		}
	}
	wantCount(t, "upstream calls", a.calls()+b.calls(), 1)

	second := newKey("stop-redis-delete")
	client, _ := startClient(t, a, req{key: second, auth: "Bearer sk-one"})
	stopped = time.Now()
	d := b.fetch(req{method: http.MethodDelete, path: "/streams/" + second, auth: "Bearer sk-one"})
	if d.status != http.StatusOK || gjson.GetBytes(d.raw, "state").Str != "cancelled" {
		t.Fatalf("DELETE on the other replica: got %d %s; want 200, cancelled", d.status, d.raw)
	}
	wantUpstreamStops(t, a, stopped)
	wantCancelled(t, "the second stream's client", client)
	wantCount(t, "upstream calls", a.calls()+b.calls(), 2)
}

// TestStopBackgroundResponse: a background Responses stream runs on at
// the provider when its connection closes, so a stop of it also sends
// the provider POST /v1/responses/{id}/cancel, with the stream's
// credential: the upstream gets it within a second of the stop, and the
// stream's client gets stream_aborted code cancelled.
func TestStopBackgroundResponse(t *testing.T) {
	t.Parallel()
	cancelled := make(chan string, 1)
	up := newFaultServer(t, func(_ int64, w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/responses/resp_bg/cancel" {
			cancelled <- r.Header.Get("Authorization")
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"resp_bg","object":"response","status":"cancelled"}`) //nolint:errcheck
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		io.WriteString(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_bg\",\"status\":\"queued\",\"background\":true},\"sequence_number\":0}\n\n") //nolint:errcheck
		for seq := 1; ; seq++ {
			if _, err := io.WriteString(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\",\"sequence_number\":"+strconv.Itoa(seq)+"}\n\n"); err != nil {
				return
			}
			fl.Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	e := retryEnv(t, []string{up.url}, nil)
	key := newKey("stop-background")
	client, id := startClient(t, e, req{path: "/v1/responses", key: key, auth: "Bearer sk-bg",
		body: `{"model":"gpt-4o","input":"hi","stream":true,"background":true}`})
	if id != "resp_bg" {
		t.Fatalf("response id: got %q; want resp_bg", id)
	}
	stopped := time.Now()
	r, err := cancelAs(e, "sk-bg", context.Background(), id)
	if err != nil || r.Status != responses.ResponseStatusCancelled {
		t.Fatalf("cancel: got %v, %s; want cancelled", err, statusOf(r))
	}
	select {
	case auth := <-cancelled:
		if auth != "Bearer sk-bg" {
			t.Fatalf("the upstream's cancel carried Authorization %q; want the stream's", auth)
		}
		t.Logf("upstream cancel %v after the stop", time.Since(stopped).Round(time.Millisecond))
	case <-time.After(time.Second - time.Since(stopped)):
		t.Fatal("the upstream got no cancel of the background response within a second of the stop")
	}
	wantCancelled(t, "the client", client)
	e.waitState(key, "Bearer sk-bg", cache.StateCancelled)
}

// TestStopWebSocketTurn: a keyed WebSocket turn is a keyed stream like
// any other: DELETE /streams/{key} stops it, its caller gets the error
// event with code cancelled, the key is cancelled, and a re-send of the
// turn gets the stream_cancelled error, with no second generation. The
// turn was the only one on its upstream socket, so that socket is closed
// within a second of the stop, which ends the provider's generation (the
// protocol has no cancel of a turn): the mock's turn is cut by the close.
// The client's socket then closes with 1000, and the client sends its next
// turn on a new one.
func TestStopWebSocketTurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(20*time.Millisecond, 2000))
	key := newKey("stop-ws")
	conn := wsDial(t, e.url, "sk-a")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := conn.Create(ctx, wsCreate("hello", key, "")); err != nil {
		t.Fatal(err)
	}
	for n := 0; n < 4; n++ { // into the turn's output
		if _, err := conn.Recv(ctx); err != nil {
			t.Fatal(err)
		}
	}
	stopped := time.Now()
	r := e.fetch(req{method: http.MethodDelete, path: "/streams/" + key, auth: "Bearer sk-a"})
	if r.status != http.StatusOK || gjson.GetBytes(r.raw, "state").Str != "cancelled" {
		t.Fatalf("DELETE: got %d %s; want 200, cancelled", r.status, r.raw)
	}
	wantWSUpstreamStops(t, e, stopped, 1)
	types, raw := wsTurnEvents(t, conn.Recv)
	if types[len(types)-1] != "error" || !strings.Contains(raw[len(raw)-1], "cancelled") {
		t.Fatalf("the turn's end: got %v, last %s; want an error event with code cancelled", types[len(types)-1], raw[len(raw)-1])
	}
	if _, err := conn.Recv(ctx); err == nil || !strings.Contains(err.Error(), "StatusNormalClosure") {
		t.Fatalf("the client's socket after the stopped turn: %v; want it closed with 1000", err)
	}
	e.waitState(key, "Bearer sk-a", cache.StateCancelled)
	again := wsDial(t, e.url, "sk-a")
	if err := again.Create(ctx, wsCreate("hello", key, "")); err != nil {
		t.Fatal(err)
	}
	types, raw = wsTurnEvents(t, again.Recv)
	if len(types) != 1 || types[0] != "error" || !strings.Contains(raw[0], "stream_cancelled") {
		t.Fatalf("re-send of the cancelled turn: got %v %v; want the stream_cancelled error", types, raw)
	}
	wantCount(t, "upstream generations", e.mock.WebSocketTurns(), 1)
}

// wantWSUpstreamStops checks that, within a second of the stop, the mock
// generates no WebSocket turn and has no socket open, and that cut turns
// were cut by their socket's close.
func wantWSUpstreamStops(t *testing.T, e *env, stopped time.Time, cut int64) {
	t.Helper()
	if !within(time.Second-time.Since(stopped), func() bool {
		return e.mock.WebSocketLiveTurns() == 0 && e.mock.WebSocketConns() == 0
	}) {
		t.Fatalf("a second after the stop the upstream still generates %d turns on %d sockets; want none",
			e.mock.WebSocketLiveTurns(), e.mock.WebSocketConns())
	}
	t.Logf("upstream socket closed %v after the stop", time.Since(stopped).Round(time.Millisecond))
	wantCount(t, "upstream turns cut by their socket's close", e.mock.WebSocketTurnsCut(), cut)
}

// TestStopWebSocketTurnAmongOthers: a keyed turn stopped while another turn
// runs on the same upstream socket (on another lane). The other turn is
// not harmed: it runs to its end, whole. The stopped turn's caller gets
// the cancelled error and none of its frames after it; the connection
// takes no new turn meanwhile (upstream_socket_closed, telling the client
// to open a new connection); once the other turn ended, the upstream
// socket closes within a second, which ends the stopped turn's
// generation, and the client's socket closes with 1000.
func TestStopWebSocketTurnAmongOthers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(20*time.Millisecond, 2000))
	key := newKey("stop-ws-others")
	conn := wsDial(t, e.url, "sk-a")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, _ := conn.Lane("a")
	b, _ := conn.Lane("b")
	c, _ := conn.Lane("c")
	if err := conn.Create(ctx, wsCreate("hello", key, "a")); err != nil {
		t.Fatal(err)
	}
	for n := 0; n < 4; n++ {
		if _, err := a.Recv(ctx); err != nil {
			t.Fatal(err)
		}
	}
	other := wsCreate("other", "", "b")
	other.MaxOutputTokens = openai.Int(40)
	if err := conn.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	first, err := b.Recv(ctx)
	if err != nil || first.Type != "response.created" {
		t.Fatalf("the other turn's first event: %v %v; want response.created", first.Type, err)
	}
	r := e.fetch(req{method: http.MethodDelete, path: "/streams/" + key, auth: "Bearer sk-a"})
	if r.status != http.StatusOK || gjson.GetBytes(r.raw, "state").Str != "cancelled" {
		t.Fatalf("DELETE: got %d %s; want 200, cancelled", r.status, r.raw)
	}
	types, raw := wsTurnEvents(t, a.Recv)
	if types[len(types)-1] != "error" || !strings.Contains(raw[len(raw)-1], "cancelled") {
		t.Fatalf("the stopped turn's end: got %v, last %s; want an error event with code cancelled", types[len(types)-1], raw[len(raw)-1])
	}
	if err := conn.Create(ctx, wsCreate("third", "", "c")); err != nil {
		t.Fatal(err)
	}
	if ev, err := c.Recv(ctx); err != nil || !strings.Contains(ev.RawJSON(), `"upstream_socket_closed"`) || !strings.Contains(ev.RawJSON(), "open a new connection") {
		t.Fatalf("a turn sent after the stop: got %s, %v; want upstream_socket_closed, open a new connection", ev.RawJSON(), err)
	}
	rest, _ := wsTurnEvents(t, b.Recv)
	types = append([]string{first.Type}, rest...)
	if len(types) != 40+8 || types[len(types)-1] != "response.incomplete" {
		t.Fatalf("the other turn: %d events ending %s; want its 48 to response.incomplete", len(types), types[len(types)-1])
	}
	ended := time.Now()
	wantWSUpstreamStops(t, e, ended, 1)
	if ev, err := a.Recv(ctx); err == nil {
		t.Fatalf("the stopped turn's lane after its error: got %s; want nothing more", ev.RawJSON())
	}
	if _, err := conn.Recv(ctx); err == nil || !strings.Contains(err.Error(), "StatusNormalClosure") {
		t.Fatalf("the client's socket: %v; want it closed with 1000", err)
	}
	e.waitState(key, "Bearer sk-a", cache.StateCancelled)
	wantCount(t, "upstream generations", e.mock.WebSocketTurns(), 2)
}

// TestStopWhileHeadAwaited: a stop that comes while the upstream's head
// is awaited (the mock holds it back) takes effect within a second, not
// when the head comes (within -head-timeout, 30 s here): the awaiting
// call is woken and its upstream connection or socket closed, the
// client is answered, and the key is cancelled. For an SSE (HTTP) call
// and for a keyed WebSocket turn.
func TestStopWhileHeadAwaited(t *testing.T) {
	t.Parallel()
	t.Run("sse", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		key := newKey("stop-head")
		answered := make(chan result, 1)
		go func() {
			answered <- e.fetch(req{path: "/v1/responses", key: key, auth: "Bearer sk-one", body: stopBody,
				header: map[string]string{"X-Mock-Fault": "hang"}})
		}()
		waitFor(t, func() bool { return e.mock.Calls() == 1 && e.mock.Active() == 1 })
		stopped := time.Now()
		r := e.fetch(req{method: http.MethodDelete, path: "/streams/" + key, auth: "Bearer sk-one"})
		if r.status != http.StatusOK || gjson.GetBytes(r.raw, "state").Str != "cancelled" {
			t.Fatalf("DELETE while the head is awaited: got %d %s after %v; want 200, cancelled", r.status, r.raw, time.Since(stopped).Round(time.Millisecond))
		}
		wantUpstreamStops(t, e, stopped)
		select {
		case res := <-answered:
			if res.status == http.StatusOK && !res.aborted {
				t.Fatalf("the client: got a whole %d answer; want the stop's", res.status)
			}
			t.Logf("the client was answered %d %s %v after the stop", res.status, res.errType, time.Since(stopped).Round(time.Millisecond))
		case <-time.After(time.Second - time.Since(stopped)):
			t.Fatal("the client was not answered within a second of the stop")
		}
		e.waitState(key, "Bearer sk-one", cache.StateCancelled)
		e.wantCalls(1)
	})
	t.Run("not a stream", func(t *testing.T) {
		// Its answer is awaited in its handler (answerInHandler), not on
		// a taken-over connection.
		t.Parallel()
		e := newEnv(t)
		key := newKey("stop-head-whole")
		answered := make(chan result, 1)
		go func() {
			answered <- e.fetch(req{key: key, auth: "Bearer sk-one", body: plainBody,
				header: map[string]string{"X-Mock-Fault": "hang"}})
		}()
		waitFor(t, func() bool { return e.mock.Calls() == 1 && e.mock.Active() == 1 })
		stopped := time.Now()
		r := e.fetch(req{method: http.MethodDelete, path: "/streams/" + key, auth: "Bearer sk-one"})
		if r.status != http.StatusOK || gjson.GetBytes(r.raw, "state").Str != "cancelled" {
			t.Fatalf("DELETE while the answer is awaited: got %d %s; want 200, cancelled", r.status, r.raw)
		}
		wantUpstreamStops(t, e, stopped)
		select {
		case res := <-answered:
			if res.status == http.StatusOK || res.errType == "" {
				t.Fatalf("the client: got %d %q; want the stop's error answer", res.status, res.raw)
			}
		case <-time.After(time.Second - time.Since(stopped)):
			t.Fatal("the client was not answered within a second of the stop")
		}
		e.waitState(key, "Bearer sk-one", cache.StateCancelled)
		e.wantCalls(1)
	})
	t.Run("websocket", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, slowMock(5*time.Second, 16)) // the first frame comes after 5 s
		key := newKey("stop-ws-head")
		conn := wsDial(t, e.url, "sk-a")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := conn.Create(ctx, wsCreate("hello", key, "")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return e.mock.WebSocketLiveTurns() == 1 })
		stopped := time.Now()
		r := e.fetch(req{method: http.MethodDelete, path: "/streams/" + key, auth: "Bearer sk-a"})
		if r.status != http.StatusOK || gjson.GetBytes(r.raw, "state").Str != "cancelled" {
			t.Fatalf("DELETE while the first frame is awaited: got %d %s; want 200, cancelled", r.status, r.raw)
		}
		wantWSUpstreamStops(t, e, stopped, 1)
		types, raw := wsTurnEvents(t, conn.Recv)
		if len(types) != 1 || types[0] != "error" || !strings.Contains(raw[0], "cancelled") {
			t.Fatalf("the turn: got %v %v; want only the error event with code cancelled", types, raw)
		}
		if since := time.Since(stopped); since > time.Second {
			t.Fatalf("the client was told %v after the stop; want within a second", since)
		}
		e.waitState(key, "Bearer sk-a", cache.StateCancelled)
	})
}
