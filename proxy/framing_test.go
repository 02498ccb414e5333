package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/ssegate/ssegate/cache"
)

const plainJSON = `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello there"},"finish_reason":"stop"}]}`

// answerRaw reads the request and writes raw, then closes the connection.
func answerRaw(raw string) func(*rawUpstream, net.Conn) {
	return func(_ *rawUpstream, c net.Conn) {
		readRequest(c)
		io.WriteString(c, raw) //nolint:errcheck // the test reads what arrived
	}
}

// TestNonStreamingFraming: framing decides whether a non-streaming 2xx
// body is whole. A body with a Content-Length or chunked framing is
// stored only when the framing was met; one that ends where the
// connection closes only when it parses as the JSON its Content-Type
// says. Otherwise the client gets 502, nothing is stored, and a repeat
// is a new generation.
func TestNonStreamingFraming(t *testing.T) {
	half := plainJSON[:len(plainJSON)/2]
	cases := []struct {
		name   string
		raw    string
		stored bool
	}{
		{"close-delimited, whole JSON", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + plainJSON, true},
		{"close-delimited, cut JSON", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + half, false},
		{"close-delimited, not JSON", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nhello there", false},
		{"shorter than Content-Length", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(plainJSON), half), false},
		{"chunked, last chunk missing", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(half), half), false},
		{"chunked, whole", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(plainJSON), plainJSON), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u := newRawUpstream(t, answerRaw(c.raw))
			e := retryEnv(t, []string{u.url}, nil)
			key := newKey("framing")
			body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
			got := e.fetch(req{key: key, body: body})
			if c.stored {
				if got.status != 200 || string(got.raw) != plainJSON {
					t.Fatalf("got %d %q; want 200 and the whole body", got.status, got.raw)
				}
				e.waitState(key, "", cache.StateCommitted)
				again := e.fetch(req{key: key, body: body})
				if !again.replayed || string(again.raw) != plainJSON {
					t.Fatalf("repeat: got replayed %v %q; want the stored body", again.replayed, again.raw)
				}
				wantCount(t, "upstream calls", u.calls.Load(), 1)
				return
			}
			if got.status != http.StatusBadGateway || got.errType != "upstream_error" {
				t.Fatalf("got %d %q %q; want 502 upstream_error", got.status, got.errType, got.raw)
			}
			e.waitState(key, "", cache.StateFailedRetryable)
			again := e.fetch(req{key: key, body: body})
			if again.replayed {
				t.Fatalf("repeat was replayed; want a new generation")
			}
			wantCount(t, "upstream calls", u.calls.Load(), 2)
		})
	}
}

// TestUnkeyedCutBody: without a key a non-streaming body is relayed as it
// comes; a cut in it reaches the client as a cut (the answer ends without
// its last chunk, or, relayed as it came, where the upstream closed), never
// as a whole body behind a clean terminator.
func TestUnkeyedCutBody(t *testing.T) {
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
