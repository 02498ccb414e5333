package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"

	"github.com/ssegate/ssegate/cache"
	"github.com/valyala/fasthttp"
)

// outcomeHeader, set to "unknown", marks every answer whose request was
// sent upstream and whose outcome cannot be known (the key is left
// commit_unknown). A client, an ssegate in front, never repeats such an
// answer: the upstream may have run the request, and a repeat may be a
// second paid generation (docs/design.md, Upstream retries).
const outcomeHeader = "Ssegate-Outcome"

// storedHeader, set to "false", marks an answer received whole from the
// upstream that the store could not keep: the client that caused it gets
// it, and a repeat of the key will not find it.
const storedHeader = "Ssegate-Stored"

// markUnknown sets the outcome-unknown marker on an answer's head, and
// takes away any Retry-After: nothing about it says "try again".
func markUnknown(rh *fasthttp.ResponseHeader) {
	rh.Set(outcomeHeader, "unknown")
	rh.Del("Retry-After")
}

// refuse answers a request refused for c before any decision was taken
// on it, counts it under the cause's refusal decision, and logs it.
// detail, when not empty, follows the table's message.
func (p *Proxy) refuse(ctx *fasthttp.RequestCtx, c cause, detail string, attrs ...any) {
	p.hooks.decided(ctx, causes[c].refusal, 0)
	p.writeError(ctx, c.err(detail), attrs...)
}

// writeError answers e as JSON and logs it. A request refused before its
// decision goes through refuse, which also counts it.
func (p *Proxy) writeError(ctx *fasthttp.RequestCtx, e *apiError, attrs ...any) {
	fillError(&ctx.Response, e)
	p.logRefused(e, string(ctx.Method()), string(ctx.Path()), attrs...)
}

// fillError makes resp the JSON answer of e.
func fillError(resp *fasthttp.Response, e *apiError) {
	resp.Reset()
	resp.SetStatusCode(e.status)
	resp.Header.SetContentType("application/json")
	if e.unknown {
		markUnknown(&resp.Header)
	} else if e.retryAfter > 0 {
		resp.Header.Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	b, _ := json.Marshal(errorBody{Error: errorFields{Type: e.typ, Message: e.message}})
	resp.SetBody(b)
}

func (p *Proxy) logRefused(e *apiError, method, path string, attrs ...any) {
	level := slog.LevelInfo
	if e.status >= 500 {
		level = slog.LevelWarn
	}
	p.log.Log(context.Background(), level, "request refused", append([]any{
		"status", e.status, "type", e.typ, "reason", e.cause.String(), "msg", e.message, "method", method, "path", path,
	}, attrs...)...)
}

// storeError answers a failure of the store itself, or a bound it holds,
// for the key of sc. The answer's message is the cause's fixed text: the
// store's error (a Redis client's names addresses, users and the server's
// own words) goes to the log only, beside the key and the tenant's hash.
func (p *Proxy) storeError(ctx *fasthttp.RequestCtx, sc cache.Scope, err error) {
	c := causeStoreUnavailable
	switch {
	case errors.Is(err, cache.ErrTenantFull):
		// Only this credential's new keys are refused: its known keys,
		// and every other credential's, are decided as usual.
		c = causeTenantFull
	case errors.Is(err, cache.ErrStoreFull):
		c = causeStoreFull
	}
	p.refuse(ctx, c, "", "key", sc.Key, "tenant", sc.Tenant, "err", err.Error())
}
