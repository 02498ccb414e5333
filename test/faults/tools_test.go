package faults_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ssegate/ssegate/internal/mcpmock"
	"github.com/valyala/fasthttp"
)

// The round's MCP tool calls: specs of tools/call requests to the write
// tool of internal/mcpmock (the MCP Go SDK's server), sent to ssegate on
// -mcp-path /mcp beside the LLM load, with faults of their own at the
// server and clients that leave mid-call and re-issue with a new JSON-RPC
// id. The oracle is the tool's side-effect counter: a keyed tool call
// runs at most once, whatever the faults (invariant 6).

// toolFault is what the server does with one tools/call.
type toolFault int

const (
	tNone      toolFault = iota // the server runs it and answers whole
	t503                        // 503 before the server saw it: not run
	tRPCError                   // a JSON-RPC error before the tool ran: not run
	tResetHead                  // the connection reset before any answer: not run, but ssegate cannot know
	tDie                        // the server ran it and died mid-answer
	tHang                       // the server ran it and no answer came
)

var toolFaultNames = [...]string{"none", "503", "jsonrpc-error", "reset-head", "die", "hang"}

func (f toolFault) String() string { return toolFaultNames[f] }

// toolSpec is one tool-call intent: its key (also the tool's target, so
// that the server's counter is per intent), how the server answers, and
// its clients.
type toolSpec struct {
	name    string
	keyed   bool
	meta    bool // the key in params._meta rather than the Idempotency-Key header
	json    bool // the server answers application/json, not SSE
	ms      int  // how long the tool runs
	faults  []toolFault
	clients []*toolScript
}

func (s *toolSpec) describe() string {
	return fmt.Sprintf("tool call %s (keyed %v, _meta %v, JSON %v, %d ms, faults %v)", s.name, s.keyed, s.meta, s.json, s.ms, s.faults)
}

// fault is what the server does with the spec's n-th call (from 1).
func (s *toolSpec) fault(n int) toolFault {
	if n <= len(s.faults) {
		return s.faults[n-1]
	}
	return tNone
}

// toolScript is one tool-call client: when it calls, whether it leaves
// mid-call, and its re-issue after it left.
type toolScript struct {
	at        time.Duration // after the round's start; for a re-issue, after the left call
	dropAfter time.Duration // 0: it waits for the answer
	next      *toolScript
}

// Plan sizes of the tool calls.
const (
	keyedTools   = 10
	unkeyedTools = 3
)

// drawTools draws the round's tool calls.
func drawTools(r *rand.Rand, seed int64) []*toolSpec {
	var out []*toolSpec
	for i := range keyedTools + unkeyedTools {
		s := &toolSpec{keyed: i < keyedTools, meta: r.IntN(2) == 0, json: r.IntN(2) == 0, ms: 200 + r.IntN(500)}
		s.name = fmt.Sprintf("t%d-%d", seed, i)
		if !s.keyed {
			s.name = fmt.Sprintf("tu%d-%d", seed, i)
		}
		if r.IntN(10) >= 3 {
			all := []toolFault{t503, tRPCError, tResetHead, tDie, tHang}
			for range 1 + r.IntN(2) {
				s.faults = append(s.faults, all[r.IntN(len(all))])
			}
		}
		for range 1 + r.IntN(4) {
			sc := &toolScript{at: time.Duration(r.IntN(int(startWindow/time.Millisecond))) * time.Millisecond}
			if r.IntN(10) < 3 {
				sc.dropAfter = time.Duration(s.ms/4+r.IntN(s.ms)) * time.Millisecond
				sc.next = &toolScript{at: time.Duration(50+r.IntN(250)) * time.Millisecond}
			}
			s.clients = append(s.clients, sc)
		}
		out = append(out, s)
	}
	return out
}

// toolCall is one call the server got for a spec.
type toolCall struct {
	n      int
	origin string
	fault  toolFault
}

// tools is the MCP server the proxy calls on /mcp: two internal/mcpmock
// servers (SSE and JSON answers, without sessions) behind the faults.
type tools struct {
	plan   map[string]*toolSpec
	sse    *mcpmock.Server
	json   *mcpmock.Server
	urls   [2]string // the SSE and the JSON server's /mcp
	hc     *http.Client
	faults *upstream // for its hijack and its closing

	mu      sync.Mutex // guards calls, unknown
	calls   map[string][]toolCall
	unknown []string
}

