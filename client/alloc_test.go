//go:build !race

// The race detector adds allocations, so these checks run only without it.

package client

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

// readStream reads body whole through a resumeBody, in reads of 4 KiB.
func readStream(tb testing.TB, body string, p []byte) {
	req := httptest.NewRequest("POST", "http://ssegate.invalid/v1/chat/completions", nil)
	b := newResumeBody(&Transport{}, req, "k", io.NopCloser(strings.NewReader(body)), "")
	defer b.Close()
	n := 0
	for {
		m, err := b.Read(p)
		n += m
		if err == io.EOF {
			break
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
	if n != len(body) {
		tb.Fatalf("got %d bytes; want %d", n, len(body))
	}
}

// TestResumeBodyAllocs holds a keyed stream read through the client's
// resumeBody to a few allocations an event: one go-sse reader parses every
// event of the body, rather than one reader each.
func TestResumeBodyAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun counts every allocation of the process.
	const n = 400
	body := chatStream(n)
	p := make([]byte, 4<<10)
	got := testing.AllocsPerRun(20, func() { readStream(t, body, p) }) / n
	if got > 3.5 {
		t.Errorf("got %.2f allocs per event; want at most 3.5", got)
	}
}

func BenchmarkResumeBody(b *testing.B) {
	const n = 200
	body := chatStream(n)
	p := make([]byte, 4<<10)
	b.ReportAllocs()
	for b.Loop() {
		readStream(b, body, p)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*(n+1)), "ns/event")
}
