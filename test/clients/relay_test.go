package clients_test

import (
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/poll"
)

// TestUnkeyedWholeAnswerLeavesNothing: requests without a key whose
// answers are not streams (non-streaming completions) are relayed as they
// come, and once they are answered nothing of ssegate's is left running
// for them: a goroutine per such request would grow without bound.
func TestUnkeyedWholeAnswerLeavesNothing(t *testing.T) {
	const n = 4
	mock, upstream := startMock(t, mockllm.Config{Tokens: 4, Delay: 25 * time.Millisecond})
	base := startInProcess(t, upstream)
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	before, _ := ownGoroutines()
	for range n {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer sk-test")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"choices"`) {
			t.Fatalf("got %d %q, %v; want 200 with the completion", resp.StatusCode, b, err)
		}
	}
	if got := mock.Calls(); got != n {
		t.Fatalf("upstream calls: got %d; want %d", got, n)
	}
	var now int
	var stacks string
	// The proxy keeps an idle worker 2 s after its last request, as
	// fasthttp keeps its own: past that, nothing of ssegate's is left.
	if !poll.Until(5*time.Second, func() bool { now, stacks = ownGoroutines(); return now <= before }) {
		t.Fatalf("goroutines running ssegate's code after %d answered requests: got %d; want %d, as before them:\n%s", n, now, before, stacks)
	}
}

// ownGoroutines counts the goroutines running code of ssegate's packages,
// and returns their stacks.
func ownGoroutines() (int, string) {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var own []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		for _, p := range []string{"ssegate/proxy.", "ssegate/cache.", "ssegate/sse."} {
			if strings.Contains(g, p) {
				own = append(own, g)
				break
			}
		}
	}
	return len(own), strings.Join(own, "\n\n")
}