func newTools(specs []*toolSpec, u *upstream) (*tools, error) {
	t := &tools{plan: map[string]*toolSpec{}, calls: map[string][]toolCall{}, faults: u,
		hc: &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 64}}}
	for _, s := range specs {
		t.plan[s.name] = s
	}
	// Progress every 50 ms or so, whatever the call's ms.
	t.sse = mcpmock.New(mcpmock.Config{Stateless: true, Steps: 4})
	t.json = mcpmock.New(mcpmock.Config{Stateless: true, JSON: true, Steps: 4})
	for i, m := range []*mcpmock.Server{t.sse, t.json} {
		base, err := m.Start("127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		t.urls[i] = base + mcpmock.Path
	}
	return t, nil
}

// runs is how often the spec's tool ran.
func (t *tools) runs(s *toolSpec) int64 {
	if s.json {
		return t.json.Runs(s.name)
	}
	return t.sse.Runs(s.name)
}

func (t *tools) callsOf(name string) []toolCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]toolCall(nil), t.calls[name]...)
}

func (t *tools) closeIdle() { t.hc.CloseIdleConnections() }

func (t *tools) close() {
	t.hc.CloseIdleConnections()
	t.sse.Close()
	t.json.Close()
}

// handle answers a tools/call the proxy sent, with the spec's fault for
// this call.
func (t *tools) handle(ctx *fasthttp.RequestCtx) {
	origin := string(ctx.Request.Header.Peek(originHeader))
	name, _, _ := strings.Cut(origin, "/")
	s := t.plan[name]
	f, url := tNone, t.urls[0]
	if s == nil {
		if origin != warmupOrigin {
			t.mu.Lock()
			t.unknown = append(t.unknown, fmt.Sprintf("%s %s (%s: %q)", ctx.Method(), ctx.Path(), originHeader, origin))
			t.mu.Unlock()
			ctx.SetStatusCode(fasthttp.StatusNotFound)
			return
		}
	} else {
		t.mu.Lock()
		c := toolCall{n: len(t.calls[name]) + 1, origin: origin}
		c.fault = s.fault(c.n)
		t.calls[name] = append(t.calls[name], c)
		t.mu.Unlock()
		f = c.fault
		if s.json {
			url = t.urls[1]
		}
	}
	switch f {
	case t503:
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetContentType("text/plain")
		ctx.SetBodyString("overloaded")
		return
	case tRPCError:
		var msg struct {
			ID json.RawMessage `json:"id"`
		}
		_ = json.Unmarshal(ctx.Request.Body(), &msg)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"jsonrpc":"2.0","id":` + string(msg.ID) + `,"error":{"code":-32603,"message":"the server is restarting"}}`)
		return
	case tResetHead:
		t.faults.hijack(ctx, resetConn)
		return
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(ctx.Request.Body()))
	if err != nil {
		ctx.SetStatusCode(fasthttp.StatusBadGateway)
		return
	}
	for k, v := range ctx.Request.Header.All() {
		if ks := string(k); strings.HasPrefix(strings.ToLower(ks), "mcp-") || ks == "Accept" || ks == "Content-Type" {
			req.Header.Set(ks, string(v))
		}
	}
	switch f {
	case tDie:
		// The tool runs; its caller gets the answer's head and first
		// event (SSE) or nothing (JSON), then a reset.
		t.faults.hijack(ctx, func(conn net.Conn) {
			defer resetConn(conn)
			resp, err := t.hc.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			if s.json {
				_, _ = io.Copy(io.Discard, resp.Body)
				return
			}
			first, err := bufio.NewReader(resp.Body).ReadString('\n')
			if err != nil {
				return
			}
			fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(first), first)
		})
	case tHang:
		// The tool runs to its end; its answer never comes, until the
		// proxy gives up on the connection (bounded).
		t.faults.hijack(ctx, func(conn net.Conn) {
			defer conn.Close()
			if resp, err := t.hc.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			_ = conn.SetReadDeadline(time.Now().Add(hangLimit))
			_, _ = io.Copy(io.Discard, conn)
		})
	default:
		resp, err := t.hc.Do(req)
		if err != nil {
			ctx.SetStatusCode(fasthttp.StatusBadGateway)
			return
		}
		ctx.SetStatusCode(resp.StatusCode)
		ctx.SetContentType(resp.Header.Get("Content-Type"))
		ctx.Response.ImmediateHeaderFlush = true
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			defer resp.Body.Close()
			buf := make([]byte, 4096)
			for {
				n, err := resp.Body.Read(buf)
				if n > 0 {
					_, _ = w.Write(buf[:n])
					if w.Flush() != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	}
}

// toolExchange is one tools/call a client made and what it got.
type toolExchange struct {
	spec    *toolSpec
	origin  string
	id      int
	token   string
	status  int
	err     error
	dropped bool
	msgs    []rpcMessage // the JSON-RPC messages it got, in order
}

// rpcMessage is the part of a JSON-RPC message the checks read.
type rpcMessage struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  struct {
		ProgressToken json.RawMessage `json:"progressToken"`
	} `json:"params"`
	Result *struct {
		IsError bool `json:"isError"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"result"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func (x *toolExchange) String() string {
	return fmt.Sprintf("%s (id %d)", x.origin, x.id)
}

// got says what the exchange got, for failure messages.
func (x *toolExchange) got() string {
	if x.err != nil {
		return fmt.Sprintf("error %v (dropped %v)", x.err, x.dropped)
	}
	var parts []string
	for _, m := range x.msgs {
		b, _ := json.Marshal(m)
		parts = append(parts, string(b))
	}
	return fmt.Sprintf("status %d, dropped %v, messages %s", x.status, x.dropped, strings.Join(parts, " "))
}

// runTool runs a tool-call client's script, its re-issue after it left
// included, and returns its exchanges. Every call has its own JSON-RPC id
// and progress token.
func (cl *clients) runTool(begin time.Time, s *toolSpec, sc *toolScript, origin string, id int) []*toolExchange {
	waitTill(begin.Add(sc.at))
	var xs []*toolExchange
	for depth := 0; sc != nil; depth++ {
		x := &toolExchange{spec: s, origin: fmt.Sprintf("%s.%d", origin, depth), id: id*10 + depth}
		x.token = "p-" + x.origin
		cl.callTool(x, sc.dropAfter)
		xs = append(xs, x)
		if !x.dropped {
			break
		}
		if sc = sc.next; sc != nil {
			waitTill(time.Now().Add(sc.at))
		}
	}
	return xs
}

// callTool makes one tools/call, leaving after dropAfter when it is not 0.
func (cl *clients) callTool(x *toolExchange, dropAfter time.Duration) {
	s := x.spec
	// Protocol 2026-07-28 has no session: each request says who calls.
	meta := map[string]any{"io.modelcontextprotocol/protocolVersion": "2026-07-28", "progressToken": x.token,
		"io.modelcontextprotocol/clientCapabilities": map[string]any{}, "io.modelcontextprotocol/clientInfo": map[string]any{"name": "faults", "version": "1"}}
	if s.keyed && s.meta {
		meta["ssegate/idempotency-key"] = s.name
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": x.id, "method": "tools/call",
		"params": map[string]any{"name": "write", "arguments": map[string]any{"target": s.name, "ms": s.ms}, "_meta": meta}})
	ctx, cancel := context.WithTimeout(context.Background(), clientLimit)
	defer cancel()
	if dropAfter > 0 {
		t := time.AfterFunc(dropAfter, cancel)
		defer t.Stop()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cl.base+mcpmock.Path, bytes.NewReader(body))
	if err != nil {
		x.err = err
		return
	}
	req.Header.Set("Authorization", credential)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", "write")
	req.Header.Set(originHeader, x.origin)
	if s.keyed && !s.meta {
		req.Header.Set("Idempotency-Key", s.name)
	}
	resp, err := cl.hc.Do(req)
	if err != nil {
		x.err, x.dropped = err, dropAfter > 0 && errors.Is(err, context.Canceled)
		return
	}
	defer resp.Body.Close()
	x.status = resp.StatusCode
	b, err := io.ReadAll(resp.Body)
	if err != nil && dropAfter > 0 && errors.Is(err, context.Canceled) {
		x.dropped = true
	} else if err != nil {
		x.err = err
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var m rpcMessage
		// An HTTP error's JSON body is no JSON-RPC message.
		if json.Unmarshal(b, &m) == nil && m.JSONRPC == "2.0" {
			x.msgs = append(x.msgs, m)
		}
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		data, ok := strings.CutPrefix(line, "data:")
		if !ok {
			continue
		}
		var m rpcMessage
		if json.Unmarshal([]byte(strings.TrimSpace(data)), &m) == nil && m.JSONRPC == "2.0" {
			x.msgs = append(x.msgs, m)
		}
	}
}

