package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
)

// http10 sends one HTTP/1.0 request on a connection of its own and reads
// the answer to the connection's end.
func http10(t *testing.T, addr, key string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keyHdr := ""
	if key != "" {
		keyHdr = "Idempotency-Key: " + key + "\r\n"
	}
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", keyHdr, len(chatBody), chatBody)
	c.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // a fresh conn
	raw, err := io.ReadAll(c)                           // the answer ends where the connection closes
	if err != nil {
		t.Fatalf("reading to the connection's end: %v", err)
	}
	head, body, _ := strings.Cut(string(raw), "\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(head+"\r\n\r\n")), nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// TestHTTP10Client: an HTTP/1.0 client gets its stream close-delimited,
// not chunked, and the connection closes at the stream's end: without a
// key, with one, and as a replay.
func TestHTTP10Client(t *testing.T) {
	e := newEnv(t)
	addr := strings.TrimPrefix(e.url, "http://")
	key := newKey("http10")
	for _, c := range []struct{ name, key string }{{"unkeyed", ""}, {"keyed", key}, {"replay", key}} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "replay" {
				e.waitState(key, "", cache.StateCommitted)
			}
			resp, body := http10(t, addr, c.key)
			if resp.StatusCode != 200 || len(resp.TransferEncoding) != 0 {
				t.Fatalf("got %d, Transfer-Encoding %v; want 200 and none", resp.StatusCode, resp.TransferEncoding)
			}
			if !strings.HasPrefix(body, "data: ") && !strings.HasPrefix(body, "id: ") {
				t.Fatalf("body starts %q; want events, not a chunk size", body[:min(20, len(body))])
			}
			evs, _ := parseEvents([]byte(body))
			if n := len(evs); n != 19 || evs[n-1].Data != "[DONE]" {
				t.Fatalf("got %d events ending %q; want 19 ending [DONE]", n, evs[max(n-1, 0)].Data)
			}
			if c.name == "replay" && resp.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay not marked Idempotent-Replayed")
			}
		})
	}
	e.wantCalls(2)
}
