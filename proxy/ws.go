package proxy

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// WSConfig bounds OpenAI's Responses WebSocket mode. Its zero value takes
// the defaults.
type WSConfig struct {
	// MaxConns bounds the WebSocket connections open at once (default
	// 1000); a handshake past it gets 503 capacity_exceeded.
	MaxConns int
	// MaxTurns bounds the response.create frames one connection may send
	// (default 1000); one past it gets an error frame.
	MaxTurns int
	// MaxFrameBytes bounds a client's frame (default 16 MiB); a larger
	// one closes the connection with 1009.
	MaxFrameBytes int
	// IdleTimeout closes a connection that sent nothing and has no turn
	// running for this long (default 5m).
	IdleTimeout time.Duration
	// MaxLifetime closes a connection this long after it opened (default
	// 60m, the API's own bound).
	MaxLifetime time.Duration
	// DedupeWindow, when positive, keys a turn without
	// metadata.ssegate_idempotency_key by its tenant and canonical create
	// body for this long (off by default).
	DedupeWindow time.Duration
}

// A WebSocket connection on the Responses path (GET /v1/responses with
// Upgrade: websocket) is relayed to the upstream's WebSocket: one upstream
// socket per client socket, opened before the client's is upgraded, with
// the handshake's path, query, credentials and OpenAI-Beta; a refused
// upstream handshake is answered with its status and body. Frames go both
// ways in order. A turn is one response.create frame; the upstream
// answers each with the events of a Responses stream, one JSON text
// frame each, on the turn's lane (its stream_id; lanes run side by side,
// the turns of one lane one after another). An unkeyed turn's frames go
// to the client as they come. A keyed turn (wsturn.go) is a call of the
// one engine: its events are journaled as a Responses SSE stream's, and
// its callers are delivered from the journal.

var wsUpgrader = websocket.FastHTTPUpgrader{
	CheckOrigin:     func(*fasthttp.RequestCtx) bool { return true },
	ReadBufferSize:  4 << 10,
	WriteBufferSize: 4 << 10,
}

// wsHandshakeHeaders are the client handshake's headers that are its own,
// not the upstream's.
var wsHandshakeHeaders = []string{
	"Host", "Upgrade", "Connection", "Sec-Websocket-Key", "Sec-Websocket-Version",
	"Sec-Websocket-Extensions", "Sec-Websocket-Protocol", "Content-Length", "Accept-Encoding",
}

// isWebSocket reports whether ctx is a Responses WebSocket handshake.
func isWebSocket(ctx *fasthttp.RequestCtx) bool {
	return ctx.IsGet() && isResponsesPath(ctx.Path()) && websocket.FastHTTPIsWebSocketUpgrade(ctx)
}

// serveWebSocket answers a Responses WebSocket handshake: it opens the
// upstream's socket, then upgrades the client's.
func (p *Proxy) serveWebSocket(ctx *fasthttp.RequestCtx) {
	cfg := &p.cfg.WS
	if p.draining.Load() {
		p.refuse(ctx, causeShutdown, "")
		return
	}
	if p.wsConns.Add(1) > int64(cfg.MaxConns) {
		p.wsConns.Add(-1)
		p.refuse(ctx, causeWSMaxConns, "")
		return
	}
	opened := false
	defer func() {
		if !opened {
			p.wsConns.Add(-1)
		}
	}()
	sc, ok := p.scope(ctx, "")
	if !ok {
		return
	}
	target := string(ctx.URI().PathOriginal())
	if q := ctx.URI().QueryString(); len(q) > 0 {
		target += "?" + string(q)
	}
	hdr := http.Header{}
	for k, v := range ctx.Request.Header.All() {
		name := string(k)
		skip := slices.ContainsFunc(wsHandshakeHeaders, func(h string) bool { return strings.EqualFold(name, h) }) ||
			slices.ContainsFunc(upstream.HopHeaders, func(h string) bool { return strings.EqualFold(name, h) })
		if !skip {
			hdr.Add(name, string(v))
		}
	}
	upc, refused, why := p.dialWebSocket(target, hdr, sc)
	if upc == nil {
		if refused != nil {
			// The upstream refused the handshake: its status (426 tells
			// Codex to fall back to HTTP), and its error body.
			ctx.SetStatusCode(refused.status)
			if refused.contentType != "" {
				ctx.SetContentType(refused.contentType)
			}
			ctx.SetBody(refused.body)
			p.log.Info("websocket refused by upstream", "status", refused.status, "tenant", sc.Tenant)
			return
		}
		p.writeError(ctx, why.err(""))
		return
	}
	c := &wsConn{p: p, sc: sc, up: upc, path: string(ctx.URI().PathOriginal()),
		lanes: map[string][]*wsLaneTurn{}, following: map[string]int{}, gone: make(chan struct{})}
	p.clients.Add(1)
	err := wsUpgrader.Upgrade(ctx, func(cl *websocket.Conn) {
		defer p.clients.Done()
		defer p.wsConns.Add(-1)
		p.hooks.wsConnection(1)
		defer p.hooks.wsConnection(-1)
		c.clMu.Lock()
		c.cl = cl
		c.clMu.Unlock()
		c.run()
	})
	if err != nil {
		p.clients.Done()
		upc.Close() //nolint:errcheck // unused
		return
	}
	opened = true
}

