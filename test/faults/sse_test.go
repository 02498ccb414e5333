package faults_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// The test reads SSE by hand rather than with the sse package, so that it
// does not trust the code under test to read what it wrote.

// event is one SSE event: its id (as the proxy wrote it), type and data.
type event struct {
	id, typ, data string
}

// same reports whether e and o carry the same event, ids aside (the
// upstream's events have none; the proxy assigns them).
func (e event) same(o event) bool { return e.typ == o.typ && e.data == o.data }

func (e event) String() string {
	d := e.data
	if len(d) > 90 {
		d = d[:90] + "…"
	}
	if e.typ != "" {
		return fmt.Sprintf("%s %q", e.typ, d)
	}
	return fmt.Sprintf("%q", d)
}

// blockParser turns the lines of an SSE body into events. Comment lines
// (": ping") are skipped, and a block of comments alone is no event.
type blockParser struct {
	cur      event
	data     []string
	seen     bool     // the current block has a field
	lines    []string // the current block's field lines, as received
	inBlock  bool     // a line of the current block was read
	eventRaw bytes.Buffer
}

// line feeds one line (without its "\n"); it returns the event a blank
// line completed.
func (p *blockParser) line(line string) (event, bool) {
	line = strings.TrimSuffix(line, "\r")
	if line == "" {
		p.inBlock = false
		if !p.seen {
			return event{}, false
		}
		ev := p.cur
		ev.data = strings.Join(p.data, "\n")
		for _, l := range p.lines {
			p.eventRaw.WriteString(l)
			p.eventRaw.WriteByte('\n')
		}
		p.eventRaw.WriteByte('\n')
		p.cur, p.data, p.seen, p.lines = event{}, nil, false, p.lines[:0]
		return ev, true
	}
	p.inBlock = true
	if strings.HasPrefix(line, ":") {
		return event{}, false
	}
	name, value, _ := strings.Cut(line, ":")
	value = strings.TrimPrefix(value, " ")
	switch name {
	case "id":
		p.cur.id = value
	case "event":
		p.cur.typ = value
	case "data":
		p.data = append(p.data, value)
	default:
		return event{}, false
	}
	p.seen = true
	p.lines = append(p.lines, line)
	return event{}, false
}

// parseStream splits a whole SSE body (the mock's) into its event blocks,
// each with its blank line, and their events.
func parseStream(body []byte) (raw [][]byte, evs []event, err error) {
	var p blockParser
	start := 0
	for i := 0; i < len(body); {
		j := bytes.IndexByte(body[i:], '\n')
		if j < 0 {
			return nil, nil, fmt.Errorf("body ends inside a line: %q", body[i:])
		}
		line := string(body[i : i+j])
		i += j + 1
		if ev, ok := p.line(line); ok {
			raw = append(raw, body[start:i])
			evs = append(evs, ev)
			start = i
		} else if line == "" {
			start = i // a block of comments alone
		}
	}
	if start != len(body) {
		return nil, nil, fmt.Errorf("body ends inside an event: %q", body[start:])
	}
	return raw, evs, nil
}

// parseID parses the proxy's "<gen>-<seq>", strictly decimal.
func parseID(s string) (gen, seq uint64, ok bool) {
	g, q, found := strings.Cut(s, "-")
	if !found {
		return 0, 0, false
	}
	var err1, err2 error
	gen, err1 = strconv.ParseUint(g, 10, 64)
	seq, err2 = strconv.ParseUint(q, 10, 64)
	return gen, seq, err1 == nil && err2 == nil && g != "" && q != "" && g[0] != '+' && q[0] != '+'
}

// isAbort reports whether ev is ssegate's stream_aborted error event.
func isAbort(ev event) bool {
	return ev.typ == "error" && strings.Contains(ev.data, `"stream_aborted"`)
}

func describeEvents(evs []event) string {
	switch n := len(evs); {
	case n == 0:
		return "no events"
	case n == 1:
		return "1 event, " + evs[0].String()
	default:
		return fmt.Sprintf("%d events, the last %s", n, evs[n-1])
	}
}

// preambleOnly reports whether evs carry no model output: the events a
// provider sends before its first word (Responses response.created,
// in_progress and queued; Anthropic message_start, ping and an empty
// content block's start; a chat chunk whose delta holds only its role and
// no content, finish or tool call). It is the rule of docs/design.md
// ("The preamble"), written here apart from the proxy's detector.
func preambleOnly(evs []event) bool {
	for _, ev := range evs {
		if !preambleEvent(ev) {
			return false
		}
	}
	return true
}

func preambleEvent(ev event) bool {
	var v struct {
		Type         string `json:"type"`
		ContentBlock *struct {
			Type     string `json:"type"`
			Text     string `json:"text"`
			Thinking string `json:"thinking"`
		} `json:"content_block"`
		Choices *[]struct {
			Delta        map[string]json.RawMessage `json:"delta"`
			FinishReason *string                    `json:"finish_reason"`
		} `json:"choices"`
	}
	if json.Unmarshal([]byte(ev.data), &v) != nil {
		return false
	}
	switch v.Type {
	case "response.created", "response.in_progress", "response.queued", "message_start", "ping":
		return true
	case "content_block_start":
		b := v.ContentBlock
		return b != nil && (b.Type == "text" || b.Type == "thinking") && b.Text == "" && b.Thinking == ""
	case "":
	default:
		return false
	}
	if v.Choices == nil {
		return false
	}
	for _, c := range *v.Choices {
		if c.FinishReason != nil {
			return false
		}
		for k, raw := range c.Delta {
			switch k {
			case "role":
			case "content", "refusal":
				if r := string(raw); r != "null" && r != `""` {
					return false
				}
			default:
				return false
			}
		}
	}
	return true
}
