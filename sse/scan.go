package sse

import (
	"bytes"
	"fmt"
	"io"
	"unsafe"
)

// scanStart is the size a Scanner's buffer starts at: most LLM events are
// a few hundred bytes, and a paced stream never needs more.
const scanStart = 1 << 10

// Scanner reads the events of an SSE stream in place, in the one buffer it
// reads into: an event's fields are found where they lie, and its data
// lines are joined by moving them together inside that buffer. It parses
// as go-sse's Read does (the reference, proven equal by FuzzScanner), by
// the WHATWG rules: "\n", "\r\n" and "\r" line ends, a "\r" that ends one
// read taken as a line end at once (a "\n" that begins the next is
// skipped), a leading byte order mark, comments, a field with no colon,
// one space after the colon stripped, multi-line data, an id with a NUL
// ignored, retry read and ignored, and an incomplete final event dropped.
//
// Where go-sse departs from the specification, the Scanner follows go-sse:
// a block with an event or an id field but no data is dispatched (Next
// skips those with neither a type nor data, as Read does), and the byte
// order mark is stripped from the first line that is not blank rather
// than only from the stream's first byte.
//
// The size bound counts an event's raw bytes from the end of the event
// before, blank lines and comments before it included, up to the first
// line end of the blank line that ends it, as go-sse's buffer does. go-sse
// may count one byte more: the "\n" of a "\r\n" that ended the event
// before, when its reads split the pair; near the bound it may refuse an
// event the Scanner takes.
//
// The Event that Next makes available points into the Scanner's buffer:
// it is valid until the next call of Next or Reset, and whatever must
// outlive that is copied. A Scanner is not safe for concurrent use.
type Scanner struct {
	r     io.Reader
	max   int
	buf   []byte
	start int   // where the current event's bytes begin: what the bound counts from
	pos   int   // where the next line begins; the lines before it are parsed
	scan  int   // how far the line at pos was searched for its end
	end   int   // the end of the bytes read
	rerr  error // the reader's error, io.EOF included, once it returned one
	err   error // what ended the scan, io.EOF at a clean end
	ev    Event

	skipLF  bool // the last line ended with a "\r" that ended the bytes read: a "\n" first is its
	started bool // a line that is not blank was read: no byte order mark to strip
	inEvent bool // a line that is not blank was read since the last event's end
	dirty   bool // a data, event or id field was read: the blank line dispatches
	hasData bool
	ds, de  int  // the current event's data, joined, in buf
	joined  bool // the current event's data is of several lines
	oneLine bool // the data of the event yielded is of one line (OneLine)
	typIn   bool
	ts, te  int // the current event's type in buf, when typIn
	typ     []byte
	ownTyp  bool   // the type is in typ, moved out of buf's way
	id      []byte // the last event id
	// keepEmpty has Next yield the events with neither type nor data, as
	// go-sse does, for the tests against it.
	keepEmpty bool
	// poison has Next overwrite the bytes it consumed before it reads on,
	// for the tests: whatever kept a sub-slice of them shows.
	poison bool
}

// NewScanner returns a Scanner of r whose events may take at most
// maxEventSize bytes (DefaultMaxEventSize when <= 0).
func NewScanner(r io.Reader, maxEventSize int) *Scanner {
	if maxEventSize <= 0 {
		maxEventSize = DefaultMaxEventSize
	}
	return &Scanner{r: r, max: maxEventSize}
}

// Reset makes s read a new stream from r, keeping its buffer.
func (s *Scanner) Reset(r io.Reader) {
	*s = Scanner{r: r, max: s.max, buf: s.buf, typ: s.typ[:0], id: s.id[:0], keepEmpty: s.keepEmpty, poison: s.poison}
}

// Event returns the event the last call of Next found. Its strings point
// into the Scanner's buffer until the next call of Next or Reset.
func (s *Scanner) Event() Event { return s.ev }

// OneLine reports whether the data of the event Next found came in one
// line: it then holds no line break, since lines end at "\n", "\r" and
// "\r\n" and only the joining of several puts a "\n" into data.
// AppendLineEvent encodes such an event without searching it for one.
func (s *Scanner) OneLine() bool { return s.oneLine }

// LastEventID returns the last id field read (an id with a NUL is
// ignored), as go-sse's Event.LastEventID; valid as Event is.
func (s *Scanner) LastEventID() string { return unsafeString(s.id) }

// Err returns what ended the scan: nil at the end of the stream (an
// incomplete final event is dropped), an error wrapping ErrEventTooLarge
// for an event over the bound, or the reader's error, wrapped.
func (s *Scanner) Err() error {
	if s.err == io.EOF {
		return nil
	}
	return s.err
}

// Next reads on to the next event and reports whether there is one; at
// the end of the stream or an error it reports false (see Err). Events
// with neither a type nor data (an id or event block with nothing else)
// are skipped, as Read skips them.
func (s *Scanner) Next() bool {
	if s.err != nil {
		return false
	}
	if s.poison {
		for i := range s.buf[:s.start] {
			s.buf[i] = '#'
		}
	}
	for {
		for s.pos < s.end {
			if s.skipLF {
				s.skipLF = false
				if s.buf[s.pos] == '\n' {
					// The "\n" of a "\r\n" split by the reads: no byte of
					// the next event.
					if s.pos == s.start {
						s.start++
					}
					s.pos++
					s.scan = s.pos
					continue
				}
			}
			i := lineEnd(s.buf[:s.end], s.scan)
			if i < 0 {
				s.scan = s.end
				break
			}
			ls := s.pos
			s.pos = i + 1
			if s.buf[i] == '\r' {
				if s.pos < s.end {
					if s.buf[s.pos] == '\n' {
						s.pos++
					}
				} else {
					s.skipLF = true // the line ends here; a "\n" may follow
				}
			}
			s.scan = s.pos
			if i > ls {
				s.inEvent = true
				s.field(ls, i)
				continue
			}
			// A blank line: it ends an event if any line came before.
			if !s.inEvent {
				continue
			}
			s.inEvent = false
			if i+1-s.start > s.max {
				s.fail(s.tooLarge())
				return false
			}
			s.start = s.pos
			if s.dispatch() {
				return true
			}
		}
		if !s.fill() {
			return false
		}
	}
}

