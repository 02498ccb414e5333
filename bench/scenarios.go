package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// path is one way to the upstream that a scenario compares: a server kind
// and how requests on it are made.
type path struct {
	name  string
	kind  kind
	keyed bool // a unique Idempotency-Key per stream (the recording path)
}

// The paths of the scenarios that compare every peer.
var (
	pathDirect     = path{name: "direct", kind: kindDirect}
	pathHTTPUtil   = path{name: "httputil", kind: kindHTTPUtil}
	pathFastHTTP   = path{name: "fasthttp", kind: kindFastHTTP}
	pathNginx      = path{name: "nginx", kind: kindNginx}
	pathCaddy      = path{name: "caddy", kind: kindCaddy}
	pathPortkey    = path{name: "portkey", kind: kindPortkey}
	pathSsegate    = path{name: "ssegate", kind: kindSsegate}
	pathSsegateKey = path{name: "ssegate+key", kind: kindSsegate, keyed: true}
	// With -baseline: the same two paths through the baseline binary.
	pathBaseline    = path{name: "ssegate@baseline", kind: kindBaseline}
	pathBaselineKey = path{name: "ssegate@baseline+key", kind: kindBaseline, keyed: true}
)

// baselineOf names the baseline path of each of ssegate's two paths.
var baselineOf = map[string]string{pathSsegate.name: pathBaseline.name, pathSsegateKey.name: pathBaselineKey.name}

// reqSpec says what one request asks of the upstream.
type reqSpec struct {
	method string // POST unless set
	path   string // /v1/chat/completions unless set
	tokens int    // content tokens: a whole answer has tokens+3 events
	delay  time.Duration
	key    string
	lastID string
	// plain asks for a non-streaming answer (requestBodyPlain).
	plain bool
	// headers are more header lines, CRLF-terminated: a peer's own (the
	// Portkey gateway's routing headers).
	headers string
}

// eventsFor returns the events of a chat answer of tokens content tokens:
// the role chunk, the tokens, the finish chunk and [DONE].
func eventsFor(tokens int) int { return tokens + 3 }

// tokensFor returns the content tokens of an answer of n events.
func tokensFor(n int) int { return max(n-3, 1) }

// requestBody is the body of every streamed model request.
const requestBody = `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Write a short story about a lighthouse keeper."}]}`

// requestBodyPlain is the body of a non-streaming model request.
const requestBodyPlain = `{"model":"gpt-4o-mini","stream":false,"messages":[{"role":"user","content":"Write a short story about a lighthouse keeper."}]}`

// requestTo renders q as an HTTP/1.1 request to srv, with the headers that
// server needs.
func (r *runner) requestTo(srv *server, q reqSpec) []byte {
	q.headers += srv.headers
	return r.request(srv.addr, q)
}

// request renders q as an HTTP/1.1 request to host.
func (r *runner) request(host string, q reqSpec) []byte {
	method, p := q.method, q.path
	if method == "" {
		method = "POST"
	}
	if p == "" {
		p = "/v1/chat/completions"
	}
	body, accept := requestBody, "text/event-stream"
	if q.plain {
		body, accept = requestBodyPlain, "application/json"
	}
	var b strings.Builder
	b.Grow(512)
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer sk-bench\r\nAccept: %s\r\n", method, p, host, accept)
	if q.tokens > 0 {
		fmt.Fprintf(&b, "X-Mock-Tokens: %d\r\n", q.tokens)
	}
	if q.delay > 0 {
		fmt.Fprintf(&b, "X-Mock-Delay: %s\r\n", q.delay)
	}
	if q.key != "" {
		fmt.Fprintf(&b, "Idempotency-Key: %s\r\n", q.key)
	}
	if q.lastID != "" {
		fmt.Fprintf(&b, "Last-Event-ID: %s\r\n", q.lastID)
	}
	b.WriteString(q.headers)
	if method == "POST" {
		fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	} else {
		b.WriteString("\r\n")
	}
	return []byte(b.String())
}

// streamJob returns a job of streams of the given events and pace on path p;
// a keyed path gets a unique key per stream, prefixed by prefix.
func (r *runner) streamJob(p path, conc int, m mode, events int, pace time.Duration, prefix string) prepareFunc {
	return func(srv *server) (*job, error) {
		spec := reqSpec{tokens: tokensFor(events), delay: pace}
		fixed := r.requestTo(srv, spec)
		return &job{
			conc: conc, mode: m, duration: r.opt.duration,
			build: func(w, i int) ([]byte, int) {
				if !p.keyed {
					return fixed, events
				}
				s := spec
				s.key = fmt.Sprintf("%s-%d-%d-%d", prefix, r.nonce, w, i)
				return r.requestTo(srv, s), events
			},
		}, nil
	}
}

