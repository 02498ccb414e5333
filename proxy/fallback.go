package proxy

import (
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// Model fallback (-fallback): when every attempt for the request's model
// failed in a way that says the model did not run it, gen.run tries the
// next model of the model's rule, by rewriting the body's top-level
// "model", on the same upstreams and path. The key, its fingerprint and
// its flight stay the client's request's.

// models returns the request's model and the models its -fallback rule
// names after it; only the request's model when it has none, or when the
// request's body names none at its top level. A body that names "model"
// twice never gets here (refuseDuplicate), so the one withModel rewrites
// is the one the upstream reads.
func (g *gen) models(body []byte) []string {
	m := g.req.Model
	to, ok := g.p.cfg.Fallbacks[m]
	if !ok {
		to = g.p.cfg.Fallbacks["*"]
	}
	if len(to) == 0 {
		return []string{m} // no rule: the body need not be parsed again
	}
	if v := gjson.GetBytes(body, "model"); m == "" || v.Type != gjson.String || v.Index <= 0 {
		return []string{m}
	}
	out := []string{m}
	for _, t := range to {
		if t != m && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// fallBack decides whether the request goes on to model next after the
// attempts for model failed as a says: only for a failure that says the
// model did not run the request (causeRow.fallback: a 429 or 5xx, a
// connect error, an error event before any other, every circuit open) or
// a 400 with one of -fallback-on-code's codes. run never asks after an
// ambiguous failure of any attempt (mayHaveRun), which may have left a
// generation running or run: a fallback would be a second. A fallback is
// bounded by -retry-max-elapsed but never refused by the retry budget: it
// is the first call to another model, not a repeat to the failing one,
// and in an outage the budget is spent just when the fallback is needed.
func (g *gen) fallBack(a attempt, model, next string, calls int) bool {
	p, f := g.p, g.f
	if g.mayRun { // set by attempts for a too when it was marked or of an ambiguous status
		return false // the request may be running or have run: a fallback would be a second generation
	}
	if !causes[a.cause].fallback && a.fallbackCode == "" {
		return false
	}
	reason := a.reason()
	if time.Since(g.start) > p.cfg.Retry.MaxElapsed {
		p.hooks.retryRefused("max_elapsed")
		p.log.Warn("no fallback", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "model", model,
			"next", next, "reason", reason, "why", "max_elapsed")
		return false
	}
	p.log.Info("fallback", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "from", model, "to", next,
		"reason", reason, "attempts", calls)
	return true
}

// withModel returns a copy of tmpl whose JSON body names model at its
// top-level "model" (models ensures there is one).
func withModel(tmpl *fasthttp.Request, model string) *fasthttp.Request {
	r := fasthttp.AcquireRequest()
	tmpl.CopyTo(r)
	body := tmpl.Body()
	v := gjson.GetBytes(body, "model")
	q, _ := json.Marshal(model)
	out := make([]byte, 0, len(body)+len(q))
	out = append(out, body[:v.Index]...)
	out = append(out, q...)
	out = append(out, body[v.Index+len(v.Raw):]...)
	r.SetBody(out)
	return r
}

// refuseDuplicate answers a request whose body holds a member the proxy
// acts on (sse.Request.Duplicate names it) more than once: 400
// invalid_request, before any upstream work. Parsers differ on which
// duplicate counts (encoding/json and Python's json take the last, others
// the first), so the proxy cannot know which "model" the upstream would
// run, or which "stream" it would answer: it would decide, rewrite
// (-fallback) or judge the stream by one the upstream may not read.
func (p *Proxy) refuseDuplicate(ctx *fasthttp.RequestCtx, member string) {
	p.refuse(ctx, causeMalformedRequest, "the body's "+strconv.Quote(member)+" appears more than once")
}
