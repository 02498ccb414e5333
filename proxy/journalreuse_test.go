package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/mockllm"
)

// TestJoinerWholeWhileJournalsReused: a joiner that reads slowly, well
// past its stream's end, gets the origin's bytes exactly, while another
// tenant's keyed streams end beside it and their journals' blocks go back
// to the pools and are reused (and overwritten first: TestMain). One
// upstream call for the joined key, one for each of the other's.
func TestJoinerWholeWhileJournalsReused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(_ *Config, _ *cache.Config, mc *mockllm.Config) { mc.Tokens = 300 })
	key := newKey("reused")
	hdr := map[string]string{"X-Mock-Delay": "2ms", "X-Mock-Chunk-Bytes": "200"}
	origin := make(chan result, 1)
	go func() { origin <- e.fetch(req{key: key, header: hdr}) }()
	e.waitState(key, "", cache.StateExecutionStarted)

	joined := make(chan []byte, 1)
	conn := dialSmall(t, e, key, chatBody) // joins the live key
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	go func() {
		// About 70 KB at 40 KB/s: the joiner reads on for a second after
		// the stream's end.
		resp, err := http.ReadResponse(bufio.NewReader(&throttled{r: conn, rate: 40 << 10}), nil)
		if err != nil {
			t.Error(err)
			joined <- nil
			return
		}
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Error(err)
		}
		joined <- raw
	}()

	const churners, each = 4, 4
	var wg sync.WaitGroup
	for c := range churners {
		wg.Go(func() {
			for i := range each {
				r := e.fetch(req{key: newKey(fmt.Sprintf("churn-%d-%d", c, i)), auth: "Bearer sk-other", header: map[string]string{"X-Mock-Chunk-Bytes": "200"}})
				if r.lastData() != "[DONE]" {
					t.Errorf("another tenant's stream: last %q; want [DONE]", r.lastData())
				}
			}
		})
	}
	wg.Wait()
	first := <-origin
	raw := <-joined
	if first.lastData() != "[DONE]" {
		t.Fatalf("origin: last %q; want [DONE]", first.lastData())
	}
	if !bytes.Equal(eventBytes(raw), eventBytes(first.raw)) {
		t.Fatalf("the joiner read %d bytes that differ from the origin's %d", len(raw), len(first.raw))
	}
	e.wantCalls(1 + churners*each)
}
