package mockllm

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Bounds on the Responses the mock keeps for GET /v1/responses/{id}:
// at most maxKept, each for keepFor after it was created.
const (
	maxKept = 10_000
	keepFor = 10 * time.Minute
)

// kept is one Responses stream the mock remembers. A background one keeps
// what renders its events (the dialect is deterministic, so the events a
// resume sends are the very events the first stream sent), its delay and
// its fault, which fires at the same event of the response whatever stream
// reaches it. A response that is not a background one is only remembered,
// so that a GET for it is told it cannot be streamed, as OpenAI tells it.
type kept struct {
	d          *responses // nil for a response that is not a background one
	delay      time.Duration
	fault      fault
	background bool
	at         time.Time
}

// keptResponses is the bounded map of kept responses, oldest first in
// order.
type keptResponses struct {
	mu    sync.Mutex
	m     map[string]kept
	order []string
}

// keep remembers response id.
func (k *keptResponses) keep(id string, e kept) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = make(map[string]kept)
	}
	k.expire(e.at)
	for len(k.m) >= maxKept && len(k.order) > 0 {
		delete(k.m, k.order[0])
		k.order = k.order[1:]
	}
	k.m[id] = e
	k.order = append(k.order, id)
}

// expire drops the responses kept for longer than keepFor.
func (k *keptResponses) expire(now time.Time) {
	n := 0
	for _, id := range k.order {
		if e, ok := k.m[id]; ok && now.Sub(e.at) > keepFor {
			delete(k.m, id)
			n++
			continue
		}
		break
	}
	k.order = k.order[n:]
}

func (k *keptResponses) get(id string) (kept, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.m[id]
	if ok && time.Since(e.at) > keepFor {
		return kept{}, false
	}
	return e, ok
}

func (k *keptResponses) forget() {
	k.mu.Lock()
	defer k.mu.Unlock()
	clear(k.m)
	k.order = nil
}

// ForgetResponses drops every kept response: a later GET
// /v1/responses/{id} is a 404, as for an id the upstream never made.
func (s *Server) ForgetResponses() { s.kept.forget() }

// serveRetrieve answers GET /v1/responses/{id}: with stream=true the
// events of a background response whose sequence_number is above
// starting_after, to its end (a resume: no new generation), otherwise the
// response object.
func (s *Server) serveRetrieve(ctx *fasthttp.RequestCtx, id string) {
	if !ctx.IsGet() {
		ctx.Response.Header.Set("Allow", "GET")
		writeRouteError(ctx, fasthttp.StatusMethodNotAllowed, "method_not_allowed", "use GET for /v1/responses/{id}")
		return
	}
	e, ok := s.kept.get(id)
	if !ok {
		writeError(ctx, openAI, fasthttp.StatusNotFound, "No response found with id '"+id+"'.")
		return
	}
	args := ctx.QueryArgs()
	if string(args.Peek("stream")) != "true" {
		if e.d == nil {
			writeError(ctx, openAI, fasthttp.StatusNotFound, "No response found with id '"+id+"'.")
			return
		}
		writeJSON(ctx, fasthttp.StatusOK, e.d.appendBody(nil))
		return
	}
	if !e.background {
		writeError(ctx, openAI, fasthttp.StatusBadRequest, "Response "+id+" cannot be streamed because it was not created with background=true.")
		return
	}
	from := 0
	if v := args.Peek("starting_after"); v != nil {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < -1 {
			writeError(ctx, openAI, fasthttp.StatusBadRequest, "starting_after: "+strconv.Quote(string(v))+" is not a sequence number")
			return
		}
		from = n + 1
	}
	s.resumes.Add(1)
	f := e.fault
	if !f.afterEvents() || from >= f.n {
		f = fault{} // fired already, at its own event of the response
	}
	st := &stream{d: e.d, from: from, delay: e.delay, fault: f, closing: s.closing, hangLimit: s.cfg.HangLimit}
	s.serveStream(ctx, st)
}

// responseID returns the id of a /v1/responses/{id} path.
func responseID(path string) (string, bool) {
	id, ok := strings.CutPrefix(path, "/v1/responses/")
	return id, ok && id != "" && !strings.Contains(id, "/")
}
