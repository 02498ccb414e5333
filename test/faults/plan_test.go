package faults_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// dialect is the kind of model request a spec makes.
type dialect int

const (
	chatStream      dialect = iota // POST /v1/chat/completions, stream:true
	chatBody                       // POST /v1/chat/completions, stream:false
	messagesStream                 // POST /v1/messages (Anthropic), stream:true
	responsesStream                // POST /v1/responses (OpenAI Responses), stream:true
)

var dialectNames = [...]string{"chat stream", "chat body", "messages stream", "responses stream"}

func (d dialect) String() string { return dialectNames[d] }

func (d dialect) path() string {
	switch d {
	case messagesStream:
		return "/v1/messages"
	case responsesStream:
		return "/v1/responses"
	}
	return "/v1/chat/completions"
}

func (d dialect) stream() bool { return d != chatBody }

// faultKind is one failure the upstream injects into one call.
type faultKind int

const (
	fNone          faultKind = iota // a whole answer, from the mock
	fSlowFirst                      // a whole answer whose first event (or body) comes late
	f429RetryAfter                  // 429 with Retry-After: 1 (the mock's status=429)
	f429                            // 429 without Retry-After
	f500                            // 500 (the mock's status=500)
	f503                            // 503 (the mock's status=503)
	fErrorFirst                     // an error event before any other event (the mock's error-after=0)
	fResetHead                      // the request is read, then the connection reset before any answer
	fHang                           // the request is read and never answered (the mock's hang, bounded)
	fResetAfter                     // N events, then a reset (the mock's reset-after=N)
	fCut                            // N events, then the body ends without the terminal event (eof-after=N)
	fStall                          // N events, then silence (the mock's hang-after=N)
	fErrorMid                       // N events, then the dialect's error event (error-after=N, N >= 1)
	fMalformed                      // event N's data is not JSON; the rest of the stream follows
	fBadChunk                       // N events, then an HTTP chunk whose size is not hex
	fNoDone                         // a whole chat stream that ends without data: [DONE] (finish_reason varies)
	fNoDoneNoUsage                  // a chat stream that asked for usage, ended after the finish chunk: no usage, no [DONE]
	fGarbage200                     // 200 with an HTML body to a streaming request
	fCutBody                        // a non-streaming 200 whose body is shorter than its Content-Length
	fCutChunked                     // a non-streaming 200, chunked, closed before its last chunk
	fCutClose                       // a non-streaming 200 without length or chunks, closed inside its JSON
	fMarked502                      // the request is read, then an ssegate's outcome-unknown 502 (Ssegate-Outcome: unknown)
	fMarked504                      // the request is read, then an ssegate's outcome-unknown 504 (Ssegate-Outcome: unknown)
	fBalancer504                    // the request is read, then a load balancer's 504 page (its backend may be running it)
)

var faultNames = [...]string{
	"none", "slow-first-token", "429+retry-after", "429", "500", "503", "error-event-first",
	"reset-before-head", "hang", "reset-after", "cut", "stall", "error-event-mid", "malformed-event",
	"bad-chunk", "no-done", "no-done-no-usage", "garbage-200", "cut-body", "cut-chunked-body", "cut-body-close",
	"marked-502", "marked-504", "balancer-504",
}

// class is what a call cost, as the upstream knows it.
type class int

const (
	// notRun: the upstream said it did not run the request (429, 5xx, an
	// error event before any event); a retry of it costs nothing more.
	notRun class = iota
	// failed: the upstream took the request and may have run it (and
	// billed it), but no whole answer came out.
	failed
	// whole: the upstream ran the request and sent a whole answer.
	whole
)

var classNames = [...]string{"not run", "paid, no whole answer", "paid, whole"}

func (c class) String() string { return classNames[c] }

func (k faultKind) class() class {
	switch k {
	case f429RetryAfter, f429, f500, f503, fErrorFirst:
		return notRun
	case fNone, fSlowFirst, fNoDone:
		return whole
	}
	return failed
}

// fault is one call's fault: its kind, the events sent before it fires,
// and for fNoDone the finish_reason of the finish chunk.
type fault struct {
	kind   faultKind
	n      int
	finish string
}

func (f fault) String() string {
	switch f.kind {
	case fResetAfter, fCut, fStall, fErrorMid, fMalformed, fBadChunk:
		return fmt.Sprintf("%s=%d", faultNames[f.kind], f.n)
	case fNoDone:
		return faultNames[f.kind] + "(" + f.finish + ")"
	}
	return faultNames[f.kind]
}

// finishReasons are the finish_reason values a whole chat stream without
// [DONE] ends with.
var finishReasons = []string{"stop", "length", "tool_calls", "content_filter", "function_call"}

