package sse

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"iter"

	gosse "github.com/tmaxmax/go-sse"
)

// DefaultMaxEventSize is the event size bound Read uses when given none.
// go-sse's own default (64 KiB) is too small: a Responses API
// response.completed event carries the whole response object.
const DefaultMaxEventSize = 4 << 20

// Event is one event read from an upstream stream (its id and retry fields
// are dropped; the proxy assigns ids).
type Event struct {
	Type string // the event: field, "" when unnamed
	Data string // data lines joined with "\n"
}

// ErrEventTooLarge is returned, wrapped, by Read when one event exceeds the
// size bound; the proxy aborts the stream rather than relay a partial event.
var ErrEventTooLarge = errors.New("sse: event too large")

// Read yields the events of r as owned strings, parsed by go-sse's sse.Read
// with ReadConfig{MaxEventSize: maxEventSize}; maxEventSize <= 0 means
// DefaultMaxEventSize. The bound covers one event's raw bytes, field names
// and line breaks included. The proxy's upstream path reads with a
// Scanner instead, which parses as Read does without copying; Read is for
// events that must outlive the next one, and is the Scanner's reference.
//
// At the end of r, Read stops without an error, and an incomplete final
// event (one not ended by a blank line) is silently discarded, as the SSE
// specification requires. So a loop that ends without an error does NOT mean
// the stream was complete: judge that with a Detector. A read error from r
// other than io.EOF (such as io.ErrUnexpectedEOF from a cut chunked body) is
// yielded once, wrapped, and ends the sequence; an event larger than the
// bound yields an error wrapping ErrEventTooLarge.
//
// Events with empty Data and empty Type (id-only or retry-only blocks) are
// skipped: the proxy drops upstream ids anyway, and relaying an empty event
// would only confuse clients. The sequence reads r as it goes, so it can be
// ranged over once.
func Read(r io.Reader, maxEventSize int) iter.Seq2[Event, error] {
	if maxEventSize <= 0 {
		maxEventSize = DefaultMaxEventSize
	}
	cfg := &gosse.ReadConfig{MaxEventSize: maxEventSize}
	return func(yield func(Event, error) bool) {
		for ev, err := range gosse.Read(r, cfg) {
			if err != nil {
				if errors.Is(err, bufio.ErrTooLong) {
					err = fmt.Errorf("%w: larger than %d bytes", ErrEventTooLarge, maxEventSize)
				} else {
					err = fmt.Errorf("sse: read: %w", err)
				}
				yield(Event{}, err)
				return
			}
			if ev.Type == "" && ev.Data == "" {
				continue
			}
			if !yield(Event{Type: ev.Type, Data: ev.Data}, nil) {
				return
			}
		}
	}
}
