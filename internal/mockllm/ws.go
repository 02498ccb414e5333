package mockllm

import (
	"bytes"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"
)

// OpenAI's Responses WebSocket mode: GET /v1/responses with Upgrade:
// websocket, one response.create text frame per turn, answered with the
// events of the Responses stream, one JSON text frame each, with their
// sequence_number and the turn's stream_id when it gave one. Turns on
// one lane (stream_id) run one after another; lanes run side by side.
//
// The handshake takes the X-Mock-* headers of a POST (delay, tokens); X-
// Mock-WS-Status: N refuses it with status N. DropWebSocketAfter has the
// next turn close its socket, without a close frame, after n events.
//
// A turn whose socket the client closes ends there, as the API's does
// (its generation stops with its connection: the protocol has no cancel
// of a turn): WebSocketLiveTurns falls, and WebSocketTurnsCut counts it.

// wsState is the mock's WebSocket knobs and counters.
type wsState struct {
	turns atomic.Int64 // response.create frames that began a generation
	beta  atomic.Value // string: the OpenAI-Beta header of the last handshake
	auth  atomic.Value // string: the Authorization header of the last handshake
	conns atomic.Int64 // sockets open now
	drop  atomic.Int64 // the next turn's socket closes after drop-1 events; 0: none
	live  atomic.Int64 // turns being generated now
	cut   atomic.Int64 // turns ended by their socket's close before their last event
}

// WebSocketTurns reports how many WebSocket turns the mock began to
// generate (each is counted in Generations too).
func (s *Server) WebSocketTurns() int64 { return s.ws.turns.Load() }

// WebSocketHandshake reports the OpenAI-Beta and Authorization headers of
// the last WebSocket handshake.
func (s *Server) WebSocketHandshake() (beta, auth string) {
	beta, _ = s.ws.beta.Load().(string)
	auth, _ = s.ws.auth.Load().(string)
	return beta, auth
}

// WebSocketLiveTurns reports how many WebSocket turns are being
// generated now.
func (s *Server) WebSocketLiveTurns() int64 { return s.ws.live.Load() }

// WebSocketTurnsCut reports how many WebSocket turns stopped generating
// because the client closed their socket before their last event.
func (s *Server) WebSocketTurnsCut() int64 { return s.ws.cut.Load() }

// WebSocketConns reports how many WebSocket connections are open.
func (s *Server) WebSocketConns() int64 { return s.ws.conns.Load() }

// DropWebSocketAfter has the next WebSocket turn close its socket abruptly
// once it sent n events (n >= 0).
func (s *Server) DropWebSocketAfter(n int) { s.ws.drop.Store(int64(n) + 1) }

var wsUpgrader = websocket.FastHTTPUpgrader{
	CheckOrigin: func(*fasthttp.RequestCtx) bool { return true },
}

// isWebSocket reports whether ctx asks to upgrade to a WebSocket.
func isWebSocket(ctx *fasthttp.RequestCtx) bool {
	return ctx.IsGet() && websocket.FastHTTPIsWebSocketUpgrade(ctx)
}

// serveWebSocket answers a Responses WebSocket handshake.
func (s *Server) serveWebSocket(ctx *fasthttp.RequestCtx) {
	if v := ctx.Request.Header.Peek("X-Mock-WS-Status"); len(v) > 0 {
		st, err := strconv.Atoi(string(v))
		if err != nil || st < 400 || st > 599 {
			st = fasthttp.StatusBadRequest
		}
		writeError(ctx, openAI, st, "the handshake was refused (X-Mock-WS-Status)")
		return
	}
	opts, err := parseOptions(&s.cfg, &ctx.Request.Header)
	if err != nil {
		writeError(ctx, openAI, fasthttp.StatusBadRequest, err.Error())
		return
	}
	s.ws.beta.Store(string(ctx.Request.Header.Peek("OpenAI-Beta")))
	s.ws.auth.Store(string(ctx.Request.Header.Peek("Authorization")))
	if !s.enter() {
		writeRouteError(ctx, fasthttp.StatusServiceUnavailable, "closing", "the mock is closing")
		return
	}
	err = wsUpgrader.Upgrade(ctx, func(c *websocket.Conn) {
		defer s.leave()
		s.ws.conns.Add(1)
		defer s.ws.conns.Add(-1)
		(&wsSession{s: s, c: c, opts: opts, lanes: map[string]chan []byte{}}).run()
	})
	if err != nil {
		s.leave()
	}
}

// wsSession is one mock WebSocket connection.
type wsSession struct {
	s    *Server
	c    *websocket.Conn
	opts options

	wmu  sync.Mutex // guards writes to c, dead and ended
	dead bool
	// ended: run's read loop is over, and the handler is about to return
	// the hijacked connection to the server: kill no longer touches it.
	ended  bool
	lmu    sync.Mutex // guards lanes
	lanes  map[string]chan []byte
	wg     sync.WaitGroup
	closed chan struct{}
}

