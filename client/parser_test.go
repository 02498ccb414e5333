package client

import (
	"fmt"
	"io"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/poll"
)

// TestEventParserEnds: the go-sse reader of a body runs as a coroutine,
// which ends when the body ends or is closed, read whole or not.
func TestEventParserEnds(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	before := runtime.NumGoroutine()
	body := chatStream(20)
	for i := range 50 {
		req := httptest.NewRequest("POST", "http://ssegate.invalid/v1/chat/completions", nil)
		b := newResumeBody(&Transport{}, req, "k", io.NopCloser(strings.NewReader(body)), "")
		p := make([]byte, 100)
		if _, err := b.Read(p); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := io.Copy(io.Discard, b); err != nil { // to its end, not closed
				t.Fatal(err)
			}
			continue
		}
		b.Close() // in the middle
	}
	poll.For(t, 5*time.Second, "the readers' goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}

// TestEventParserIDs: each event's id is its own, with one reader for
// them all: an event without one leaves the body idless.
func TestEventParserIDs(t *testing.T) {
	t.Parallel()
	req := httptest.NewRequest("POST", "http://ssegate.invalid/v1/chat/completions", nil)
	body := "id: 1-1\ndata: a\n\n: ping\n\nid: 1-2\nevent: x\ndata: b\r\n\r\ndata: c\n\n"
	b := newResumeBody(&Transport{}, req, "k", io.NopCloser(strings.NewReader(body)), "")
	defer b.Close()
	got, err := io.ReadAll(b)
	if err != nil || string(got) != body {
		t.Fatalf("got %q, %v; want the body", got, err)
	}
	if b.lastID != "1-2" || !b.idless {
		t.Errorf("got last id %q, idless %v; want 1-2, true", b.lastID, b.idless)
	}
}

// chatStream is n chat chunks with ssegate's ids, and [DONE].
func chatStream(n int) string {
	var sb strings.Builder
	for i := range n {
		fmt.Fprintf(&sb, "id: 1764403200123-%d\ndata: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" joke\"},\"finish_reason\":null}]}\n\n", i+1)
		if i%50 == 0 {
			sb.WriteString(": ping\n\n")
		}
	}
	fmt.Fprintf(&sb, "id: 1764403200123-%d\ndata: [DONE]\n\n", n+1)
	return sb.String()
}