// faultsFor lists the faults that apply to a spec's requests.
func faultsFor(d dialect, usage bool) []faultKind {
	if d == chatBody {
		return []faultKind{fSlowFirst, f429RetryAfter, f429, f500, f503, fResetHead, fHang, fCutBody, fCutChunked, fCutClose,
			fMarked502, fMarked504, fBalancer504}
	}
	ks := []faultKind{fSlowFirst, f429RetryAfter, f429, f500, f503, fErrorFirst, fResetHead, fHang,
		fResetAfter, fCut, fStall, fErrorMid, fMalformed, fBadChunk, fGarbage200, fMarked502, fMarked504, fBalancer504}
	if d == chatStream {
		ks = append(ks, fNoDone, fNoDone)
		if usage {
			ks = append(ks, fNoDoneNoUsage)
		}
	}
	return ks
}

// spec is one intent: a keyed request (name is its Idempotency-Key) that
// several clients send, or one unkeyed request. Its faults are those of its
// upstream calls in order; calls past them get a whole answer.
type spec struct {
	name    string
	keyed   bool
	dialect dialect
	body    string
	tokens  int
	delay   time.Duration
	chunk   int // X-Mock-Chunk-Bytes: padded events, so a client that stops reading fills its socket
	usage   bool
	faults  []fault
	clients []*script

	ref reference // the whole answer, fetched from the mock before the round
}

func (s *spec) fault(call int) fault {
	if call-1 < len(s.faults) {
		return s.faults[call-1]
	}
	return fault{kind: fNone}
}

func (s *spec) describe() string {
	fs := make([]string, len(s.faults))
	for i, f := range s.faults {
		fs[i] = f.String()
	}
	kind := "unkeyed"
	if s.keyed {
		kind = "key"
	}
	return fmt.Sprintf("%s %q (%s, %d tokens, planned faults [%s])", kind, s.name, s.dialect, s.tokens, strings.Join(fs, " "))
}

// reqKind is how a client asks.
type reqKind int

const (
	fresh      reqKind = iota // POST, no Last-Event-ID
	resumePOST                // POST repeating the key, with Last-Event-ID
	resumeGET                 // GET /streams/{key}, with Last-Event-ID
	wholeGET                  // GET /streams/{key}, without Last-Event-ID
)

var reqKindNames = [...]string{"POST", "POST+Last-Event-ID", "GET /streams+Last-Event-ID", "GET /streams"}

func (k reqKind) String() string { return reqKindNames[k] }

// dropKind is how a client leaves early.
type dropKind int

const (
	dropNone  dropKind = iota // reads to the end
	dropClose                 // closes the connection after dropAt events (a body: after cancelAfter)
	dropStall                 // stops reading after dropAt events, for stallFor, then closes
)

// script is what one client does: its request, when, whether it leaves
// early, and what it does next (a resume from an event it saw).
type script struct {
	kind     reqKind
	at       time.Duration // after the round's start; for a resume, after the previous request ended
	drop     dropKind
	dropAt   int // events read before leaving
	stallFor time.Duration
	// cancelAfter, for a non-streaming request that leaves: how long it
	// waits for the answer before it closes the connection.
	cancelAfter time.Duration
	pick        float64 // which seen event the resume names, as a fraction of those seen
	next        *script // after a drop
}

// plan is one round: its specs, all drawn from the seed.
type plan struct {
	seed  int64
	specs []*spec
	byKey map[string]*spec // keyed specs by key, unkeyed by name
	// chain: the clients' ssegate is in front of a second one, which is
	// in front of the upstream (TestFaultsChain).
	chain bool
	tools []*toolSpec // the MCP tool calls (tools_test.go)
}

// Plan sizes.
const (
	keyedSpecs   = 40
	unkeyedSpecs = 16
	startWindow  = 1200 * time.Millisecond // first requests of a spec start within it
)

// newPlan draws a round from seed. skip names faults (as faultNames spells
// them) to leave out of the draw, and "unkeyed-drop" leaves out unkeyed
// clients that leave early: a fault whose fix is pending can be set aside
// to see what else fails. The same seed draws the same round only with the
// same skip.
func newPlan(seed int64, skip map[string]bool) *plan {
	r := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	p := &plan{seed: seed, byKey: map[string]*spec{}}
	for i := range keyedSpecs + unkeyedSpecs {
		keyed := i < keyedSpecs
		s := &spec{keyed: keyed}
		if keyed {
			s.name = fmt.Sprintf("k%d-%d", seed, i)
		} else {
			s.name = fmt.Sprintf("u%d-%d", seed, i)
		}
		switch x := r.IntN(100); {
		case x < 55:
			s.dialect = chatStream
		case x < 72:
			s.dialect = chatBody
		case x < 87:
			s.dialect = messagesStream
		default:
			s.dialect = responsesStream
		}
		s.tokens = 6 + r.IntN(19)
		s.delay = time.Duration(4+r.IntN(9)) * time.Millisecond
		s.usage = s.dialect == chatStream && r.IntN(3) == 0
		s.faults = drawFaults(r, s, skip)
		s.clients = drawClients(r, s, skip["unkeyed-drop"])
		for _, c := range s.clients {
			for c := c; c != nil; c = c.next {
				if c.drop == dropStall {
					// Events of about 2 KiB: the client's small receive
					// window and the proxy's send buffer fill within the
					// stream, so the proxy sees a client that reads nothing.
					s.chunk = 2048
				}
			}
		}
		s.body = requestBody(s)
		p.specs = append(p.specs, s)
		p.byKey[s.name] = s
	}
	p.tools = drawTools(r, seed) // after the LLM specs, which a seed keeps drawing as before
	return p
}

