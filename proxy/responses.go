package proxy

import (
	"bytes"
	"errors"
	"strconv"
	"strings"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// OpenAI's own resume API, served from the journal: a keyed Responses
// stream's id (from its response.created event) becomes an alias of its
// key, and GET /v1/responses/{id}?stream=true&starting_after=N from the
// same tenant is answered with the events whose sequence_number is above
// N, from the live generation or the stored one, then live to the end —
// with or without background: true at the provider. Without stream=true
// it answers the response object of the latest event that carries one
// (response.completed's, once committed). An id the store does not know
// for the tenant goes to the upstream unchanged, so the provider's own
// background resume keeps working through the proxy.

// responseCreated reads the id of a Responses stream from its
// response.created event ev, once for both of its uses: the healer h
// (nil unless the stream can be healed) resumes the response by it, and
// for a keyed flight it becomes an alias of the key (unkeyed flights have
// nothing to resume by) when pre, the attempt's preamble, is released:
// an attempt that fails before it (made again, or fallen back from) had
// an id the upstream ran nothing more under, and that must not name the
// answer another attempt gives. A stream with neither use is not read at
// all. The event's sequence number is det's, which has just observed ev.
func (g *gen) responseCreated(ev sse.Event, det *sse.Detector, h *healer, pre *preamble) {
	_, alias := g.p.store.(aliasStore)
	alias = alias && g.f.Gen != 0
	if h == nil && !alias {
		return
	}
	v := gjson.Get(ev.Data, "response.id")
	if v.Type != gjson.String || v.Str == "" || len(v.Str) > 256 {
		return
	}
	id := strings.Clone(v.Str) // ev.Data belongs to the reader
	if h != nil {
		h.id = id
	}
	if alias {
		pre.alias = id
		pre.aliasBase, _ = det.LastSequence()
	}
}

// responseID returns the {id} of GET …/responses/{id}, or "".
func responseID(path string) string {
	i := strings.LastIndex(path, "/responses/")
	if i < 0 {
		return ""
	}
	id := path[i+len("/responses/"):]
	if id == "" || strings.ContainsRune(id, '/') {
		return ""
	}
	return id
}

// serveResponseGet answers GET /v1/responses/{id} from the journal when id
// is an alias of one of the tenant's keys; it reports false, having
// answered nothing, when it is not.
func (p *Proxy) serveResponseGet(ctx *fasthttp.RequestCtx, id string) bool {
	as, ok := p.store.(aliasStore)
	if !ok {
		return false
	}
	tenant, ok := p.keyTenant(ctx)
	if !ok {
		return false // the upstream answers it, as any id unknown here
	}
	a, ok := as.ResolveAlias(tenant, id)
	if !ok {
		return false
	}
	inBody := sse.ParseRequest(ctx.Request.Body())
	if inBody.Duplicate != "" {
		p.refuseDuplicate(ctx, inBody.Duplicate)
		return true
	}
	q := ctx.QueryArgs()
	var after uint64 // the journal's position: events after it are served
	if v := q.Peek("starting_after"); v != nil {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			p.refuse(ctx, causeInvalidStartingAfter, "it is not a number")
			return true
		}
		if n < 0 {
			// OpenAI's answer too: a sequence number is never negative.
			p.refuse(ctx, causeInvalidStartingAfter, "it is negative")
			return true
		}
		if base := max(a.Base, 0); n >= base {
			after = uint64(n-base) + 1 // no overflow: 0 <= n-base
		}
	}
	// The tail this opens is charged to the request's accounts, as any
	// keyed request's, and a request past MaxCredentials is refused: a
	// scope of the tenant alone would let a credential the upstream
	// ignores make a new account for every tail.
	sc, ok := p.scope(ctx, a.Key)
	if !ok {
		return true
	}
	f, r, err := p.store.Attach(sc, "", sse.ID{Gen: a.Gen, Seq: after}, true)
	switch {
	case errors.Is(err, cache.ErrGone), errors.Is(err, cache.ErrNotFound):
		return false // another generation holds the key now: the name is the upstream's
	case errors.Is(err, cache.ErrPosition):
		p.refuse(ctx, causeInvalidStartingAfter, "it names an event this response never had")
		return true
	case err != nil:
		p.storeError(ctx, sc, err)
		return true
	}
	p.offerResume(ctx, sc, a.Gen)
	p.logDecision(ctx, decisionResume, sc, "", "generation", a.Gen, "after", after, "response_id", id)
	// openai-go's GetStreaming says stream in a JSON body of its GET; the
	// API documents it as a query parameter.
	if !q.GetBool("stream") && !inBody.Stream {
		p.responseObject(ctx, f, r)
		return true
	}
	if r != nil && r.Head.Stream {
		if rest, err := r.After(after); err == nil && len(rest) == 0 {
			// starting_after names the last event: OpenAI answers the
			// stream with the events after it, none, and its end. (GET
			// /streams/{key} answers 204 there instead, which stops a
			// browser's EventSource from reconnecting.)
			writeHead(ctx, r.Head, true)
			p.stream(ctx, func(c *clientConn) bool { return c.write(nil) == nil }, nil)
			return true
		}
	}
	p.serveAttached(ctx, f, r, after)
	return true
}

// responseObject answers the response object of the latest journaled
// event that carries one: response.completed's once the stream is
// committed, response.created's or response.in_progress's while it runs.
// A live journal is read span by span (Sub.Read gives one block at a
// time) to its end.
func (p *Proxy) responseObject(ctx *fasthttp.RequestCtx, f *cache.Flight, r *cache.Result) {
	var last string
	scan := func(journal []byte) {
		for ev, err := range sse.Read(bytes.NewReader(journal), len(journal)+1) {
			if err != nil {
				break
			}
			if o := gjson.Get(ev.Data, "response"); o.IsObject() {
				last = o.Raw
			}
		}
	}
	if r != nil {
		journal, _ := r.After(0)
		scan(journal)
	} else if sub, err := f.Subscribe(0); err == nil {
		for span, _ := sub.Read(); len(span) > 0; span, _ = sub.Read() {
			scan(span)
		}
		sub.Close()
	}
	if last == "" {
		p.writeError(ctx, causeStreamNotFound.err("no event of this response carries its object yet"))
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBodyString(last)
}
