package proxy

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ssegate/ssegate/sse"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/valyala/fasthttp"
)

// Healing upstream drops (docs/design.md): an OpenAI Responses stream
// asked for with "background": true lives on at the provider when the
// connection to it breaks, and GET /v1/responses/{id}?stream=true&
// starting_after=N streams its events after sequence number N. When such
// a stream's connection breaks after its first event (a read error, or the
// idle timeout), the generation reconnects that way, to the same
// upstream, and journals what follows into the same flight: one
// generation, its sequence numbers contiguous, judged whole by the same
// detector. Chat completions and Anthropic messages have no such resume,
// and abort as before.

// healAttempts bounds the reconnects after one drop; all of them also fit
// within -upstream-idle-timeout from the drop.
const healAttempts = 3

// maxHeals bounds the drops healed over one stream: an upstream that
// breaks every resumed connection ends the stream after as many.
const maxHeals = 5

// healBackoff is the pause before the second reconnect, doubled before
// each later one.
const healBackoff = 50 * time.Millisecond

// healer is what a healable stream needs to reconnect: the upstream and
// the request it answers, and the response id its response.created named.
type healer struct {
	up    *upstream.Upstream
	tmpl  *fasthttp.Request
	id    string
	heals int // drops healed so far
}

// healer returns the healer of an attempt on up with tmpl, or nil when
// the request's stream cannot be resumed: only a streamed Responses
// request made with "background": true can.
func (g *gen) healer(up *upstream.Upstream, tmpl *fasthttp.Request) *healer {
	if !g.req.Background || !g.req.Stream || !isResponsesPath(tmpl.URI().Path()) {
		return nil
	}
	return &healer{up: up, tmpl: tmpl}
}

// isResponsesPath reports whether path is the Responses endpoint.
func isResponsesPath(path []byte) bool {
	return strings.HasSuffix(strings.TrimSuffix(string(path), "/"), "/v1/responses")
}

// request is the resume of the stream after sequence number seq: GET
// {upstream}{path}/{id}?{query}&stream=true&starting_after=seq, with the
// original request's headers and query (its credentials, an Azure
// api-version) less the headers of its body.
func (h *healer) request(seq int64) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	h.tmpl.Header.CopyTo(&req.Header)
	for _, name := range []string{"Content-Type", "Content-Length", "Content-Encoding"} {
		req.Header.Del(name)
	}
	req.Header.SetMethod(fasthttp.MethodGet)
	path := strings.TrimSuffix(string(h.tmpl.URI().PathOriginal()), "/")
	req.SetRequestURI(path + "/" + url.PathEscape(h.id))
	q := req.URI().QueryArgs()
	h.tmpl.URI().QueryArgs().CopyTo(q)
	q.Set("stream", "true")
	q.Set("starting_after", strconv.FormatInt(seq, 10))
	return h.up.Prepare(req)
}

// healRefused is the failure of a heal the upstream answered with
// anything but an event stream: its status, or 200 for a 2xx of another
// kind.
type healRefused struct{ status int }

func (e *healRefused) Error() string {
	return "the upstream refused to resume the stream: status " + strconv.Itoa(e.status)
}

// heal reconnects the stream of h (not nil) whose read failed with
// readErr after its first event. It returns the resumed answer, now the
// generation's resp, or nil and the error the stream ends with: readErr
// when the stream cannot be healed or every reconnect failed, a
// *healRefused when the upstream answered otherwise than with the stream.
func (g *gen) heal(h *healer, det *sse.Detector, readErr error) (*fasthttp.Response, error) {
	reason := readFailure(readErr)
	if (reason != causeUpstreamReadError && reason != causeUpstreamIdleTimeout) ||
		h.id == "" || h.heals >= maxHeals || det.Dialect() != sse.DialectOpenAIResponses || g.cutShort() != causeNone {
		return nil, readErr
	}
	seq, ok := det.LastSequence()
	if !ok {
		return nil, readErr
	}
	p, f := g.p, g.f
	g.drop() // the broken answer
	deadline := time.Now().Add(p.cfg.UpstreamIdleTimeout)
	wait := healBackoff
	for n := 1; n <= healAttempts; n++ {
		if n > 1 {
			if !g.pause(min(wait, time.Until(deadline))) {
				return nil, errCancelled
			}
			wait *= 2
		}
		if !time.Now().Before(deadline) {
			break
		}
		resp, err := g.call(h.up, h.request(seq))
		if errors.Is(err, errCancelled) {
			return nil, err
		}
		if err != nil {
			p.log.Warn("upstream resume failed", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "attempt", n,
				"after", seq, "upstream", h.up.Name(), "error", err.Error())
			continue
		}
		if head := copyHead(resp); !head.Stream {
			g.drop()
			p.hooks.healed("refused")
			p.log.Warn("upstream resume refused", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "attempt", n,
				"after", seq, "upstream", h.up.Name(), "upstream_status", head.Status)
			return nil, &healRefused{status: head.Status}
		}
		h.heals++
		p.hooks.healed("resumed")
		p.log.Info("upstream resumed", "key", f.Scope.Key, "tenant", f.Scope.Tenant, "attempt", n,
			"after", seq, "upstream", h.up.Name(), "reason", reason.String())
		return resp, nil
	}
	p.hooks.healed("failed")
	return nil, readErr
}
