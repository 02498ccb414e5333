package mockllm

import (
	"bufio"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// endpoint is one model endpoint.
type endpoint int

const (
	chatEndpoint endpoint = iota
	messagesEndpoint
	responsesEndpoint
)

// Default models, for requests that name none.
const (
	defaultOpenAIModel    = "gpt-4o-mini"
	defaultAnthropicModel = "claude-sonnet-4-5"
)

// modelList is the body of GET /v1/models.
const modelList = `{"object":"list","data":[` +
	`{"id":"gpt-4o-mini","object":"model","created":1721172741,"owned_by":"mockllm"},` +
	`{"id":"gpt-4o","object":"model","created":1715367049,"owned_by":"mockllm"},` +
	`{"id":"claude-sonnet-4-5","object":"model","created":1759104000,"owned_by":"mockllm"}]}`

// Handler is the fasthttp request handler of the mock. It works with any
// fasthttp.Server, including one on a fasthttputil in-memory listener;
// Close still ends its streams.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	var ep endpoint
	switch string(ctx.Path()) {
	case "/v1/chat/completions":
		ep = chatEndpoint
	case "/v1/messages":
		ep = messagesEndpoint
	case "/v1/responses":
		if isWebSocket(ctx) {
			s.serveWebSocket(ctx)
			return
		}
		ep = responsesEndpoint
	case "/v1/models":
		if !ctx.IsGet() && !ctx.IsHead() {
			ctx.Response.Header.Set("Allow", "GET")
			writeRouteError(ctx, fasthttp.StatusMethodNotAllowed, "method_not_allowed", "use GET for /v1/models")
			return
		}
		writeJSON(ctx, fasthttp.StatusOK, []byte(modelList))
		return
	default:
		if id, ok := responseID(string(ctx.Path())); ok {
			s.serveRetrieve(ctx, id)
			return
		}
		writeRouteError(ctx, fasthttp.StatusNotFound, "not_found", "no endpoint at "+string(ctx.Path()))
		return
	}
	if !ctx.IsPost() {
		ctx.Response.Header.Set("Allow", "POST")
		writeRouteError(ctx, fasthttp.StatusMethodNotAllowed, "method_not_allowed", "use POST for "+string(ctx.Path()))
		return
	}
	s.calls.Add(1)

	p, model := openAI, defaultOpenAIModel
	if ep == messagesEndpoint {
		p, model = anthropic, defaultAnthropicModel
	}
	opts, err := parseOptions(&s.cfg, &ctx.Request.Header)
	if err != nil {
		writeError(ctx, p, fasthttp.StatusBadRequest, err.Error())
		return
	}
	body := ctx.PostBody()
	req, err := parseRequest(body)
	if err != nil {
		writeError(ctx, p, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if mf := s.model(req.Model); opts.fault.kind == faultNone {
		opts.fault = mf
	}
	switch opts.fault.kind {
	case faultStatus:
		writeStatusFault(ctx, p, opts.fault.n)
		return
	case faultContext:
		writeContextFault(ctx, p)
		return
	case faultFilter:
		writeFilterFault(ctx, p)
		return
	}
	if req.Model != "" {
		model = req.Model
	}
	s.generations.Add(1)

	var d dialect
	switch ep {
	case chatEndpoint:
		limit := req.MaxTokens
		if req.MaxCompletionTokens > 0 {
			limit = req.MaxCompletionTokens // the newer name wins, as at OpenAI
		}
		d = newChat(newCompletion(body, model, opts.tokens, limit, opts.chunkBytes), req.StreamOptions.IncludeUsage)
	case messagesEndpoint:
		d = newMessages(newCompletion(body, model, opts.tokens, req.MaxTokens, opts.chunkBytes))
	default:
		r := newResponses(newCompletion(body, model, opts.tokens, req.MaxOutputTokens, opts.chunkBytes), req.MaxOutputTokens)
		if req.Stream {
			r.background = req.Background
			e := kept{background: req.Background, at: time.Now()}
			if req.Background {
				e.d, e.delay, e.fault = r, opts.delay, opts.fault
			}
			s.kept.keep(r.id, e)
		}
		d = r
	}

	st := &stream{
		d:         d,
		delay:     opts.delay,
		fault:     opts.fault,
		closing:   s.closing,
		hangLimit: s.cfg.HangLimit,
	}
	if req.Stream {
		s.serveStream(ctx, st)
	} else {
		s.serveBody(ctx, p, st)
	}
}

// serveStream answers with an event stream. The stream is written after the
// handler returns, by a goroutine that holds nothing of ctx.
func (s *Server) serveStream(ctx *fasthttp.RequestCtx, st *stream) {
	switch st.fault.kind {
	case faultReset, faultHang, faultHangAfter:
		// These need the connection itself: to reset it only once the
		// events before it are on the wire (fasthttp's stream writer hands
		// them to the connection through a pipe, so a Flush does not say
		// they were sent), or to notice a client that leaves while nothing
		// is written. So the stream takes the connection over and writes
		// HTTP itself.
		s.hijack(ctx, st.raw)
		return
	}
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.ImmediateHeaderFlush = true
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		if !s.enter() {
			return
		}
		defer s.leave()
		st.send(w, false)
	})
}

// serveBody answers with the non-streaming JSON body, after the time the
// stream would have taken. Stream faults map to their nearest whole-body
// equivalent: reset-after resets before any answer, eof-after closes before
// any answer, error-after is a 500, hang-after hangs.
func (s *Server) serveBody(ctx *fasthttp.RequestCtx, p provider, st *stream) {
	switch st.fault.kind {
	case faultHang, faultHangAfter:
		s.hijack(ctx, st.stall)
		return
	case faultReset:
		s.hijack(ctx, reset)
		return
	case faultEOF:
		s.hijack(ctx, func(c net.Conn) { _ = c.Close() })
		return
	case faultError:
		writeError(ctx, p, fasthttp.StatusInternalServerError, "The server had an error while processing your request. Sorry about that!")
		return
	}
	if st.delay > 0 {
		t := time.NewTimer(st.delay * time.Duration(st.d.events()))
		select {
		case <-t.C:
		case <-s.closing:
			t.Stop()
		}
	}
	writeJSON(ctx, fasthttp.StatusOK, st.d.appendBody(nil))
}

// hijack takes the connection over once the handler returns, without
// fasthttp writing a response, and runs f on it. f gets the connection
// fasthttp accepted (a *net.TCPConn under Start), not its hijack wrapper,
// so that it can set SO_LINGER.
func (s *Server) hijack(ctx *fasthttp.RequestCtx, f func(net.Conn)) {
	conn := ctx.Conn()
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(net.Conn) {
		if !s.enter() {
			return
		}
		defer s.leave()
		f(conn)
	})
}