// wsRefusal is an upstream's answer to a handshake it refused.
type wsRefusal struct {
	status      int
	contentType string
	body        []byte
}

// dialWebSocket opens the upstream socket of a client's handshake, to
// path (and query) with the handshake's headers hdr, failing over as an
// HTTP call that sent nothing does: the upstreams in order, through their
// circuits (upstream.Pick), within -retry-attempts, -retry-max-elapsed
// and the retry budget, with the same backoff. A handshake runs no
// generation, so what the retry rules take as safe (a connect failure, no
// answer to the handshake, 429, 500, 502, 503, 504) is tried on the next
// upstream; any other refusal (401, 426) is the answer. It returns the
// socket, or the refusal to pass back (the last one, when every
// upstream failed so), or the cause of the failure.
func (p *Proxy) dialWebSocket(path string, hdr http.Header, sc cache.Scope) (*websocket.Conn, *wsRefusal, cause) {
	rc := &p.cfg.Retry
	d := websocket.Dialer{HandshakeTimeout: p.cfg.UpstreamConnectTimeout, ReadBufferSize: 4 << 10, WriteBufferSize: 4 << 10}
	jitter := upstream.NewFullJitter(rc.BaseBackoff, rc.MaxBackoff)
	start := time.Now()
	p.budget.Request(start)
	var last *wsRefusal
	c := causeConnectError
	for n, next := 1, 0; ; n++ {
		up, idx, done, ok := upstream.Pick(p.ups, next, "")
		if !ok {
			if last == nil && n == 1 {
				c = causeUpstreamUnavailable
			}
			return nil, last, c
		}
		upc, resp, err := d.Dial(up.WebSocketURL(path), hdr)
		if err == nil {
			done(nil)
			return upc, nil, causeNone
		}
		retryAfter := time.Duration(0)
		switch {
		case resp == nil:
			var oe *net.OpError
			if errors.As(err, &oe) && oe.Op == "dial" {
				err = upstream.ConnectFailed(err)
			}
			done(err)
			c = causeConnectError
			p.log.Warn("websocket upstream dial failed", "err", err.Error(), "upstream", up.Name(), "attempt", n, "tenant", sc.Tenant)
		default:
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close() //nolint:errcheck // read
			r := &wsRefusal{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: body}
			if upstream.StatusVerdict(r.status) != upstream.Safe {
				done(nil) // an answer: the upstream is up
				return nil, r, causeNone
			}
			done(health(r.status, false))
			last = r
			retryAfter = upstream.RetryAfter([]byte(resp.Header.Get("Retry-After")), time.Now())
			p.log.Warn("websocket upstream handshake failed", "status", r.status, "upstream", up.Name(), "attempt", n, "tenant", sc.Tenant)
		}
		wait := max(jitter.Next(), retryAfter)
		why := ""
		switch {
		case n >= rc.Attempts:
			why = "attempts"
		case retryAfter > rc.RetryAfterMax:
			why = "retry_after_too_long"
		case time.Since(start)+wait > rc.MaxElapsed:
			why = "max_elapsed"
		case !p.budget.Retry(time.Now()):
			why = "budget"
		}
		if why != "" {
			p.hooks.retryRefused(why)
			p.log.Warn("no websocket handshake retry", "why", why, "upstream", up.Name(), "attempt", n, "tenant", sc.Tenant)
			return nil, last, c
		}
		next = idx + 1
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-p.done:
			t.Stop()
			return nil, last, causeShutdown
		}
	}
}