// allPaths returns the eight paths, less the peers not asked for and
// those missing (nginx not on PATH, caddy not built, Portkey not
// installed); with -baseline, each of ssegate's two paths is followed by
// its baseline path, so that the two are measured next to each other in
// every round.
func (r *runner) allPaths() []path {
	return r.only(pathDirect, pathHTTPUtil, pathFastHTTP, pathNginx, pathCaddy, pathPortkey,
		pathSsegate, pathBaseline, pathSsegateKey, pathBaselineKey)
}

// only returns the paths whose peers are measured in this run.
func (r *runner) only(ps ...path) []path {
	var out []path
	for _, p := range ps {
		if r.opt.peers[p.kind] && r.env.available(p.kind) {
			out = append(out, p)
		}
	}
	return out
}

// available reports whether the peer k can run: the external ones need
// their binary or installation.
func (e *env) available(k kind) bool {
	switch k {
	case kindNginx:
		return e.nginxBin != ""
	case kindCaddy:
		return e.caddyBin != ""
	case kindPortkey:
		return e.portkeyDir != ""
	}
	return true
}

// interleave measures every path once per round, round after round
// (A B C A B C …), so that drift of the machine hits every path alike.
func (r *runner) interleave(scn, step string, conc int, paths []path, prepare func(p path, round int) prepareFunc) {
	for round := 1; round <= r.opt.rounds; round++ {
		for _, p := range paths {
			r.ms = append(r.ms, r.measure(scn, step, round, p, conc, prepare(p, round)))
		}
	}
}

// scenario is one of the suite's scenarios.
type scenario struct {
	id, title string
	run       func(r *runner)
}

// scenarios lists the suite in its order.
var scenarios = []scenario{
	{"a", "saturation", (*runner).saturation},
	{"b", "latency", (*runner).latency},
	{"c", "many slow streams", (*runner).slow},
	{"d", "replay", (*runner).replay},
	{"e", "fan-out", (*runner).fanout},
	{"f", "resume", (*runner).resume},
	{"sweep", "events/s against concurrency", (*runner).sweep},
	{"redis", "Redis store: CPU, round trips and joiner latency beside the in-memory store", (*runner).redisScenario},
	{"shard", "concurrent streams one Redis shard holds: the Redis store driven without HTTP, up to the knee", (*runner).shard},
	{"board", "the gateway board's method: added latency, time to first content token and CPU per request", (*runner).board},
}

// saturation (a): conc streams of opt.events events, no pacing, back to back.
func (r *runner) saturation() {
	step := fmt.Sprintf("%d streams × %d events", r.opt.conc, r.opt.events)
	r.interleave("a", step, r.opt.conc, r.allPaths(), func(p path, round int) prepareFunc {
		return r.streamJob(p, r.opt.conc, modeLoop, r.opt.events, 0, fmt.Sprintf("a%d", round))
	})
}

// latency (b): one stream of 10 events at a time; time to first event.
func (r *runner) latency() {
	const events = 10
	step := fmt.Sprintf("1 stream × %d events, sequential", events)
	r.interleave("b", step, 1, r.allPaths(), func(p path, round int) prepareFunc {
		inner := r.streamJob(p, 1, modeLoop, events, 0, fmt.Sprintf("b%d", round))
		return func(srv *server) (*job, error) {
			j, err := inner(srv)
			if j != nil {
				j.maxStreams = 200_000
			}
			return j, err
		}
	})
}

// slow (c): for every step, n streams opened at once, each of its events
// paced by the upstream.
func (r *runner) slow() {
	for _, st := range r.opt.slow {
		n := st.streams
		step := fmt.Sprintf("%d streams × %d events @ %s", n, st.events, st.pace)
		// A proxy holds two sockets a stream (client and upstream).
		if need := uint64(2*n + 64); r.noFile < need {
			r.notes = append(r.notes, fmt.Sprintf("c %s: RLIMIT_NOFILE is %d (it could not be raised), below the %d a single-process proxy needs for two sockets a stream; such a peer cannot hold every stream here, and its errors say so", step, r.noFile, need))
		}
		r.interleave("c", step, n, r.allPaths(), func(p path, round int) prepareFunc {
			inner := r.streamJob(p, n, modeOnce, st.events, st.pace, fmt.Sprintf("c%d-%d", n, round))
			return func(srv *server) (*job, error) {
				j, err := inner(srv)
				if j != nil {
					j.streamTimeout = 10 * time.Minute
					j.sampleEvery = 50 * time.Millisecond
				}
				return j, err
			}
		})
		for i := range r.ms {
			if m := &r.ms[i]; m.Scenario == "c" && m.Step == step && st.pace > 0 {
				m.NominalPerSec = num(float64(n) / st.pace.Seconds())
			}
		}
	}
}

