package proxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"sync"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/valyala/fasthttp"
)

// wsKeyField is where a response.create carries its idempotency key.
const wsKeyField = "metadata.ssegate_idempotency_key"

// wsTurnTool is the name a keyed WebSocket turn is held under as a tool
// call (cache.Tool.Name), which GET /keys/{key} shows as the turn's kind
// (newKeyInfo). The colon is outside the characters of MCP's tool names,
// so no tool call is taken for a turn.
const wsTurnTool = "websocket:response.create"

// A keyed WebSocket turn is a response.create whose metadata carries
// ssegate_idempotency_key (or, under -ws-dedupe-window, any turn, keyed
// by its tenant and canonical create body). It is one intent, decided as
// a keyed POST is (answerBegun's decisions), with the create body less
// the key and the lane as its fingerprint: a miss is a call of the one
// engine whose kind (wsKind) sends the frame on the connection's upstream
// socket and reads the turn's frames as a Responses event stream, so it
// is journaled, judged, committed and shared (Redis) as an SSE Responses
// stream is; a join or a hit is delivered from the journal or the stored
// result (wsDeliver), each frame once, in order, under the caller's own
// stream_id.

// wsCreate decides the response.create msg on lane.
func (p *Proxy) wsCreate(c *wsConn, lane string, msg []byte) {
	key := gjson.GetBytes(msg, wsKeyField)
	window := p.cfg.WS.DedupeWindow
	if !key.Exists() && window <= 0 {
		p.hooks.wsTurn("relay", decisionNone)
		c.relay(lane, msg)
		return
	}
	body, err := sjson.DeleteBytes(msg, wsKeyField)
	if err == nil && gjson.GetBytes(body, "metadata").IsObject() && len(gjson.GetBytes(body, "metadata").Map()) == 0 {
		body, err = sjson.DeleteBytes(body, "metadata")
	}
	if err == nil {
		body, err = sjson.DeleteBytes(body, "stream_id")
	}
	canon, cerr := canonicalJSON(body)
	if err != nil || cerr != nil {
		p.hooks.wsTurn("invalid", decisionNone)
		c.errorFrame(lane, causeWSNotJSON.err(""))
		return
	}
	k := key.String()
	if !key.Exists() {
		sum := sha256.Sum256(canon)
		k = "ws:" + hex.EncodeToString(sum[:16]) // kept for the window (Tool.Keep)
	} else if key.Type != gjson.String || validKey(k) != nil {
		p.hooks.wsTurn("invalid", decisionNone)
		c.errorFrame(lane, causeInvalidKey.err("metadata.ssegate_idempotency_key must be 1-255 visible ASCII characters"))
		return
	}
	up, _ := sjson.DeleteBytes(msg, wsKeyField)
	h := sha256.New()
	h.Write([]byte("WS\x00" + c.path + "\x00"))
	h.Write(canon)
	sc := c.sc
	sc.Key = k
	fp := string(h.Sum(nil))
	// A turn whose outcome is unknown holds its key, as a tool call's
	// does (cache.Tool): a re-send is told so, and never sent again.
	var b cache.Begun
	if ts, ok := p.store.(ToolStore); ok {
		tool := cache.Tool{Name: wsTurnTool, UnknownTTL: p.cfg.MCPUnknownTTL}
		if !key.Exists() {
			tool.Keep = window
		}
		b, err = ts.BeginTool(sc, fp, tool)
	} else {
		b, err = p.store.Begin(sc, fp)
	}
	if err != nil {
		p.hooks.wsTurn("refused", decisionRefused)
		c.errorFrame(lane, causeStoreUnavailable.err(""))
		p.log.Warn("websocket turn refused: store", "key", k, "tenant", sc.Tenant, "err", err.Error())
		return
	}
	d := "miss"
	lk := wsLaneKey(lane, k)
	if (b.Decision == cache.Join || b.Decision == cache.Hit) && c.delivering(lk) {
		// A re-send on the lane the turn is being delivered on: the
		// client gets its frames there already, each once.
		p.hooks.wsTurn("duplicate", decisionJoin)
		p.log.Info("websocket turn", "decision", "duplicate", "key", k, "tenant", sc.Tenant, "lane", lane)
		return
	}
	switch b.Decision {
	case cache.Conflict:
		d = "conflict"
		c.errorFrame(lane, causeConflict.err("another response.create body"))
	case cache.Gone:
		d = "gone"
		c.errorFrame(lane, causeGone.err("the committed result of this key is no longer held"))
	case cache.Unknown:
		d = "unknown"
		c.errorFrame(lane, failedAnswer(cache.StateCommitUnknown, ""))
	case cache.Cancelled:
		d = "cancelled" // its tenant stopped it: not run again (stop.go)
		c.errorFrame(lane, causeCancelled.err(""))
	case cache.Hit:
		d = "hit"
		p.hooks.saved(b.Result.Usage)
		data, _ := b.Result.After(0)
		c.delivered.Add(1)
		dl := c.startDelivery(lk)
		go func() {
			defer c.delivered.Done()
			defer dl.end()
			c.deliverJournal(data, lane, dl)
		}()
	case cache.Join:
		d = "join"
		sub, err := b.Flight.Subscribe(0)
		if err != nil {
			d = "refused"
			c.errorFrame(lane, causeMaxFollowers.err(""))
			break
		}
		c.delivered.Add(1)
		go c.follow(b.Flight, sub, lane, c.startDelivery(lk))
	case cache.Miss:
		if !p.claimSlot(nil, b.Flight) {
			d = "refused"
			c.errorFrame(lane, causeMaxStreams.err(""))
			break
		}
		t := &wsTurn{c: c, key: k, lane: lane, frame: up, ended: make(chan struct{})}
		t.pr, t.pw = io.Pipe()
		req := sse.Request{Model: gjson.GetBytes(msg, "model").String(), Stream: true, N: 1}
		g := p.newGen(b.Flight, req, wsKind(t))
		tmpl := fasthttp.AcquireRequest()
		tmpl.Header.SetMethod(fasthttp.MethodPost)
		tmpl.SetRequestURI(c.path)
		tmpl.SetBody(up)
		c.keyed.Add(1)
		go func() {
			// A generation that ends without sending the turn (cut, or
			// refused, before its call) ends it too.
			<-b.Flight.Done()
			t.end(nil)
		}()
		c.delivered.Add(1)
		go c.follow(b.Flight, g.o.sub, lane, c.startDelivery(lk)) // the origin's place, taken before the generation starts
		g.launch(tmpl)
	}
	p.hooks.wsTurn(d, wsDecisions[d])
	p.log.Info("websocket turn", "decision", d, "key", k, "tenant", sc.Tenant, "lane", lane)
}