// wsConn is one client socket and its upstream socket.
type wsConn struct {
	p    *Proxy
	sc   cache.Scope // the tenant and accounts of the handshake; Key is set per turn
	path string
	cl   *websocket.Conn // written under clMu
	up   *websocket.Conn // written under upMu

	clMu   sync.Mutex // guards writes to cl and clDead
	clDead bool

	// upMu guards writes to up, lanes, upDead, retiring and stopped: a
	// create is written and queued on its lane in one hold, so the
	// queue's order is the wire's.
	upMu   sync.Mutex
	lanes  map[string][]*wsLaneTurn // the turns sent on each lane, not yet ended
	upDead bool
	// retiring: a turn on the upstream socket was stopped while others
	// ran on it; the socket takes no new turn, and closes once the
	// others ended (stopTurn).
	retiring bool
	stopped  bool // the upstream socket was closed to stop a turn

	// fmu guards following: the keyed turns being delivered to the
	// client, counted by lane and key (wsLaneKey), so that a re-send of
	// a turn on the lane it is delivered on is not delivered again.
	fmu       sync.Mutex
	following map[string]int

	turns     int            // creates the client sent (the read loop's)
	keyed     sync.WaitGroup // keyed turns still running upstream
	delivered sync.WaitGroup // deliveries to this client still running
	gone      chan struct{}  // closed when the client's socket is done
}

// wsLaneTurn is a turn sent on the upstream socket: its frames go to the
// client (t nil) or into a keyed turn's journal.
type wsLaneTurn struct {
	t       *wsTurn
	created bool // response.created came
	stopped bool // the turn was stopped: its frames are no one's
}

// run serves the connection until the client's socket ends; the upstream
// socket then stays open until its keyed turns end (within the
// connection's lifetime), and closes.
func (c *wsConn) run() {
	p := c.p
	life := time.AfterFunc(p.cfg.WS.MaxLifetime, func() {
		c.closeClient(websocket.CloseGoingAway, "connection lifetime reached")
		c.up.Close() //nolint:errcheck // the lifetime is over
	})
	defer life.Stop()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-p.done:
			c.closeClient(websocket.CloseGoingAway, "shutting down")
			c.up.Close() //nolint:errcheck // shutting down
		case <-stop:
		}
	}()
	upDone := make(chan struct{})
	go func() {
		defer close(upDone)
		c.readUpstream()
	}()
	c.readClient()
	close(c.gone)
	c.delivered.Wait()
	// A keyed turn runs to its end without its client, and is stored.
	c.keyed.Wait()
	c.up.Close() //nolint:errcheck // the client is gone
	<-upDone
	c.closeClient(websocket.CloseNormalClosure, "")
	// The handler returns the hijacked connection to the server next,
	// which releases it: a late closeClient (the lifetime's timer, a
	// shutdown, racing this return) must not touch it.
	c.clMu.Lock()
	c.cl = nil
	c.clMu.Unlock()
}

// readClient reads the client's frames until its socket ends.
func (c *wsConn) readClient() {
	p, cfg := c.p, &c.p.cfg.WS
	c.cl.SetReadLimit(int64(cfg.MaxFrameBytes))
	last := time.Now() // the last frame read; written under clMu
	go func() {
		// Looked at every second at most: a drain closes a connection
		// that runs no turn (1001), so that it does not hold the
		// shutdown; -ws-idle-timeout closes one idle that long (1000).
		tick := min(cfg.IdleTimeout, time.Second)
		t := time.NewTimer(tick)
		defer t.Stop()
		for {
			select {
			case <-c.gone:
				return
			case <-t.C:
			}
			c.clMu.Lock()
			quiet := time.Since(last)
			c.clMu.Unlock()
			switch {
			case c.busy():
			case p.draining.Load():
				c.closeClient(websocket.CloseGoingAway, "shutting down")
				return
			case quiet >= cfg.IdleTimeout:
				c.closeClient(websocket.CloseNormalClosure, "idle for -ws-idle-timeout")
				return
			}
			t.Reset(tick)
		}
	}()
	for {
		typ, msg, err := c.cl.ReadMessage()
		if err != nil {
			if errors.Is(err, websocket.ErrReadLimit) {
				c.closeClient(websocket.CloseMessageTooBig, "frame larger than -ws-max-frame-bytes")
			}
			c.markClientDead()
			return
		}
		c.clMu.Lock()
		last = time.Now()
		c.clMu.Unlock()
		if typ != websocket.TextMessage {
			c.errorFrame("", causeWSBinaryFrame.err(""))
			continue
		}
		if !gjson.ValidBytes(msg) || !gjson.ParseBytes(msg).IsObject() {
			c.errorFrame("", causeWSNotJSON.err(""))
			continue
		}
		lane := gjson.GetBytes(msg, "stream_id").String()
		if t := gjson.GetBytes(msg, "type").String(); t != "response.create" {
			c.errorFrame(lane, causeWSUnknownFrame.err(jsonQuote(t)))
			continue
		}
		if p.draining.Load() {
			c.errorFrame(lane, causeShutdown.err(""))
			continue
		}
		if c.isRetiring() {
			c.errorFrame(lane, causeWSUpstreamGone.err(wsRetiring))
			continue
		}
		if c.turns++; c.turns > cfg.MaxTurns {
			c.errorFrame(lane, causeWSMaxTurns.err(""))
			continue
		}
		if createEmpty(msg) {
			c.errorFrame(lane, causeWSEmptyCreate.err(""))
			continue
		}
		p.wsCreate(c, lane, msg)
	}
}

