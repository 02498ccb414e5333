package faults_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// credential is every client's Authorization: one tenant for the round.
const credential = "Bearer sk-faults-test"

// clientLimit bounds one exchange. No legitimate answer in a round takes
// near this long (the longest: two Retry-After waits and three attempt
// timeouts); a stream still open at it just stopped.
const clientLimit = 20 * time.Second

// exchange is one request a client made and what it got.
type exchange struct {
	spec   *spec
	script *script
	origin string // originHeader
	kind   reqKind
	lastID string // the Last-Event-ID sent

	start, end time.Time

	err      error // no response head came
	status   int
	ctype    string
	replayed bool // Idempotent-Replayed: true
	unknown  bool // Ssegate-Outcome: unknown

	// A stream: its events and their bytes as received, without keep-alive
	// comments. A body: the body.
	events  []event
	body    []byte
	partial bool  // the body ended inside an event
	readErr error // the body did not end properly

	dropped bool // the client left on purpose (so what it read is all it asked for)
}

func (x *exchange) String() string {
	s := fmt.Sprintf("%s %s", x.origin, x.kind)
	if x.lastID != "" {
		s += " after " + x.lastID
	}
	return s
}

// got describes what the client received, for failure messages.
func (x *exchange) got() string {
	switch {
	case x.err != nil:
		return fmt.Sprintf("no answer (%v)", x.err)
	case strings.HasPrefix(x.ctype, "text/event-stream"):
		s := fmt.Sprintf("%d stream, %s", x.status, describeEvents(x.events))
		if x.readErr != nil {
			s += fmt.Sprintf(", then %v", x.readErr)
		}
		if x.partial {
			s += ", then part of an event"
		}
		if x.dropped {
			s += ", then the client left"
		}
		return s
	}
	b := x.body
	if len(b) > 160 {
		b = b[:160]
	}
	s := fmt.Sprintf("%d %s %q", x.status, x.ctype, b)
	if x.readErr != nil {
		s += fmt.Sprintf(", then %v", x.readErr)
	}
	return s
}

// errType is the error.type of a JSON error body, or "".
func (x *exchange) errType() string {
	var b struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(x.body, &b) != nil {
		return ""
	}
	return b.Error.Type
}

// clients are the HTTP clients of a round: one with keep-alive for the
// clients that read, one with a small receive window and no keep-alive
// for those that stop reading, so that the proxy's writes to them back up.
type clients struct {
	base    string
	hc      *http.Client
	stallHC *http.Client
}

func newClients(base string) *clients {
	return &clients{
		base: base,
		hc: &http.Client{Transport: &http.Transport{
			DisableCompression: true, MaxIdleConnsPerHost: 256, IdleConnTimeout: 10 * time.Second,
		}},
		stallHC: &http.Client{Transport: &http.Transport{
			DisableCompression: true, DisableKeepAlives: true,
			DialContext: (&net.Dialer{Control: smallReceiveBuffer}).DialContext,
		}},
	}
}

func (cl *clients) closeIdle() {
	cl.hc.CloseIdleConnections()
	cl.stallHC.CloseIdleConnections()
}

// waitTill returns at t. A client's script runs on a timeline (when it
// comes, when it comes back after it left, how long it stops reading):
// the times are the scenario's making, not waits for a condition, and
// this is the one place they are slept.
func waitTill(t time.Time) { time.Sleep(time.Until(t)) }

// run runs a client's script from its first request, following its
// resumes, and returns its exchanges.
func (cl *clients) run(begin time.Time, s *spec, sc *script, origin string) []*exchange {
	waitTill(begin.Add(sc.at))
	var xs []*exchange
	var seen []string // event ids this client has seen
	for depth := 0; sc != nil; depth++ {
		x := &exchange{spec: s, script: sc, kind: sc.kind, origin: fmt.Sprintf("%s.%d", origin, depth)}
		if sc.kind == resumePOST || sc.kind == resumeGET {
			if len(seen) == 0 {
				break // it saw no id to resume from
			}
			x.lastID = seen[min(int(sc.pick*float64(len(seen))), len(seen)-1)]
		}
		if sc.kind == wholeGET && len(seen) == 0 {
			break // nothing tells it the key has a stream yet
		}
		cl.do(x)
		xs = append(xs, x)
		for _, ev := range x.events {
			if ev.id != "" {
				seen = append(seen, ev.id)
			}
		}
		if !x.dropped {
			break
		}
		sc = sc.next
		if sc != nil {
			waitTill(time.Now().Add(sc.at))
		}
	}
	return xs
}

// do makes one exchange and reads its answer as its script says.
func (cl *clients) do(x *exchange) {
	s, sc := x.spec, x.script
	x.start = time.Now()
	defer func() { x.end = time.Now() }()
	ctx, cancel := context.WithTimeout(context.Background(), clientLimit)
	defer cancel()
	var req *http.Request
	var err error
	if x.kind == resumeGET || x.kind == wholeGET {
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, cl.base+"/streams/"+url.PathEscape(s.name), nil)
	} else {
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, cl.base+s.dialect.path(), strings.NewReader(s.body))
		req.Header.Set("Content-Type", "application/json")
		if s.keyed {
			req.Header.Set("Idempotency-Key", s.name)
		}
	}
	if err != nil {
		x.err = err
		return
	}
	req.Header.Set("Authorization", credential)
	req.Header.Set(originHeader, x.origin)
	if x.lastID != "" {
		req.Header.Set("Last-Event-ID", x.lastID)
	}
	hc := cl.hc
	if sc.drop == dropStall {
		hc = cl.stallHC
	}
	leaving := sc.drop == dropClose && !s.dialect.stream()
	if leaving {
		t := time.AfterFunc(sc.cancelAfter, cancel)
		defer t.Stop()
	}
	resp, err := hc.Do(req)
	if err != nil {
		x.err = err
		x.dropped = leaving && errors.Is(err, context.Canceled)
		return
	}
	defer resp.Body.Close()
	x.status = resp.StatusCode
	x.ctype = resp.Header.Get("Content-Type")
	x.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	x.unknown = resp.Header.Get("Ssegate-Outcome") == "unknown"
	if !strings.HasPrefix(x.ctype, "text/event-stream") {
		x.body, x.readErr = io.ReadAll(resp.Body)
		if x.readErr != nil && leaving && errors.Is(x.readErr, context.Canceled) {
			x.dropped = true
		}
		return
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var p blockParser
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if line != "" || p.inBlock {
				x.partial = true
			}
			if !errors.Is(err, io.EOF) {
				x.readErr = err
			}
			break
		}
		ev, ok := p.line(strings.TrimSuffix(line, "\n"))
		if !ok {
			continue
		}
		x.events = append(x.events, ev)
		if sc.drop != dropNone && s.dialect.stream() && len(x.events) == sc.dropAt {
			if sc.drop == dropStall {
				waitTill(time.Now().Add(sc.stallFor))
			}
			x.dropped = true
			break
		}
	}
	x.body = p.eventRaw.Bytes()
}

// getJSON GETs path with the round's credential into v.
func (cl *clients) getJSON(path string, v any) (status int, err error) {
	req, err := http.NewRequest(http.MethodGet, cl.base+path, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", credential)
	resp, err := cl.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode == 200 && v != nil {
		err = json.Unmarshal(b, v)
	}
	return resp.StatusCode, err
}