func requestBody(s *spec) string {
	prompt := "Tell me about " + s.name
	switch s.dialect {
	case messagesStream:
		return fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":%q}]}`, prompt)
	case responsesStream:
		return fmt.Sprintf(`{"model":"gpt-4o-mini","stream":true,"input":%q}`, prompt)
	case chatBody:
		return fmt.Sprintf(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":%q}]}`, prompt)
	}
	if s.usage {
		return fmt.Sprintf(`{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":%q}]}`, prompt)
	}
	return fmt.Sprintf(`{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":%q}]}`, prompt)
}

// drawFaults draws the faults of a spec's first calls: none for about a
// quarter of the specs, up to three otherwise.
func drawFaults(r *rand.Rand, s *spec, skip map[string]bool) []fault {
	n := 0
	switch x := r.IntN(100); {
	case x < 25:
	case x < 70:
		n = 1
	case x < 90:
		n = 2
	default:
		n = 3
	}
	var kinds []faultKind
	for _, k := range faultsFor(s.dialect, s.usage) {
		if !skip[faultNames[k]] {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) == 0 {
		n = 0
	}
	var fs []fault
	for range n {
		f := fault{kind: kinds[r.IntN(len(kinds))]}
		switch f.kind {
		case fResetAfter, fCut, fStall, fMalformed, fBadChunk:
			f.n = r.IntN(s.tokens + 1) // before the chat finish chunk, the Anthropic and Responses terminal events
		case fErrorMid:
			f.n = 1 + r.IntN(s.tokens)
		case fNoDone:
			f.finish = finishReasons[r.IntN(len(finishReasons))]
		}
		fs = append(fs, f)
	}
	return fs
}

// drawClients draws the clients of a spec: for a key, one to three
// concurrent duplicates that read it whole or leave (and often resume), and
// sometimes a repeat after the stream ended; for an unkeyed request, one
// client.
func drawClients(r *rand.Rand, s *spec, unkeyedStay bool) []*script {
	start := time.Duration(r.Int64N(int64(startWindow)))
	if !s.keyed {
		c := drawClient(r, s, fresh, start, false)
		if unkeyedStay {
			c.drop = dropNone
		}
		return []*script{c}
	}
	dups := 1
	switch x := r.IntN(100); {
	case x < 35:
	case x < 75:
		dups = 2
	default:
		dups = 3
	}
	var cs []*script
	for range dups {
		cs = append(cs, drawClient(r, s, fresh, start+time.Duration(r.Int64N(int64(20*time.Millisecond))), true))
	}
	if r.IntN(100) < 40 {
		late := start + 600*time.Millisecond + time.Duration(r.Int64N(int64(1400*time.Millisecond)))
		cs = append(cs, &script{kind: fresh, at: late})
	}
	return cs
}

// drawClient draws one client; resumes chain after drops, at most two deep.
func drawClient(r *rand.Rand, s *spec, kind reqKind, at time.Duration, resumes bool) *script {
	c := &script{kind: kind, at: at}
	depth := 0
	for cur := c; ; depth++ {
		switch x := r.IntN(100); {
		case x < 50:
			return c
		case x < 80 || !s.dialect.stream():
			cur.drop = dropClose
		default:
			cur.drop = dropStall
			cur.stallFor = 300*time.Millisecond + time.Duration(r.Int64N(int64(1200*time.Millisecond)))
		}
		cur.dropAt = 1 + r.IntN(s.tokens+2)
		if !s.dialect.stream() {
			cur.dropAt, cur.stallFor = 0, 0
			cur.cancelAfter = time.Duration(r.Int64N(int64(150 * time.Millisecond)))
		}
		if !resumes || !s.dialect.stream() || depth >= 2 || r.IntN(100) >= 70 {
			return c
		}
		next := &script{at: time.Duration(r.Int64N(int64(250 * time.Millisecond))), pick: r.Float64()}
		switch x := r.IntN(100); {
		case x < 50:
			next.kind = resumePOST
		case x < 80:
			next.kind = resumeGET
		default:
			next.kind = wholeGET
		}
		cur.next = next
		cur = next
	}
}