// busy reports whether a turn is running on the connection.
func (c *wsConn) busy() bool {
	c.upMu.Lock()
	defer c.upMu.Unlock()
	for _, q := range c.lanes {
		if len(q) > 0 {
			return true
		}
	}
	return false
}

// wsRetiring is what a turn sent on a connection whose upstream socket is
// closing, to stop a turn (stopTurn), is told.
const wsRetiring = "a turn of this connection was stopped, which closes its upstream socket (the protocol cannot cancel one turn): open a new connection"

// isRetiring reports whether the upstream socket takes no new turn: it
// closes, or will once its running turns end, to stop one.
func (c *wsConn) isRetiring() bool {
	c.upMu.Lock()
	defer c.upMu.Unlock()
	return c.retiring
}

// relay sends an unkeyed turn upstream as it came.
func (c *wsConn) relay(lane string, msg []byte) {
	c.upMu.Lock()
	defer c.upMu.Unlock()
	if c.upDead || c.retiring {
		detail := ""
		if c.retiring {
			detail = wsRetiring
		}
		c.errorFrame(lane, causeWSUpstreamGone.err(detail))
		return
	}
	if err := c.up.WriteMessage(websocket.TextMessage, msg); err != nil {
		return // the upstream reader sees the socket end
	}
	c.lanes[lane] = append(c.lanes[lane], &wsLaneTurn{})
}

// sendKeyed sends the keyed turn t upstream and queues it on its lane.
func (c *wsConn) sendKeyed(t *wsTurn) error {
	c.upMu.Lock()
	defer c.upMu.Unlock()
	if c.upDead || c.retiring {
		return errWSUpstreamGone
	}
	if err := c.up.WriteMessage(websocket.TextMessage, t.frame); err != nil {
		return err
	}
	c.lanes[t.lane] = append(c.lanes[t.lane], &wsLaneTurn{t: t})
	return nil
}

var errWSUpstreamGone = errors.New("the upstream WebSocket is closed")

// stopTurn stops the keyed turn t upstream, once its stream was ended (a
// stop of its tenant, -max-stream-duration, a shutdown). The Responses
// WebSocket protocol has no cancel of one turn (response.cancel is the
// Realtime API's): the provider generates a turn until it ends or its
// socket closes. So when t is the only turn running on the upstream
// socket, the socket is closed now, and the provider stops; the client's
// socket is then closed too (1000, once what is being delivered to it
// went), as the API closes one at the end of its lifetime, so that the
// client opens a new connection for its next turn: a transparent new
// upstream socket would lose the connection-local cache that a
// store=false continuation (previous_response_id) needs, and the client
// would be told previous_response_not_found instead. When other turns
// run on the socket, they are not harmed: t's frames are no longer
// relayed (its stream has ended), the socket takes no new turn
// (wsRetiring), and it closes as soon as the others ended.
func (c *wsConn) stopTurn(t *wsTurn) {
	c.upMu.Lock()
	if c.upDead {
		c.upMu.Unlock()
		return
	}
	found, others := false, false
	for _, q := range c.lanes {
		for _, lt := range q {
			switch {
			case lt.t == t:
				lt.stopped, found = true, true
			case !lt.stopped:
				others = true
			}
		}
	}
	if !found {
		c.upMu.Unlock()
		return // not sent, or ended meanwhile
	}
	c.retiring = true
	closeNow := !others
	if closeNow {
		c.stopped = true
	}
	c.upMu.Unlock()
	c.p.log.Info("websocket turn stopped upstream", "key", t.key, "tenant", c.sc.Tenant, "lane", t.lane, "socket_closed", closeNow)
	if closeNow {
		c.up.Close() //nolint:errcheck // stopping the provider's generation
	}
}

// retireIfIdle closes the upstream socket of a retiring connection once no
// turn but stopped ones runs on it; when the stopped turns ended by
// themselves meanwhile, there is nothing left to stop, and the socket
// takes turns again. Called under upMu.
func (c *wsConn) retireIfIdle() {
	if !c.retiring || c.stopped {
		return
	}
	stopped, others := 0, 0
	for _, q := range c.lanes {
		for _, lt := range q {
			if lt.stopped {
				stopped++
			} else {
				others++
			}
		}
	}
	switch {
	case stopped == 0:
		c.retiring = false
		return
	case others > 0:
		return
	}
	c.stopped = true
	c.up.Close() //nolint:errcheck // the stopped turn's generation ends with it
}

