package proxy

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// TestRelayWholeAnswers: without a key, an answer that is not an event
// stream is relayed as the upstream gave it, whether it comes after the
// client's connection was taken over (a completion that takes a while)
// or before (an immediate 400), and nothing is replayed: one upstream
// call per request.
func TestRelayWholeAnswers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(5*time.Millisecond, 20))
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	for i := range 2 {
		r := e.fetch(req{body: body})
		if r.status != 200 || r.replayed || !strings.Contains(string(r.raw), `"chat.completion"`) {
			t.Fatalf("completion %d: got %d replayed %v %q; want the upstream's 200 JSON", i, r.status, r.replayed, r.raw)
		}
	}
	e.wantCalls(2)
	r := e.fetch(req{header: map[string]string{"X-Mock-Fault": "status=400"}})
	if r.status != 400 || r.errType == "" {
		t.Fatalf("got %d %q; want the upstream's own 400 with its error body", r.status, r.raw)
	}
	e.wantCalls(3)
}

// TestUnkeyedCutBody: without a key a non-streaming body is relayed as it
// comes; a cut in it reaches the client as a cut (the answer ends without
// its last chunk, or, relayed as it came, where the upstream closed), never
// as a whole body behind a clean terminator.
func TestUnkeyedCutBody(t *testing.T) {
	t.Parallel()
	half := plainJSON[:len(plainJSON)/2]
	cases := []struct {
		name    string
		raw     string
		wantErr bool // the client's read of the body fails
		want    string
	}{
		{"shorter than Content-Length", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(plainJSON), half), true, half},
		{"chunked, last chunk missing", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(half), half), true, half},
		{"close-delimited: relayed close-delimited", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + half, false, half},
		{"whole, Content-Length", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(plainJSON), plainJSON), false, plainJSON},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			u := newRawUpstream(t, answerRaw(c.raw))
			e := retryEnv(t, []string{u.url}, nil)
			resp := e.do(req{body: `{"model":"gpt-4o-mini","messages":[]}`})
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if (err != nil) != c.wantErr || string(b) != c.want {
				t.Fatalf("got body %q, read error %v; want %q, error %v", b, err, c.want, c.wantErr)
			}
			if strings.HasPrefix(c.name, "close-delimited") {
				if len(resp.TransferEncoding) != 0 || resp.ContentLength != -1 || !resp.Close {
					t.Fatalf("got Transfer-Encoding %v, Content-Length %d, close %v; want a body that ends with the connection", resp.TransferEncoding, resp.ContentLength, resp.Close)
				}
			}
			wantCount(t, "upstream calls", u.calls.Load(), 1)
		})
	}
}
