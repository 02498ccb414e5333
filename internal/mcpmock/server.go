package mcpmock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Path is where the server answers MCP.
const Path = "/mcp"

// RunsPath answers GET ?target=T with T's runs as a decimal number, for
// tests in another process than the server's.
const RunsPath = "/runs"

// Config sets the server's behaviour. Its zero value answers with SSE
// streams, a write taking a second in four progress steps.
type Config struct {
	// JSON answers every request with application/json rather than an SSE
	// stream; progress notifications are then not sent.
	JSON bool
	// Delay is how long a write runs; 0 means a second. A call's ms
	// argument overrides it.
	Delay time.Duration
	// Steps is the number of progress notifications a write sends when its
	// caller asked for progress; 0 means 4.
	Steps int
	// Stateless serves without sessions (no Mcp-Session-Id), which the
	// SDK needs to speak protocol 2026-07-28; a stateful server speaks the
	// earlier revisions, with sessions.
	Stateless bool
}

// connHeader carries the request's connection number from the HTTP
// handler to the tool, which cannot see the connection otherwise.
const connHeader = "Mcpmock-Conn"

// Server is the mock MCP server. Its methods are safe for concurrent use.
type Server struct {
	cfg     Config
	handler http.Handler

	mu   sync.Mutex // guards runs
	runs map[string]int64

	connSeq atomic.Int64
	connsMu sync.Mutex // guards conns
	conns   map[string]net.Conn

	srv *http.Server
}

// New returns a Server with cfg's behaviour.
func New(cfg Config) *Server {
	if cfg.Delay <= 0 {
		cfg.Delay = time.Second
	}
	if cfg.Steps <= 0 {
		cfg.Steps = 4
	}
	s := &Server{cfg: cfg, runs: map[string]int64{}, conns: map[string]net.Conn{}}
	ms := mcp.NewServer(&mcp.Implementation{Name: "ssegate-mcpmock", Version: "1"}, nil)
	object := json.RawMessage(`{"type":"object","properties":{"target":{"type":"string"},"ms":{"type":"integer"},"die":{"type":"boolean"}},"required":["target"]}`)
	ms.AddTool(&mcp.Tool{Name: "write", Description: "A write with a side effect: counts a run for target.", InputSchema: object}, s.write)
	ms.AddTool(&mcp.Tool{Name: "refuse", Description: "Counts a run and answers isError.", InputSchema: object}, s.refuse)
	ms.AddTool(&mcp.Tool{Name: "reject", Description: "Counts a run and answers a JSON-RPC error.", InputSchema: object}, s.reject)
	ms.AddTool(&mcp.Tool{Name: "runs", Description: "How many runs target has had.", InputSchema: object}, s.count)
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return ms },
		&mcp.StreamableHTTPOptions{JSONResponse: cfg.JSON, Stateless: cfg.Stateless, DisableLocalhostProtection: true})
	mux := http.NewServeMux()
	mux.Handle(Path, s.track(sdk))
	mux.HandleFunc("GET "+RunsPath, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, s.Runs(r.URL.Query().Get("target")))
	})
	s.handler = mux
	return s
}

// Handler returns the server's HTTP handler, MCP on [Path]. Served by a
// server of the caller's own, a write's die cuts nothing unless the
// server's ConnContext is [Server.ConnContext].
func (s *Server) Handler() http.Handler { return s.handler }

type connKey struct{}

// ConnContext records each connection in its requests' context, so that
// a write with die can cut it; use it as http.Server.ConnContext.
func (s *Server) ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// track numbers each request's connection so that its tool can cut it.
func (s *Server) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(net.Conn)
		if c == nil {
			next.ServeHTTP(w, r)
			return
		}
		n := strconv.FormatInt(s.connSeq.Add(1), 10)
		r.Header.Set(connHeader, n)
		s.connsMu.Lock()
		s.conns[n] = c
		s.connsMu.Unlock()
		defer func() {
			s.connsMu.Lock()
			delete(s.conns, n)
			s.connsMu.Unlock()
		}()
		next.ServeHTTP(w, r)
	})
}

// Start listens on addr ("127.0.0.1:0" for a free port) and serves until
// Close. It returns the server's base URL; MCP is at that URL + [Path].
func (s *Server) Start(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("mcpmock: %w", err)
	}
	s.srv = &http.Server{Handler: s.handler, ConnContext: s.ConnContext, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

// Close stops a started server and cuts its connections.
func (s *Server) Close() error {
	if s.srv == nil {
		return nil
	}
	err := s.srv.Close()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// Runs returns how many times a tool ran for target.
func (s *Server) Runs(target string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[target]
}

// TotalRuns returns the runs of every target.
func (s *Server) TotalRuns() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int64, len(s.runs))
	for k, v := range s.runs {
		out[k] = v
	}
	return out
}

// args are the tools' arguments.
type args struct {
	Target string `json:"target"`
	MS     int    `json:"ms"`
	Die    bool   `json:"die"`
}

func parse(req *mcp.CallToolRequest) (args, error) {
	var a args
	if err := json.Unmarshal(req.Params.Arguments, &a); err != nil || a.Target == "" {
		return a, fmt.Errorf("arguments must be an object with a target")
	}
	return a, nil
}

// run counts one run for target and returns its number.
func (s *Server) run(target string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs[target]++
	return s.runs[target]
}

// Text returns the text content of a tool's result, for clients.
func Text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func text(format string, a ...any) []mcp.Content {
	return []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, a...)}}
}

func (s *Server) write(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	a, err := parse(req)
	if err != nil {
		return nil, err
	}
	n := s.run(a.Target)
	d := s.cfg.Delay
	if a.MS > 0 {
		d = time.Duration(a.MS) * time.Millisecond
	}
	tok := req.Params.GetProgressToken()
	step := d / time.Duration(s.cfg.Steps)
	for i := 1; i <= s.cfg.Steps; i++ {
		select {
		case <-time.After(step):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if tok != nil && !s.cfg.JSON {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok,
				Progress: float64(i), Total: float64(s.cfg.Steps), Message: "writing " + a.Target})
		}
		if a.Die {
			s.cut(req)
			return nil, errors.New("the server died mid-call")
		}
	}
	return &mcp.CallToolResult{Content: text("wrote %s (run %d)", a.Target, n),
		StructuredContent: map[string]any{"target": a.Target, "run": n}}, nil
}

// cut closes the connection of req's HTTP request, so that its caller
// gets no answer although the run began.
func (s *Server) cut(req *mcp.CallToolRequest) {
	if req.Extra == nil {
		return
	}
	s.connsMu.Lock()
	c := s.conns[req.Extra.Header.Get(connHeader)]
	s.connsMu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

func (s *Server) refuse(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	a, err := parse(req)
	if err != nil {
		return nil, err
	}
	n := s.run(a.Target)
	return &mcp.CallToolResult{IsError: true, Content: text("refused %s (run %d)", a.Target, n)}, nil
}

func (s *Server) reject(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	a, err := parse(req)
	if err != nil {
		return nil, err
	}
	n := s.run(a.Target)
	return nil, fmt.Errorf("rejected %s (run %d)", a.Target, n)
}

func (s *Server) count(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	a, err := parse(req)
	if err != nil {
		return nil, err
	}
	n := s.Runs(a.Target)
	return &mcp.CallToolResult{Content: text("%s: %d runs", a.Target, n),
		StructuredContent: map[string]any{"target": a.Target, "runs": n}}, nil
}