// prime stores one whole stream of events under key through srv and returns
// its event ids.
func (r *runner) prime(srv *server, key string, events int) ([]string, error) {
	c := newClientConn(srv.addr)
	defer c.close()
	res := c.roundTrip(r.requestTo(srv, reqSpec{tokens: tokensFor(events), key: key}), time.Now().Add(time.Minute), true, nil, nil)
	if !res.ok(events) {
		return nil, fmt.Errorf("priming %q: %s", key, res.problem(events))
	}
	if len(res.ids) != events {
		return nil, fmt.Errorf("priming %q: %d event ids; want %d", key, len(res.ids), events)
	}
	return res.ids, nil
}

// replay (d): conc clients repeat the request of one stored stream (cache
// hits), against direct generations of the same length.
func (r *runner) replay() {
	hit := path{name: "ssegate replay", kind: kindSsegate, keyed: true}
	step := fmt.Sprintf("%d clients × stored %d-event stream", r.opt.conc, r.opt.events)
	r.interleave("d", step, r.opt.conc, r.only(pathDirect, hit), func(p path, round int) prepareFunc {
		if !p.keyed {
			return r.streamJob(p, r.opt.conc, modeLoop, r.opt.events, 0, "")
		}
		return func(srv *server) (*job, error) {
			key := fmt.Sprintf("replay-%d-%d", r.nonce, round)
			if _, err := r.prime(srv, key, r.opt.events); err != nil {
				return nil, err
			}
			req := r.requestTo(srv, reqSpec{tokens: tokensFor(r.opt.events), key: key})
			return &job{conc: r.opt.conc, mode: modeLoop, duration: r.opt.duration,
				build: func(int, int) ([]byte, int) { return req, r.opt.events }}, nil
		}
	})
}

// fanout (e): groups of conc clients sending the same keyed request at once:
// one generation, joined by all. Unkeyed paths make conc generations.
func (r *runner) fanout() {
	step := fmt.Sprintf("%d clients × %d events @ %s", r.opt.conc, r.opt.events, r.opt.fanoutPace)
	r.interleave("e", step, r.opt.conc, r.allPaths(), func(p path, round int) prepareFunc {
		return func(srv *server) (*job, error) {
			spec := reqSpec{tokens: tokensFor(r.opt.events), delay: r.opt.fanoutPace}
			fixed := r.requestTo(srv, spec)
			return &job{conc: r.opt.conc, mode: modeLockstep, duration: r.opt.duration,
				build: func(w, i int) ([]byte, int) {
					if !p.keyed {
						return fixed, r.opt.events
					}
					s := spec
					s.key = fmt.Sprintf("fan-%d-%d-%d", r.nonce, round, i)
					return r.requestTo(srv, s), r.opt.events
				}}, nil
		}
	})
}

// resume (f): clients reconnect to a stored stream with Last-Event-ID at
// varying positions and read the rest; direct makes fresh streams of the
// same remaining length.
func (r *runner) resume() {
	get := path{name: "ssegate GET /streams", kind: kindSsegate, keyed: true}
	post := path{name: "ssegate POST+key", kind: kindSsegate, keyed: true}
	events := r.opt.events
	// pos is the index of the last event the client saw; at least 4 events
	// remain, the shortest answer the mock makes.
	pos := func(w, i int) int { return (w*7919 + i*104729) % (events - 4) }
	step := fmt.Sprintf("%d clients, Last-Event-ID into a stored %d-event stream", r.opt.conc, events)
	r.interleave("f", step, r.opt.conc, r.only(pathDirect, get, post), func(p path, round int) prepareFunc {
		return func(srv *server) (*job, error) {
			j := &job{conc: r.opt.conc, mode: modeLoop, duration: r.opt.duration}
			if !p.keyed {
				j.build = func(w, i int) ([]byte, int) {
					rest := events - pos(w, i) - 1
					return r.requestTo(srv, reqSpec{tokens: tokensFor(rest)}), rest
				}
				return j, nil
			}
			key := fmt.Sprintf("resume-%d-%d", r.nonce, round)
			ids, err := r.prime(srv, key, events)
			if err != nil {
				return nil, err
			}
			j.build = func(w, i int) ([]byte, int) {
				k := pos(w, i)
				s := reqSpec{lastID: ids[k]}
				if p == get {
					s.method, s.path = "GET", "/streams/"+key
				} else {
					s.key, s.tokens = key, tokensFor(events)
				}
				return r.requestTo(srv, s), events - k - 1
			}
			return j, nil
		}
	})
}

// sweep: saturation at each concurrency of opt.sweep, for the chart.
func (r *runner) sweep() {
	for _, c := range r.opt.sweep {
		step := "c=" + strconv.Itoa(c)
		r.interleave("sweep", step, c, r.allPaths(), func(p path, round int) prepareFunc {
			return r.streamJob(p, c, modeLoop, r.opt.events, 0, fmt.Sprintf("s%d-%d", c, round))
		})
	}
}
