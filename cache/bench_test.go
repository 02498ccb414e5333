package cache

import (
	"strconv"
	"sync"
	"testing"
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
