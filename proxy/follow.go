package proxy

import (
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
)

var pingComment = sse.AppendComment(nil, "ping")

// follow writes a flight's events to c as they come, with a heartbeat
// while idle, and ends the stream as the flight ends: after the last event
// when it was committed, with a stream_aborted error event when it was not.
// It returns false when the client went away. With measure set, the delay
// between journaling the first event and flushing it here is observed.
func (p *Proxy) follow(c *client, sub *cache.Sub, f *cache.Flight, measure bool) bool {
	defer sub.Close()
	hb := time.NewTimer(p.cfg.Heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-sub.C():
		case <-hb.C:
			if c.write(pingComment) != nil {
				return false
			}
			hb.Reset(p.cfg.Heartbeat)
			continue
		}
		for {
			data, ended := sub.Read()
			if len(data) == 0 && len(c.buf) > 0 && !ended {
				if c.write(nil) != nil { // the head, so the client sees the answer start
					return false
				}
			}
			if len(data) > 0 {
				if c.write(data) != nil {
					return false
				}
				if measure {
					measure = false
					if t := f.FirstEventAt(); !t.IsZero() {
						p.m.ttfeAdded.Observe(time.Since(t).Seconds())
					}
				}
			}
			if ended {
				state, reason, _ := f.Outcome()
				if end := endFrame(state, reason); end != nil {
					return c.write(end) == nil
				}
				return true
			}
			if len(data) == 0 {
				break // caught up: wait for the next signal
			}
		}
		hb.Reset(p.cfg.Heartbeat)
	}
}

// saved counts the tokens of an answer served without a new generation.
func (p *Proxy) saved(u cache.Usage) {
	if u.Input > 0 {
		p.m.tokensSaved.WithLabelValues("input").Add(float64(u.Input))
	}
	if u.Output > 0 {
		p.m.tokensSaved.WithLabelValues("output").Add(float64(u.Output))
	}
}