// wsDecisions are the decisions of ssegate_requests_total a keyed turn's
// decision counts as.
var wsDecisions = map[string]decision{"miss": decisionMiss, "hit": decisionHit, "join": decisionJoin,
	"conflict": decisionConflict, "gone": decisionGone, "unknown": decisionUnknown, "refused": decisionRefused,
	"cancelled": decisionCancelled}

// canonicalJSON is body with its objects' members sorted and no
// insignificant space, numbers as they came.
func canonicalJSON(body []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// wsTurn is a keyed turn's upstream part: its create frame, sent once on
// the connection's upstream socket, and the pipe its frames are read
// from, as the events of a Responses stream.
type wsTurn struct {
	c     *wsConn
	key   string
	lane  string
	frame []byte
	pr    *io.PipeReader
	pw    *io.PipeWriter
	once  sync.Once
	ended chan struct{} // closed when the turn ended upstream, or was cut
}

// wsKind is the kind of the keyed WebSocket turn t: a model's generation
// (its events judged as a Responses stream, its response id an alias for
// HTTP resume), sent once (kind.once: the protocol cannot tell a repeat
// apart, and a repeat is a second generation), whose end without its
// terminal event (the upstream socket lost mid-turn) is commit_unknown.
func wsKind(t *wsTurn) *kind {
	k := *llmKind
	k.send = t.send
	k.once = true
	k.repeatsAmbiguous = false
	k.failed = func(c cause) (cache.State, bool) {
		switch c {
		case causeUpstreamReadError, causeUpstreamReset, causeNoTerminalEvent, causeUpstreamIdleTimeout, causeSequenceGap:
			return cache.StateCommitUnknown, true
		}
		return "", false
	}
	return &k
}

// send is the turn's call: the frame on the upstream socket, answered
// with a stream whose body is the pipe.
func (t *wsTurn) send(g *gen, _ *fasthttp.Request, resp *fasthttp.Response) error {
	if err := t.c.sendKeyed(t); err != nil {
		t.end(nil)
		return err
	}
	resp.SetStatusCode(fasthttp.StatusOK)
	resp.Header.SetContentType("text/event-stream")
	resp.SetBodyStream(t.pr, -1)
	go func() {
		select {
		case <-g.stop: // a stop, a shutdown, -max-stream-duration
			t.end(errWSCut)
			t.c.stopTurn(t) // and the provider's generation (ws.go)
		case <-t.ended:
		}
	}()
	return nil
}

var (
	errWSCut  = errors.New("the turn was cut short")
	errWSLost = errors.New("the upstream WebSocket was lost mid-turn")
)

// feed writes one upstream frame into the turn's stream as an SSE event;
// end: it is the turn's last.
func (t *wsTurn) feed(et string, msg []byte, end bool) {
	var b bytes.Buffer
	b.Grow(len(msg) + len(et) + 16)
	b.WriteString("event: ")
	b.WriteString(et)
	b.WriteString("\ndata: ")
	if bytes.ContainsAny(msg, "\r\n") {
		if json.Compact(&b, msg) != nil {
			b.Write(bytes.ReplaceAll(bytes.ReplaceAll(msg, []byte("\r"), nil), []byte("\n"), nil))
		}
	} else {
		b.Write(msg)
	}
	b.WriteString("\n\n")
	if _, err := t.pw.Write(b.Bytes()); err != nil {
		end = true // the engine is done reading: what follows is not its
	}
	if end {
		t.end(nil)
	}
}

// cut ends the turn's stream as its upstream socket was lost.
func (t *wsTurn) cut() { t.end(errWSLost) }

// end ends the turn's stream, with err (nil: its end), once.
func (t *wsTurn) end(err error) {
	t.once.Do(func() {
		t.pw.CloseWithError(err) //nolint:errcheck // always nil
		close(t.ended)
		t.c.keyed.Done()
	})
}

// wsLaneKey names the delivery of the turn under key k on lane.
func wsLaneKey(lane, k string) string { return lane + "\x00" + k }

// delivering reports whether the turn lk names is being delivered to the
// client on its lane.
func (c *wsConn) delivering(lk string) bool {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	return c.following[lk] > 0
}

// wsDelivery is one delivery of a keyed turn to the client, counted in
// wsConn.following from startDelivery until end. It is used by the one
// goroutine that delivers.
type wsDelivery struct {
	c     *wsConn
	lk    string
	ended bool
}

// startDelivery counts a delivery of the turn lk names.
func (c *wsConn) startDelivery(lk string) *wsDelivery {
	c.fmu.Lock()
	c.following[lk]++
	c.fmu.Unlock()
	return &wsDelivery{c: c, lk: lk}
}

// end ends the count of the delivery, once: before its last frame is
// written, so that a client that re-sends the turn as soon as it saw
// that frame is answered (a replay), not taken for a duplicate.
func (d *wsDelivery) end() {
	if d.ended {
		return
	}
	d.ended = true
	c := d.c
	c.fmu.Lock()
	if c.following[d.lk]--; c.following[d.lk] <= 0 {
		delete(c.following, d.lk)
	}
	c.fmu.Unlock()
}

// follow delivers the flight f, from sub, to the client on lane, until
// f ends or the client is gone, as the delivery dl.
func (c *wsConn) follow(f *cache.Flight, sub *cache.Sub, lane string, dl *wsDelivery) {
	defer c.delivered.Done()
	defer dl.end()
	defer sub.Close()
	terminal := false
	for {
		var at [maxParts][]byte
		spans, ended := sub.ReadSpans(at[:0])
		for _, s := range spans {
			if !c.frames(s, lane, &terminal, dl) {
				return
			}
		}
		if ended {
			if state, reason, _ := f.Outcome(); state != cache.StateCommitted && !terminal {
				dl.end()
				c.endFrame(lane, state, reason)
			}
			return
		}
		if len(spans) > 0 {
			continue
		}
		select {
		case <-sub.C():
		case <-c.gone:
			return
		}
	}
}

// deliverJournal delivers a stored turn's journal to the client on lane,
// as the delivery dl.
func (c *wsConn) deliverJournal(data []byte, lane string, dl *wsDelivery) {
	terminal := false
	c.frames(data, lane, &terminal, dl)
}

// frames writes the client the events of the journal span s as frames
// under lane, as the delivery dl (ended before the turn's terminal event
// goes); terminal is set once a terminal event went. It reports whether
// the client took them.
func (c *wsConn) frames(s []byte, lane string, terminal *bool, dl *wsDelivery) bool {
	sc := sse.NewScanner(bytes.NewReader(s), len(s)+1)
	for sc.Next() {
		ev := sc.Event()
		if ev.Data == "" {
			continue
		}
		msg := []byte(ev.Data)
		if lane == "" {
			msg, _ = sjson.DeleteBytes(msg, "stream_id")
		} else {
			msg, _ = sjson.SetBytes(msg, "stream_id", lane)
		}
		*terminal = *terminal || wsTerminal(ev.Type) || ev.Type == "error"
		if wsTerminal(ev.Type) {
			dl.end()
		}
		if !c.toClient(msg) {
			return false
		}
	}
	return true
}

// endFrame writes the error frame of a turn that ended in state, for
// reason, without its terminal event: the outcome-unknown one, or the
// failure's.
func (c *wsConn) endFrame(lane string, state cache.State, reason string) {
	c.toClient(failedAnswer(state, reason).wsFrame(lane))
}
