package proxy

import (
	"errors"
	"io"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// pump relays the upstream's events: it reads each one, records it into
// the flight (Append), and the origin is delivered what was recorded
// before each read of the upstream's socket (relayBody); followers are
// woken by the flight. The head goes to the flight with the first event:
// until then nothing has reached a client, and a failure returns settled
// false so the caller may retry. After it, the flight ends here
// (settled): committed after a clean end, failed otherwise. What follows
// the terminal event is drained, within bounds, so the connection can be
// reused.
//
// A stream that h can heal (heal.go) and whose connection breaks after
// the first event goes on with the upstream's resume of it.
func (g *gen) pump(resp *fasthttp.Response, head cache.Head, sent time.Time, h *healer) (c cause, settled bool) {
	f := g.f
	m := g.p.m
	deadline := time.AfterFunc(g.p.cfg.MaxStreamDuration, func() { g.cancel(causeMaxStreamDuration) })
	defer deadline.Stop()
	det := sse.NewDetector(g.req.Expect())
	var readErr, appendErr error
	// Events after the terminal one are no part of the answer: the flight
	// ends with the terminal event, and what follows is only read (at
	// most maxDrain bytes of it) so that the connection can be reused.
	begun := false // the first event was seen, and the head went to the flight
	concluded := false
	drained := 0
	// failing: a Responses stream's error event came, and the
	// response.failed the API sends after it is awaited, within the drain
	// bounds: an upstream that sends no more ends the stream with its error.
	failing := false
	for { // one pass per body: the answer's, then each heal's
		body, conn := g.relayBody(resp)
		for ev, err := range sse.Read(body, g.p.cfg.MaxEventBytes) {
			if err != nil {
				if !failing || !isTimeout(err) {
					readErr = err
				}
				break
			}
			if concluded {
				if drained += len(ev.Type) + len(ev.Data); drained > maxDrain {
					break
				}
				continue
			}
			det.Observe(ev)
			if !begun {
				if ev.Type == "response.created" {
					g.responseCreated(ev, det, h)
				}
				if ok, why := det.Clean(false); !ok && why == sse.ReasonErrorEvent {
					if ev.Type == "error" && gjson.Get(ev.Data, "error.type").Str == "stream_aborted" {
						// An ssegate behind cut its stream: not the provider
						// saying it did not run the request.
						return causeUpstreamAborted, false
					}
					return causeErrorEvent, false // an upstream error before any event: a failed call
				}
				f.SetHead(head)
				begun = true
				m.ttfeUpstream.Observe(time.Since(sent).Seconds())
			}
			terminal := det.Terminal()
			// The terminal event is relayed as it came when the stream is
			// clean or ended as the provider stated it (causeRow.relayEnd:
			// its response.failed, or its [DONE] after a choice the request
			// did not ask for). A malformed one is not, nor one that claims
			// a whole answer when the stream is not ([DONE] with a choice
			// unfinished, say): a client that stops reading at it would take
			// a half stream for a whole one. stream_aborted ends the stream
			// instead.
			relay := true
			if terminal {
				ok, why := det.Clean(false)
				relay = ok || relayEnd(why)
			}
			if relay {
				m.events.Inc()
				if _, err := f.Append(ev.Type, ev.Data); err != nil {
					appendErr = err
					break
				}
			}
			if terminal {
				c, settled = g.conclude(det, head, nil, nil, false)
				concluded = true
				conn.drainBy(time.Now().Add(maxDrainTime))
			} else if !failing && det.ErrSeen() && det.Dialect() == sse.DialectOpenAIResponses {
				failing = true
				conn.drainBy(time.Now().Add(maxDrainTime))
			}
		}
		if concluded {
			return c, settled
		}
		if readErr == nil || appendErr != nil || !begun || h == nil {
			break
		}
		nr, err := g.heal(h, det, readErr)
		if nr == nil {
			readErr = err
			break
		}
		resp, readErr = nr, nil
	}
	// The body ended with its framing intact: its last chunk, or all of
	// its Content-Length (fasthttp fails a read short of either with
	// io.ErrUnexpectedEOF); a body that ends where the connection closed
	// (-2) has no framing to vouch for its end.
	intact := readErr == nil && resp.Header.ContentLength() != -2
	return g.conclude(det, head, readErr, appendErr, intact)
}

// relayBody returns resp's body for pump to read, and the connection it
// comes from. Before each read of that connection's socket the origin is
// written what the flight journaled since the last (origin.push): the
// events of one read go out in one write, before the generation may wait
// for the upstream. It is set once per body; drop unsets it.
func (g *gen) relayBody(resp *fasthttp.Response) (io.Reader, *idleConn) {
	conn := connOf(resp)
	if conn != nil {
		conn.beforeRead = g.o.push
	}
	return bodyOf(resp), conn
}

// maxDrain and maxDrainTime bound what is read of an upstream body after
// its terminal event, for the connection's reuse; past either the
// connection is closed. A provider ends its body right after its terminal
// event, so the bounds only stop one that does not.
const (
	maxDrain     = 64 << 10
	maxDrainTime = 100 * time.Millisecond
)

// conclude ends the flight once the stream's end is known: committed when
// det finds it clean, failed otherwise, and reports it settled. Before any
// event was journaled (no head in the flight yet), a failure that is not
// the generation's own cut is returned unsettled, so that the caller may
// decide on a retry.
func (g *gen) conclude(det *sse.Detector, head cache.Head, readErr, appendErr error, intact bool) (c cause, settled bool) {
	f, m := g.f, g.p.m
	_, begun := f.Head()
	cut := g.cutShort()
	switch {
	case cut != causeNone:
		c = cut
	case errors.Is(appendErr, cache.ErrStreamTooLarge):
		c = causeMaxStreamBytes
	case errors.Is(appendErr, cache.ErrEnded):
		_, reason, _ := f.Outcome() // the store ended it (e.g. fenced by another replica)
		c = causeOf(reason)
	case appendErr != nil:
		c = causeStoreFull
	case readErr != nil:
		c = readFailure(readErr)
	default:
		ok, why := det.Clean(intact)
		if ok {
			if !begun {
				f.SetHead(head)
			}
			if in, out, ok := det.Usage(); ok {
				f.SetUsage(cache.Usage{Input: in, Output: out})
			}
			g.commit(nil)
			return causeNone, true
		}
		c = causeOf(why)
	}
	if !begun && cut == causeNone {
		return c, false
	}
	if !begun {
		f.SetHead(head)
	}
	if causes[c].relayEnd {
		// The provider ended the stream itself, and what it sent was
		// relayed as it came: no abort, but nothing to store either.
		g.notStored(c)
	} else {
		m.aborted.WithLabelValues(c.String()).Inc()
	}
	g.fail(c, 0, nil)
	return c, true
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
	case isTimeout(err):
		return causeUpstreamIdleTimeout
	default:
		return causeUpstreamReadError
	}
}
