package mockllm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Config sets the mock's defaults. Its zero value is usable: 16 tokens an
// answer, as fast as possible, no padding.
type Config struct {
	// Tokens is the number of content tokens per completion; 0 means 16.
	// A request's max_tokens and X-Mock-Tokens override it.
	Tokens int
	// Delay is the pause before each event; 0 means as fast as possible.
	Delay time.Duration
	// ChunkBytes pads each content event to about this many bytes; 0 means
	// no padding (events are about the size real providers send).
	ChunkBytes int
	// HangLimit bounds the hang and hang-after faults; 0 means 60s.
	HangLimit time.Duration
	// ModelFaults gives a model a fault of its own, in X-Mock-Fault's
	// syntax (e.g. "status=503"), for every request naming it that does
	// not carry an X-Mock-Fault. Nil means DefaultModelFaults; SetModelFault
	// changes it while serving.
	ModelFaults map[string]string
}

// DefaultModelFaults are the models that cannot answer, so that a
// fallback can be shown against the mock alone: one that is down, one
// that is rate-limited, and one whose context is too small for any
// prompt.
var DefaultModelFaults = map[string]string{
	"mock-down":         "status=503",
	"mock-rate-limited": "status=429",
	"mock-small":        "context-length",
}

// Server is the mock upstream. Use Handler with a fasthttp.Server of your
// own, or Start to have the Server listen itself. Its methods are safe for
// concurrent use. A closed Server cannot be started again.
type Server struct {
	cfg         Config
	calls       atomic.Int64
	generations atomic.Int64 // answers begun: calls that were not refused
	resumes     atomic.Int64 // GET /v1/responses/{id}?stream=true served
	kept        keptResponses
	ws          wsState

	modelMu     sync.Mutex // guards modelFaults and modelCalls
	modelFaults map[string]fault
	modelCalls  map[string]int64

	// closing is closed by Close; every stream, stall and delay waits on it.
	closing chan struct{}

	// streams counts the goroutines that write streams or stall, which
	// outlive the handler; Close waits for them. active is the same count,
	// readable, for tests that check a stream ended when its client left.
	streams sync.WaitGroup
	active  atomic.Int64

	mu     sync.Mutex // guards closed, srv, served, and streams.Add against Close's Wait
	closed bool
	srv    *fasthttp.Server
	served chan struct{} // closed when srv.Serve returns

	connsMu sync.Mutex // guards conns
	conns   map[net.Conn]struct{}
}

// New returns a Server with the defaults in cfg.
func New(cfg Config) *Server {
	if cfg.HangLimit <= 0 {
		cfg.HangLimit = 60 * time.Second
	}
	s := &Server{cfg: cfg, closing: make(chan struct{}), conns: make(map[net.Conn]struct{}),
		modelFaults: map[string]fault{}, modelCalls: map[string]int64{}}
	faults := cfg.ModelFaults
	if faults == nil {
		faults = DefaultModelFaults
	}
	for model, spec := range faults {
		if err := s.SetModelFault(model, spec); err != nil {
			panic("mockllm: ModelFaults: " + err.Error())
		}
	}
	return s
}

// SetModelFault gives model the fault spec (X-Mock-Fault's syntax), or
// none when spec is empty, from the next request on.
func (s *Server) SetModelFault(model, spec string) error {
	s.modelMu.Lock()
	defer s.modelMu.Unlock()
	if spec == "" {
		delete(s.modelFaults, model)
		return nil
	}
	f, err := parseFault(spec)
	if err != nil {
		return fmt.Errorf("%s: %q: %w", model, spec, err)
	}
	s.modelFaults[model] = f
	return nil
}

// model counts a request for model and returns the model's fault.
func (s *Server) model(model string) fault {
	s.modelMu.Lock()
	defer s.modelMu.Unlock()
	s.modelCalls[model]++
	return s.modelFaults[model]
}

// CallsFor reports how many requests named model (the top-level "model"
// of the body; "" for none) since the start or ResetCalls.
func (s *Server) CallsFor(model string) int64 {
	s.modelMu.Lock()
	defer s.modelMu.Unlock()
	return s.modelCalls[model]
}

// ErrClosed is returned by Start on a Server that was closed.
var ErrClosed = errors.New("mockllm: server closed")