// checkTools checks invariant 6 for every tool-call spec: a keyed call
// ran at most once; every message a caller got carries its own id and
// progress token; a result is the first run's for a keyed call; and a
// caller that stayed got a JSON-RPC answer or an HTTP error, never a
// stream that just stops. It returns a summary of what the callers got.
func checkTools(t *tools, xs map[*toolSpec][]*toolExchange, rep *report) string {
	var results, rpcErrors, httpErrors, left, total int64
	for _, s := range sortedTools(t.plan) {
		runs := t.runs(s)
		total += runs
		calls := t.callsOf(s.name)
		fail := func(format string, args ...any) {
			rep.add(6, nil, "%s, server calls %v, %d runs: %s", s.describe(), calls, runs, fmt.Sprintf(format, args...))
		}
		if s.keyed && runs > 1 {
			fail("the tool ran %d times; want at most once", runs)
		}
		if s.keyed && len(s.faults) == 0 && runs != 1 {
			fail("the tool ran %d times before a server without faults; want once", runs)
		}
		for _, x := range xs[s] {
			var answer *rpcMessage
			for i := range x.msgs {
				m := &x.msgs[i]
				if m.Method == "notifications/progress" {
					if tok := strings.Trim(string(m.Params.ProgressToken), `"`); tok != x.token {
						fail("%s got a progress notification for token %q; want its own %q", x, tok, x.token)
					}
					continue
				}
				if string(m.ID) != fmt.Sprint(x.id) {
					fail("%s got a message with id %s; want its own %d: %s", x, m.ID, x.id, x.got())
				}
				answer = m
			}
			if x.dropped {
				left++
				continue
			}
			if x.err != nil && !s.keyed {
				// An unkeyed call is relayed as it is, not held to an
				// answer: a server that cut or never gave its answer
				// leaves its caller cut too, and nothing else may.
				if cutBy(calls, x.origin) {
					left++
				} else {
					fail("%s (unkeyed) was cut while its server was not: %s", x, x.got())
				}
				continue
			}
			if x.err != nil {
				fail("%s stayed and got no answer: %s", x, x.got())
				continue
			}
			switch {
			case answer != nil && answer.Result != nil:
				results++
				want := fmt.Sprintf("wrote %s (run 1)", s.name)
				if len(answer.Result.Content) != 1 || (s.keyed && answer.Result.Content[0].Text != want) {
					fail("%s got the result %s; want %q", x, x.got(), want)
				}
			case answer != nil && answer.Error != nil:
				rpcErrors++
			case x.status >= 400:
				httpErrors++
			default:
				fail("%s got no JSON-RPC answer: %s", x, x.got())
			}
		}
	}
	return fmt.Sprintf("tool calls: %d results, %d JSON-RPC errors, %d HTTP errors, %d left mid-call or cut with the server, %d runs",
		results, rpcErrors, httpErrors, left, total)
}

// cutBy reports whether the server cut or withheld its answer to a call
// made for origin.
func cutBy(calls []toolCall, origin string) bool {
	for _, c := range calls {
		if c.origin == origin && (c.fault == tDie || c.fault == tHang || c.fault == tResetHead) {
			return true
		}
	}
	return false
}

func sortedTools(m map[string]*toolSpec) []*toolSpec {
	out := slices.Collect(maps.Values(m))
	slices.SortFunc(out, func(a, b *toolSpec) int { return strings.Compare(a.name, b.name) })
	return out
}
