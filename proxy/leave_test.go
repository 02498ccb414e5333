package proxy

import (
	"bufio"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
)

// rawStream sends a streaming chat request on a connection of its own
// (with a small receive buffer, so that a client that stops reading is
// felt at once) and reads until n events arrived.
func rawStream(t *testing.T, addr, key string, tokens, n int) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn := c.(*net.TCPConn)
	conn.SetReadBuffer(4096) //nolint:errcheck // a hint
	keyHdr := ""
	if key != "" {
		keyHdr = "Idempotency-Key: " + key + "\r\n"
	}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sX-Mock-Tokens: %d\r\nX-Mock-Chunk-Bytes: 8000\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		keyHdr, tokens, len(chatBody), chatBody)
	br := bufio.NewReader(conn)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
	for seen := 0; seen < n; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d events: %v", seen, err)
		}
		if strings.HasPrefix(line, "data: ") {
			seen++
		}
	}
	return conn
}

// within polls cond until it holds or d passed.
func within(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// TestClientLeavesMidStream: a client that closes, resets or stops reading
// mid-stream never wedges the generation. Without a key the upstream call
// ends within a second (its connection closed: the mock stops writing);
// with one, the generation reads on and commits. Either way the slot of
// -max-streams (ssegate_live_generations) comes back, and no goroutine is
// left behind.
func TestClientLeavesMidStream(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		for _, how := range []string{"close", "reset", "stop-reading"} {
			t.Run(fmt.Sprintf("keyed=%v/%s", keyed, how), func(t *testing.T) {
				e := newEnv(t, slowMock(2*time.Millisecond, 16), func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
					pc.SlowClientTimeout = 300 * time.Millisecond
				})
				addr := strings.TrimPrefix(e.url, "http://")
				// A first stream starts what lives as long as the server
				// (its worker pool's cleaner, the upstream pool's).
				rawStream(t, addr, "", 3, 4).Close()
				within(time.Second, func() bool { return e.proxy.streams.Load() == 0 })
				before := runtime.NumGoroutine()
				key, tokens := "", 5000 // 10 s of stream, 40 MB: far more than socket buffers
				if keyed {
					key, tokens = newKey("leave"), 600
				}
				conn := rawStream(t, addr, key, tokens, 5)
				left := time.Now()
				switch how {
				case "close":
					conn.Close()
				case "reset":
					conn.SetLinger(0) //nolint:errcheck
					conn.Close()
				case "stop-reading":
					defer conn.Close()
				}
				if keyed {
					e.waitState(key, "", cache.StateCommitted)
				} else if !within(2*time.Second+e.proxy.cfg.SlowClientTimeout, func() bool { return e.mock.Active() == 0 }) {
					t.Fatalf("upstream stream still written %v after the client left; want it ended", time.Since(left))
				}
				if !within(time.Second, func() bool { return e.proxy.streams.Load() == 0 }) {
					t.Fatalf("live generations: got %d a second after the stream ended; want 0", e.proxy.streams.Load())
				}
				conn.Close()
				if !within(5*time.Second, func() bool { return runtime.NumGoroutine() <= before+2 }) {
					buf := make([]byte, 1<<20)
					t.Fatalf("goroutines: got %d; want at most %d (before the request + 2)\n%s",
						runtime.NumGoroutine(), before+2, buf[:runtime.Stack(buf, true)])
				}
				e.wantCalls(2) // the first stream's and this one's
			})
		}
	}
}