// Start listens on addr (e.g. "127.0.0.1:0") and serves in a goroutine
// until Close. It returns the base URL, e.g. "http://127.0.0.1:41234".
func (s *Server) Start(addr string) (baseURL string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", ErrClosed
	}
	if s.srv != nil {
		return "", errors.New("mockllm: server already started")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("mockllm: listen: %w", err)
	}
	srv := &fasthttp.Server{
		Handler: s.Handler,
		Name:    "mockllm",
		// Streams last as long as their tokens and delays make them, so no
		// read or write timeout may cut them; idle keep-alive connections
		// are closed by Shutdown and, failing that, by Close.
		Concurrency:     1 << 20,
		ReadBufferSize:  16 << 10, // room for long Authorization headers
		NoDefaultDate:   true,
		CloseOnShutdown: true,
		// Faults reset and abandon connections on purpose; fasthttp would
		// log every one of them.
		Logger:    nopLogger{},
		ConnState: s.trackConn,
	}
	s.srv = srv
	s.served = make(chan struct{})
	go func() {
		defer close(s.served)
		_ = srv.Serve(ln)
	}()
	return "http://" + loopbackAddr(ln.Addr()), nil
}

// loopbackAddr turns a listener address into one a local client can dial:
// a wildcard host becomes the loopback address of its family.
func loopbackAddr(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok || !ta.IP.IsUnspecified() {
		return a.String()
	}
	host := "127.0.0.1"
	if ta.IP.To4() == nil {
		host = "::1"
	}
	return net.JoinHostPort(host, fmt.Sprint(ta.Port))
}

// trackConn keeps the set of open connections, so that Close can cut those
// a graceful Shutdown would wait for forever (a client that sent half a
// request, say). Hijacked connections are the streams' own business.
func (s *Server) trackConn(c net.Conn, state fasthttp.ConnState) {
	switch state {
	case fasthttp.StateNew:
		s.connsMu.Lock()
		s.conns[c] = struct{}{}
		s.connsMu.Unlock()
	case fasthttp.StateHijacked, fasthttp.StateClosed:
		s.connsMu.Lock()
		delete(s.conns, c)
		s.connsMu.Unlock()
	}
}

// shutdownGrace is how long Close lets connections finish by themselves
// once the streams were told to end.
const shutdownGrace = time.Second

// Close ends open streams and stalls (their bodies end without a terminal
// event), stops the listener, and waits for the serving goroutine and for
// every stream goroutine. It is safe to call more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	srv, served := s.srv, s.served
	s.mu.Unlock()

	var err error
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		err = srv.ShutdownWithContext(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			s.connsMu.Lock()
			for c := range s.conns {
				_ = c.Close()
			}
			s.connsMu.Unlock()
			err = srv.Shutdown()
		}
		<-served
	}
	s.streams.Wait()
	return err
}

// enter registers a goroutine that will write a stream or stall, so that
// Close waits for it. It reports false once Close has begun, and then the
// goroutine must not start.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.streams.Add(1)
	s.active.Add(1)
	return true
}

// leave unregisters a goroutine registered by enter.
func (s *Server) leave() {
	s.active.Add(-1)
	s.streams.Done()
}

// Calls reports how many requests reached a model endpoint: every POST to
// /v1/chat/completions, /v1/messages or /v1/responses, whatever its outcome
// (faults and 400s included).
func (s *Server) Calls() int64 { return s.calls.Load() }

// Generations reports how many answers the mock began to generate: the
// calls that were not refused (X-Mock-Fault status, context-length and
// content-filter, and 400s, are not). A resume (GET
// /v1/responses/{id}?stream=true) is no generation and no call.
func (s *Server) Generations() int64 { return s.generations.Load() }

// Resumes reports how many background Responses streams were resumed
// (GET /v1/responses/{id}?stream=true, served).
func (s *Server) Resumes() int64 { return s.resumes.Load() }

// Active reports how many streams (and stalls) are being written now: a
// stream whose client went away ends at its next write, so a test can see
// that the proxy let go of an upstream connection.
func (s *Server) Active() int64 { return s.active.Load() }

// ResetCalls sets the Calls, Generations and Resumes counters to zero.
func (s *Server) ResetCalls() {
	s.calls.Store(0)
	s.generations.Store(0)
	s.resumes.Store(0)
	s.modelMu.Lock()
	clear(s.modelCalls)
	s.modelMu.Unlock()
}

// nopLogger discards fasthttp's log lines.
type nopLogger struct{}

func (nopLogger) Printf(string, ...any) {}
