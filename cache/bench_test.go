package cache

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/sse"
)

// chatChunk is a typical ~200-byte OpenAI chat/completions stream chunk.
const chatChunk = `{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk",` +
	`"created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1",` +
	`"choices":[{"index":0,"delta":{"content":" hello"},"finish_reason":null}]}`

// BenchmarkAppend journals one chat chunk per op into a keyed flight; a
// new generation starts every 4,096 events so the journal stays a
// realistic size.
func BenchmarkAppend(b *testing.B) {
	const per = 4096
	m := newMemory(b, Config{})
	var f *Flight
	b.ReportAllocs()
	b.SetBytes(int64(len(chatChunk)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%per == 0 {
			b.StopTimer()
			if f != nil {
				f.Fail(StateFailedRetryable, "bench", nil)
			}
			f = claim(b, m, Scope{Tenant: "t", Key: strconv.Itoa(i)}, "fp")
			f.SetHead(streamHead)
			b.StartTimer()
		}
		if _, err := f.Append("", chatChunk); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFanout has one producer append chat chunks while 64
// subscribers read them; one op is one event delivered to all 64.
func BenchmarkFanout(b *testing.B) {
	const subs, per = 64, 8192
	m := newMemory(b, Config{Limits: Limits{MaxSubscribers: subs}})
	b.ReportAllocs()
	b.SetBytes(int64(len(chatChunk)))
	b.ResetTimer()
	for n, round := 0, 0; n < b.N; round++ {
		f := claim(b, m, Scope{Tenant: "t", Key: strconv.Itoa(round)}, "fp")
		f.SetHead(streamHead)
		var wg sync.WaitGroup
		for range subs {
			s, err := f.Subscribe(0)
			if err != nil {
				b.Fatal(err)
			}
			wg.Go(func() {
				defer s.Close()
				for range s.C() {
					if _, ended := s.Read(); ended {
						return
					}
				}
			})
		}
		k := min(per, b.N-n)
		for range k {
			if _, err := f.Append("", chatChunk); err != nil {
				b.Fatal(err)
			}
		}
		n += k
		f.Fail(StateFailedRetryable, "bench", nil) // ends the followers without a store write
		wg.Wait()
	}
}

// BenchmarkReplay finds the bytes after a position in a committed
// 200-event result, as a resume does.
func BenchmarkReplay(b *testing.B) {
	m := newMemory(b, Config{})
	sc := Scope{Tenant: "t", Key: "k"}
	f := claim(b, m, sc, "fp")
	f.SetHead(streamHead)
	for range 200 {
		if _, err := f.Append("", chatChunk); err != nil {
			b.Fatal(err)
		}
	}
	f.Commit(nil)
	r := begin(b, m, sc, "fp").Result
	if r == nil {
		b.Fatal("no result")
	}
	b.ReportAllocs()
	b.ResetTimer()
	var n int
	for i := 0; i < b.N; i++ {
		p, err := r.After(uint64(i % 201))
		if err != nil {
			b.Fatal(err)
		}
		n += len(p)
	}
	_ = n
}

// BenchmarkBeginAtBound claims a new key in a ledger at its -max-keys
// bound, spread over 100 tenants. "full": nothing has expired, and the
// claim is refused. "expiring": the keys failed one a microsecond after
// the other, and at each claim the clock has moved on a microsecond, so
// that exactly the oldest key has expired; the new key takes its place
// and fails too, as a steady stream of failing keys at the bound would.
func BenchmarkBeginAtBound(b *testing.B) {
	const step = time.Microsecond
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		for _, mode := range []string{"full", "expiring"} {
			b.Run(fmt.Sprintf("keys=%d/%s", n, mode), func(b *testing.B) {
				clk := newClock()
				// A key failed at t expires just before the claim n steps later.
				failedTTL := time.Duration(n)*step - 1
				m := newMemory(b, Config{MaxKeys: n, FailedTTL: failedTTL, Now: clk.Now})
				tenant := func(i int) string { return "t" + strconv.Itoa(i%100) }
				for i := range n {
					f := claim(b, m, Scope{Tenant: tenant(i), Key: strconv.Itoa(i)}, "fp")
					f.Fail(StateFailedRetryable, "bench", nil)
					clk.Advance(step)
				}
				if mode == "full" {
					clk.Advance(-failedTTL) // nothing has expired
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					sc := Scope{Tenant: tenant(i), Key: "new-" + strconv.Itoa(i)}
					if mode == "full" {
						if _, err := m.Begin(sc, "fp"); err == nil {
							b.Fatal("Begin at the bound: got no error; want a refusal")
						}
						continue
					}
					bg, err := m.Begin(sc, "fp")
					if err != nil {
						b.Fatalf("Begin with an expired key: got %v; want a miss", err)
					}
					bg.Flight.Fail(StateFailedRetryable, "bench", nil)
					clk.Advance(step)
				}
			})
		}
	}
}

// BenchmarkStream200 is one keyed stream of 200 chat chunks with one
// subscriber that keeps up: one op appends all 200 and reads each after
// its append. The flight is failed at the end, so no store write counts.
func BenchmarkStream200(b *testing.B) { benchStream200(b, Limits{}) }

// BenchmarkStream200Sealing is BenchmarkStream200 with a journal that
// seals every block its subscriber has read, as under memory pressure.
func BenchmarkStream200Sealing(b *testing.B) { benchStream200(b, Limits{SealStreamBytes: 1}) }

func benchStream200(b *testing.B, lim Limits) {
	m := newMemory(b, Config{Limits: lim})
	b.ReportAllocs()
	b.SetBytes(200 * int64(len(chatChunk)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		f := claim(b, m, Scope{Tenant: "t", Key: strconv.Itoa(i)}, "fp")
		f.SetHead(streamHead)
		s, err := f.Subscribe(0)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for range 200 {
			if _, err := f.Append("", chatChunk); err != nil {
				b.Fatal(err)
			}
			if p, _ := s.Read(); len(p) == 0 {
				b.Fatal("Read: got nothing after an Append")
			}
		}
		b.StopTimer()
		s.Close()
		f.Fail(StateFailedRetryable, "bench", nil)
		b.StartTimer()
	}
}

// BenchmarkUnkeyedEvents is the per-event path of a stream without a key,
// the system calls left out: the mock upstream's 200 chat chunks and
// [DONE] read in place in 4 KiB reads (sse.Scanner), each event judged
// (sse.Detector) and journaled (Append), and before each read the client
// given all that was journaled since the last (ReadSpans, as the
// generation's push does). One op is one stream.
func BenchmarkUnkeyedEvents(b *testing.B) {
	const head = `data: {"id":"chatcmpl-3kTqPz81xVbc","object":"chat.completion.chunk","created":1743811170,"model":"gpt-4o-mini","system_fingerprint":"fp_5c1e0a8b3d","choices":[`
	var sb strings.Builder
	sb.WriteString(head + `{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	for i := range 198 {
		sb.WriteString(head + `{"index":0,"delta":{"content":" token` + strconv.Itoa(i%10) + `"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	}
	sb.WriteString(head + `{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}` + "\n\n" + "data: [DONE]\n\n")
	body := sb.String()
	var at [4][]byte
	var sub *Sub
	r := &pushReader{push: func() {
		for spans, _ := sub.ReadSpans(at[:0]); len(spans) > 0; spans, _ = sub.ReadSpans(at[:0]) {
		}
	}}
	sc := sse.NewScanner(nil, 1<<20)
	det := sse.NewDetector(sse.Expect{})
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		f := NewDetached(1 << 30)
		f.SetHead(streamHead)
		sub, _ = f.Subscribe(0)
		r.s = body
		sc.Reset(r)
		det.Reset(sse.Expect{})
		n := 0
		for sc.Next() {
			ev := sc.Event()
			det.Observe(ev)
			var err error
			if sc.OneLine() {
				_, err = f.AppendLine(ev.Type, ev.Data)
			} else {
				_, err = f.Append(ev.Type, ev.Data)
			}
			if err != nil {
				b.Fatal(err)
			}
			n++
		}
		if ok, why := det.Clean(true); !ok || n != 201 {
			b.Fatalf("%d events, clean %v (%s); want 201, clean", n, ok, why)
		}
		f.Commit(nil)
		r.push()
		sub.Close()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/201, "ns/event")
}

// pushReader reads s as a buffered reader does a socket, 4 KiB at a
// time, calling push before each of those reads.
type pushReader struct {
	s, buf string
	push   func()
}

func (r *pushReader) Read(p []byte) (int, error) {
	if r.buf == "" {
		if r.s == "" {
			return 0, io.EOF
		}
		r.push()
		k := min(len(r.s), 4<<10)
		r.buf, r.s = r.s[:k], r.s[k:]
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}
