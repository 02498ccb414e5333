package mockllm

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// benchTokens makes a 200-event chat stream: role chunk, 197 content
// chunks, finish chunk, [DONE].
const benchTokens = "197"

// BenchmarkChatStream measures a 200-event chat stream from request to
// [DONE] through a real loopback HTTP client, in events per second.
func BenchmarkChatStream(b *testing.B) {
	_, url := start(b, Config{})
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	read := func() int {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatStream))
		req.Header.Set("X-Mock-Tokens", benchTokens)
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		n := 0
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadSlice('\n')
			if len(line) == 1 {
				n++
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			if bytes.HasPrefix(line, []byte("data: [DONE]")) {
				_, _ = io.Copy(io.Discard, br)
				n++
				break
			}
		}
		return n
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		events := 0
		for b.Loop() {
			events += read()
		}
		if events != 200*b.N {
			b.Fatalf("events: got %d; want %d", events, 200*b.N)
		}
		b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		total := make(chan int, 1024)
		b.RunParallel(func(pb *testing.PB) {
			n := 0
			for pb.Next() {
				n += read()
			}
			total <- n
		})
		close(total)
		events := 0
		for n := range total {
			events += n
		}
		b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	})
}

// BenchmarkAppendChatEvent measures rendering one content chunk, which must
// not allocate.
func BenchmarkAppendChatEvent(b *testing.B) {
	d := newChat(newCompletion([]byte(chatStream), "gpt-4o-mini", 197, 0, 0), false)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		buf = d.appendEvent(buf[:0], 1+i%197)
		i++
	}
	b.SetBytes(int64(len(buf)))
}
