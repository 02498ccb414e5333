package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"

	"github.com/ssegate/ssegate/proxy/upstream"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// record ends the flight with a non-streaming answer: committed when 2xx,
// relayed to joiners and not stored otherwise.
func (g *gen) record(resp *fasthttp.Response, head cache.Head) {
	body, err := readBody(resp, g.p.cfg.MaxStreamBytes)
	g.settle(resp, head, body, err)
}

// settle ends the flight with a non-streaming answer read as body (err
// from reading it): a 2xx body read whole is judged by the call's kind
// (kind.whole), and is its result or the upstream's failure, relayed as
// it came and not stored; any other status is the upstream's error
// answer, relayed.
func (g *gen) settle(resp *fasthttp.Response, head cache.Head, body []byte, err error) {
	f := g.f
	f.SetHead(head)
	ok := head.Status >= 200 && head.Status < 300
	switch {
	case err != nil:
		// A chunked body without its last chunk, or one shorter than its
		// Content-Length, fails here (io.ErrUnexpectedEOF).
		g.fail(g.readCause(err), 0, nil)
	case ok && !wholeBody(resp, head, body):
		g.fail(causeUnframedBody, 0, nil)
	case ok:
		switch c := g.kind.whole(body); c {
		case causeNone:
			f.SetUsage(bodyUsage(body))
			g.commit(body)
		case causeErrorBody:
			g.notStored(c)
			g.fail(c, head.Status, body)
		default:
			g.fail(c, 0, nil)
		}
	default:
		g.fail(upstreamStatus(head.Status), head.Status, body)
	}
}

// readCause is the cause of a read of the answer that failed with err:
// the cut that interrupted it (a DELETE, a shutdown, -max-stream-duration),
// or the read's own failure.
func (g *gen) readCause(err error) cause {
	if c := g.cutShort(); c != causeNone {
		return c
	}
	return readFailure(err)
}

// wholeBody reports whether a 2xx body read without error is known to be
// whole. A chunked body or one with a Content-Length is, since its
// framing was checked as it was read. A body that ends where the
// connection closes could have been cut anywhere: it counts as whole only
// when it parses as the JSON its Content-Type says it is.
func wholeBody(resp *fasthttp.Response, head cache.Head, body []byte) bool {
	if head.Status == fasthttp.StatusNoContent || head.Status == fasthttp.StatusNotModified {
		return len(body) == 0 // an answer that has no body
	}
	if resp.Header.ContentLength() != -2 { // -2: until the connection closes
		return true
	}
	return isJSON(head.ContentType) && json.Valid(body)
}

// isJSON reports whether a content type is JSON (application/json, or a
// +json type).
func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(ct)), ";")
	mt = strings.TrimSpace(mt)
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// bodyUsage reads the token usage of a non-streaming answer, in the
// OpenAI (prompt/completion, input/output) or Anthropic shape.
func bodyUsage(body []byte) cache.Usage {
	u := gjson.GetBytes(body, "usage")
	if !u.Exists() {
		return cache.Usage{}
	}
	in := u.Get("prompt_tokens").Int() + u.Get("input_tokens").Int()
	out := u.Get("completion_tokens").Int() + u.Get("output_tokens").Int()
	return cache.Usage{Input: in, Output: out}
}

// copyHead reads the end-to-end headers of an upstream answer.
func copyHead(resp *fasthttp.Response) cache.Head {
	h := cache.Head{
		Status:      resp.StatusCode(),
		ContentType: string(resp.Header.ContentType()),
	}
	// A 204 or 304 has no body, whatever its Content-Type says.
	h.Stream = h.Status >= 200 && h.Status < 300 && !noBody(h.Status) && isEventStream(h.ContentType)
	for k, v := range resp.Header.All() {
		name := string(k)
		if skipResponseHeader(name) {
			continue
		}
		h.Header = append(h.Header, cache.Header{Name: name, Value: string(v)})
	}
	return h
}

func skipResponseHeader(name string) bool {
	for _, h := range upstream.HopHeaders {
		if strings.EqualFold(name, h) {
			return true
		}
	}
	switch strings.ToLower(name) {
	case "content-length", "content-type", "content-encoding", "date", "server", "set-cookie":
		return true
	case "ssegate-outcome", "ssegate-stored":
		// An ssegate behind speaks of its own key; this proxy says what
		// became of its own (outcomeHead), and a stored answer replays
		// without them.
		return true
	}
	return false
}

// readBody reads a non-streamed answer up to limit bytes.
// A body whose length the head says is read into one buffer of that
// size (and a byte to meet its end), not grown as it comes.
func readBody(resp *fasthttp.Response, limit int) ([]byte, error) {
	body, err := readUpTo(bodyOf(resp), resp.Header.ContentLength(), limit)
	if err != nil {
		return nil, err
	}
	return body, nil
}

// readUpTo reads r to its end, up to limit bytes (more is errBodyTooLarge),
// into a buffer of size bytes when size is known (n ≥ 0). With an error it
// returns what it read before it.
func readUpTo(r io.Reader, size, limit int) ([]byte, error) {
	r = io.LimitReader(r, int64(limit)+1)
	n := 512
	if size >= 0 && size <= limit {
		n = size + 1 // and a byte to meet its end
	}
	body := make([]byte, 0, n)
	for {
		if len(body) == cap(body) {
			body = append(body, 0)[:len(body)] // more room
		}
		k, err := r.Read(body[len(body):cap(body)])
		body = body[:len(body)+k]
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return body, err
		}
	}
	if len(body) > limit {
		return body, errBodyTooLarge
	}
	return body, nil
}

var errBodyTooLarge = errors.New("upstream body exceeds the byte bound")

// bodyOf is the reader of an answer's body. fasthttp streams a body, but
// gives no stream where there is none to read (the answer to a HEAD, a 204
// or a 304): then what it holds, nothing, is the body.
func bodyOf(resp *fasthttp.Response) io.Reader {
	if r := resp.BodyStream(); r != nil {
		return r
	}
	return bytes.NewReader(resp.Body())
}

// readFailure is the cause of a failed read of an upstream body.
func readFailure(err error) cause {
	switch {
	case errors.Is(err, sse.ErrEventTooLarge):
		return causeMaxEventBytes
	case errors.Is(err, errBodyTooLarge):
		return causeMaxStreamBytes
	case errors.As(err, new(*healRefused)):
		return causeHealRefused
	case upstream.IsTimeout(err):
		return causeUpstreamIdleTimeout
	default:
		return causeUpstreamReadError
	}
}