// lineEnd returns the index of the first "\n" or "\r" of b at or after i,
// or -1.
func lineEnd(b []byte, i int) int {
	rest := b[i:]
	n := bytes.IndexByte(rest, '\n')
	if n >= 0 {
		rest = rest[:n]
	}
	if r := bytes.IndexByte(rest, '\r'); r >= 0 {
		return i + r
	}
	if n >= 0 {
		return i + n
	}
	return -1
}

// field reads the line buf[ls:le], which is not blank.
func (s *Scanner) field(ls, le int) {
	if !s.started {
		s.started = true
		if bytes.HasPrefix(s.buf[ls:le], bom) {
			ls += len(bom)
		}
	}
	line := s.buf[ls:le]
	// Only data, event, id and retry count: a colon further in, or a
	// longer line without one, is no field of theirs.
	c := bytes.IndexByte(line[:min(len(line), 6)], ':')
	vs := le
	if c < 0 {
		if len(line) > 5 {
			return
		}
		c = len(line)
	} else {
		vs = ls + c + 1
		if vs < le && s.buf[vs] == ' ' {
			vs++
		}
	}
	switch string(line[:c]) {
	case "data":
		s.dirty = true
		if !s.hasData {
			s.hasData, s.ds, s.de = true, vs, le
			return
		}
		// The line joins the data before it, moved up against it: the
		// bytes it overwrites are parsed already, and the event's type
		// among them is moved out of the way first.
		n := le - vs
		if s.typIn && !s.ownTyp && s.ts < s.de+1+n && s.te > s.de {
			s.typ = append(s.typ[:0], s.buf[s.ts:s.te]...)
			s.ownTyp = true
		}
		s.buf[s.de] = '\n'
		s.joined = true
		copy(s.buf[s.de+1:], s.buf[vs:le])
		s.de += 1 + n
	case "event":
		s.dirty = true
		s.typIn, s.ownTyp, s.ts, s.te = true, false, vs, le
	case "id":
		if bytes.IndexByte(s.buf[vs:le], 0) < 0 {
			s.dirty = true
			s.id = append(s.id[:0], s.buf[vs:le]...)
		}
	}
}

var bom = []byte("\xef\xbb\xbf")

// dispatch ends the current event at a blank line and reports whether
// Next yields it.
func (s *Scanner) dispatch() bool {
	if !s.dirty {
		return false
	}
	ev := Event{}
	if s.hasData {
		ev.Data = unsafeString(s.buf[s.ds:s.de])
	}
	if s.typIn {
		if s.ownTyp {
			ev.Type = unsafeString(s.typ)
		} else {
			ev.Type = unsafeString(s.buf[s.ts:s.te])
		}
	}
	oneLine := !s.joined
	s.dirty, s.hasData, s.typIn, s.ownTyp, s.joined = false, false, false, false, false
	if ev.Type == "" && ev.Data == "" && !s.keepEmpty {
		return false
	}
	s.ev, s.oneLine = ev, oneLine
	return true
}

// fill reads more of the stream, after the lines read so far, and reports
// whether it did.
func (s *Scanner) fill() bool {
	if s.rerr != nil {
		if s.rerr == io.EOF {
			s.fail(io.EOF)
		} else {
			s.fail(fmt.Errorf("sse: read: %w", s.rerr))
		}
		return false
	}
	if s.end-s.start >= s.max {
		s.fail(s.tooLarge())
		return false
	}
	if s.start == s.end || s.end == len(s.buf) || s.start > len(s.buf)/2 {
		s.shift()
	}
	if s.end == len(s.buf) {
		n := min(max(2*len(s.buf), scanStart), s.max)
		buf := make([]byte, n)
		copy(buf, s.buf[:s.end])
		s.buf = buf
	}
	if s.poison {
		for i := range s.buf[:s.start] {
			s.buf[i] = '#'
		}
	}
	for empties := 0; ; empties++ {
		n, err := s.r.Read(s.buf[s.end:])
		s.end += n
		if err != nil {
			s.rerr = err
		} else if n == 0 && empties < maxEmptyReads {
			continue
		} else if n == 0 {
			s.rerr = io.ErrNoProgress
		}
		return true
	}
}

// maxEmptyReads is how many reads in a row may return nothing before the
// reader is taken for broken, as bufio.Scanner takes it.
const maxEmptyReads = 100

// shift moves the bytes of the current event to the buffer's start.
func (s *Scanner) shift() {
	off := s.start
	if off == 0 {
		return
	}
	copy(s.buf, s.buf[off:s.end])
	s.start, s.pos, s.scan, s.end = 0, s.pos-off, s.scan-off, s.end-off
	if s.hasData {
		s.ds, s.de = s.ds-off, s.de-off
	}
	if s.typIn && !s.ownTyp {
		s.ts, s.te = s.ts-off, s.te-off
	}
}

func (s *Scanner) tooLarge() error {
	return fmt.Errorf("%w: larger than %d bytes", ErrEventTooLarge, s.max)
}

func (s *Scanner) fail(err error) {
	s.err, s.ev = err, Event{}
}

// unsafeString is b as a string, without a copy: b must not change while
// the string is in use.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