// readUpstream reads the upstream's frames and routes each to the turn at
// the head of its lane; a terminal event ends that turn. When the socket
// ends, every keyed turn still running is cut (commit_unknown) and the
// client's socket is closed once told.
func (c *wsConn) readUpstream() {
	for {
		typ, msg, err := c.up.ReadMessage()
		if err != nil {
			break
		}
		if typ != websocket.TextMessage {
			continue
		}
		lane := gjson.GetBytes(msg, "stream_id").String()
		et := gjson.GetBytes(msg, "type").String()
		c.upMu.Lock()
		var t *wsTurn
		end := false
		if q := c.lanes[lane]; len(q) > 0 {
			lt := q[0]
			t = lt.t
			if et == "response.created" {
				lt.created = true
			}
			// An error before response.created is the API's refusal of
			// the create: it ends the turn. One after it is followed by
			// response.failed.
			if end = wsTerminal(et) || (et == "error" && !lt.created); end {
				if c.lanes[lane] = q[1:]; len(q) == 1 {
					delete(c.lanes, lane)
				}
				c.retireIfIdle()
			}
		}
		c.upMu.Unlock()
		if t != nil {
			t.feed(et, msg, end)
		} else {
			c.toClient(msg)
		}
	}
	c.upMu.Lock()
	c.upDead = true
	var cut []*wsTurn
	for _, q := range c.lanes {
		for _, lt := range q {
			if lt.t != nil {
				cut = append(cut, lt.t)
			}
		}
	}
	c.lanes = map[string][]*wsLaneTurn{}
	stopped := c.stopped
	c.upMu.Unlock()
	for _, t := range cut {
		t.cut()
	}
	select {
	case <-c.gone:
		return
	default:
	}
	// The client's keyed turns end with an error frame that says their
	// outcome is unknown (their deliveries), or, when the socket was
	// closed to stop a turn, that it was cancelled; then its socket
	// closes.
	go func() {
		c.delivered.Wait()
		if stopped {
			c.closeClient(websocket.CloseNormalClosure, "a turn was stopped, which closed the upstream socket: open a new connection")
			return
		}
		c.closeClient(websocket.CloseInternalServerErr, "the upstream connection was lost")
	}()
}

// wsTerminal reports whether a Responses event of type et ends its turn.
func wsTerminal(et string) bool {
	return et == "response.completed" || et == "response.failed" || et == "response.incomplete"
}

// toClient writes one text frame to the client; a client that is gone is
// not written again.
func (c *wsConn) toClient(msg []byte) bool {
	c.clMu.Lock()
	defer c.clMu.Unlock()
	if c.clDead || c.cl == nil {
		return false
	}
	c.cl.SetWriteDeadline(time.Now().Add(c.p.cfg.SlowClientTimeout)) //nolint:errcheck // a deadline
	if err := c.cl.WriteMessage(websocket.TextMessage, msg); err != nil {
		c.clDead = true
		c.cl.Close() //nolint:errcheck // the client cannot be written
		return false
	}
	return true
}

func (c *wsConn) markClientDead() {
	c.clMu.Lock()
	c.clDead = true
	c.clMu.Unlock()
}

// closeClient sends a close frame with code and reason, and closes the
// client's socket.
func (c *wsConn) closeClient(code int, reason string) {
	c.clMu.Lock()
	defer c.clMu.Unlock()
	if c.cl == nil {
		return
	}
	if !c.clDead {
		c.cl.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second)) //nolint:errcheck // closing
	}
	c.clDead = true
	c.cl.Close() //nolint:errcheck // closing
}

// errorFrame writes the client e as an error event on lane, as the API
// answers a frame it refuses, and logs it.
func (c *wsConn) errorFrame(lane string, e *apiError) {
	c.toClient(e.wsFrame(lane))
	c.p.log.Info("websocket frame refused", "tenant", c.sc.Tenant, "reason", causes[e.cause].name, "msg", e.message)
}

// createEmpty reports whether a response.create has nothing besides its
// type and lane.
func createEmpty(msg []byte) bool {
	empty := true
	gjson.ParseBytes(msg).ForEach(func(k, _ gjson.Result) bool {
		empty = k.Str == "type" || k.Str == "stream_id"
		return empty
	})
	return empty
}

// jsonQuote is s as a JSON string.
func jsonQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
