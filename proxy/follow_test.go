package proxy

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
)

// TestHeartbeat: an idle stream gets keep-alive comments, which are not
// part of the recorded stream.
func TestHeartbeat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, slowMock(120*time.Millisecond, 4), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.Heartbeat = 30 * time.Millisecond
	})
	key := newKey("hb")
	first := e.fetch(req{key: key})
	if !strings.Contains(string(first.raw), ": ping\n\n") {
		t.Fatalf("no keep-alive comment in a stream with 120 ms gaps and a 30 ms heartbeat")
	}
	e.waitState(key, "", cache.StateCommitted)
	replay := e.fetch(req{key: key})
	if strings.Contains(string(replay.raw), ": ping") {
		t.Fatalf("keep-alive comments were recorded")
	}
	if string(eventBytes(first.raw)) != string(replay.raw) {
		t.Fatalf("replay differs from the original's events")
	}
}

// TestSlowSubscriberDropped: a joiner whose connection accepts nothing is
// dropped after -slow-client-timeout, and neither the generation nor a
// fast joiner waits for it.
func TestSlowSubscriberDropped(t *testing.T) {
	// Not parallel: it times the fast client of a 12 MB stream, which
	// other tests' load would skew.
	e := newEnv(t, slowMock(time.Millisecond, 1500), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.SlowClientTimeout = time.Second
	})
	key := newKey("slow")
	hdr := map[string]string{"X-Mock-Chunk-Bytes": "8000"} // ~12 MB in all: more than socket buffers hold
	start := time.Now()
	fast := e.do(req{key: key, header: hdr})
	// The slow client: a connection with a small receive buffer that
	// sends the same request and then reads nothing.
	conn := keyedConn(t, e, key, "X-Mock-Chunk-Bytes: 8000\r\n")

	body, err := io.ReadAll(fast.Body)
	fast.Body.Close()
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := parseEvents(body)
	if n := len(evs); n != 1503 || evs[n-1].Data != "[DONE]" {
		t.Fatalf("fast client: got %d events; want 1503 ending [DONE]", n)
	}
	// 1,500 events at 1 ms: the fast client must not have waited for the
	// slow one's 1 s stalls, let alone its whole stream.
	if took > 8*time.Second {
		t.Fatalf("fast client took %v", took)
	}
	e.waitState(key, "", cache.StateCommitted)
	// The slow client now reads what it was sent: a prefix, then the end
	// of the connection, without the stream's end.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	slowRaw, _ := io.ReadAll(conn)
	if strings.Contains(string(slowRaw), "data: [DONE]") {
		t.Fatalf("slow client received the whole stream (%d bytes); want it dropped", len(slowRaw))
	}
	if !strings.Contains(string(slowRaw), "200 OK") {
		t.Fatalf("slow client got no answer head")
	}
	e.wantCalls(1)
}