// run reads the client's frames until the socket ends.
func (w *wsSession) run() {
	w.closed = make(chan struct{})
	defer func() {
		w.wmu.Lock()
		w.ended = true
		w.wmu.Unlock()
		close(w.closed)
		w.lmu.Lock()
		for _, q := range w.lanes {
			close(q)
		}
		w.lmu.Unlock()
		w.wg.Wait()
		_ = w.c.Close()
	}()
	go func() {
		select {
		case <-w.s.closing:
			w.kill()
		case <-w.closed:
		}
	}()
	for {
		typ, msg, err := w.c.ReadMessage()
		if err != nil {
			return
		}
		if typ != websocket.TextMessage {
			w.errorFrame("", "invalid_request_error", "only text frames are accepted")
			continue
		}
		var env struct {
			Type     string `json:"type"`
			StreamID string `json:"stream_id"`
		}
		if json.Unmarshal(msg, &env) != nil {
			w.errorFrame("", "invalid_request_error", "the frame is not JSON")
			continue
		}
		if env.Type != "response.create" {
			w.errorFrame(env.StreamID, "invalid_request_error", "unknown frame type "+strconv.Quote(env.Type))
			continue
		}
		w.lane(env.StreamID) <- msg
	}
}

// lane returns the queue of the turns of lane id, starting its runner.
func (w *wsSession) lane(id string) chan []byte {
	w.lmu.Lock()
	defer w.lmu.Unlock()
	q, ok := w.lanes[id]
	if !ok {
		q = make(chan []byte, 64)
		w.lanes[id] = q
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for msg := range q {
				w.turn(id, msg)
			}
		}()
	}
	return q
}

// turn answers one response.create on lane id.
func (w *wsSession) turn(id string, msg []byte) {
	req, err := parseRequest(msg)
	if err != nil {
		w.errorFrame(id, "invalid_request_error", err.Error())
		return
	}
	model := defaultOpenAIModel
	if req.Model != "" {
		model = req.Model
	}
	w.s.calls.Add(1)
	w.s.model(req.Model) // counted for CallsFor; a model's fault is a POST's
	w.s.generations.Add(1)
	w.s.ws.turns.Add(1)
	w.s.ws.live.Add(1)
	defer w.s.ws.live.Add(-1)
	drop := w.s.ws.drop.Swap(0) - 1
	r := newResponses(newCompletion(msg, model, w.opts.tokens, req.MaxOutputTokens, w.opts.chunkBytes), req.MaxOutputTokens)
	var ev []byte
	for i := range r.events() {
		if int64(i) == drop {
			w.kill()
			return
		}
		if w.opts.delay > 0 {
			t := time.NewTimer(w.opts.delay)
			select {
			case <-t.C:
			case <-w.closed:
				t.Stop()
				w.s.ws.cut.Add(1)
				return
			}
		}
		ev = r.appendEvent(ev[:0], i)
		if !w.write(frameOf(ev, id)) {
			w.s.ws.cut.Add(1)
			return
		}
	}
}

// frameOf is the JSON of the SSE event ev (its data line), with the
// stream_id of its lane when it has one.
func frameOf(ev []byte, id string) []byte {
	i := bytes.Index(ev, []byte("\ndata: "))
	data := bytes.TrimRight(ev[i+len("\ndata: "):], "\n")
	if id == "" {
		return data
	}
	out := make([]byte, 0, len(data)+len(id)+16)
	out = append(out, `{"stream_id":`...)
	out = appendJSONString(out, id)
	out = append(out, ',')
	return append(out, data[1:]...)
}

// write sends one text frame; false once the socket is gone.
func (w *wsSession) write(b []byte) bool {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if w.dead {
		return false
	}
	if err := w.c.WriteMessage(websocket.TextMessage, b); err != nil {
		w.dead = true
		return false
	}
	return true
}

// errorFrame sends an error event, as the API answers a frame it refuses.
func (w *wsSession) errorFrame(id, code, msg string) {
	b := []byte(`{"type":"error"`)
	if id != "" {
		b = append(b, `,"stream_id":`...)
		b = appendJSONString(b, id)
	}
	b = append(b, `,"error":{"type":"invalid_request_error","code":`...)
	b = appendJSONString(b, code)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, msg)
	b = append(b, `}}`...)
	w.write(b)
}

// kill ends the socket without a close frame, as a dropped connection:
// the read loop stops, and the server closes the connection once the
// handler returns (a hijacked connection's Close is the server's).
func (w *wsSession) kill() {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	w.dead = true
	if !w.ended {
		_ = w.c.UnderlyingConn().SetReadDeadline(time.Unix(1, 0))
	}
}
