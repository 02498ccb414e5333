package proxy

import (
	"io"
	"math"
	"net/http"
	rtmetrics "runtime/metrics"
	"strings"
	"testing"
)

// TestRequestGoroutines holds the goroutines a streamed request starts in
// the proxy to the one fasthttp's take-over starts: its generation, and
// its connection's next request, run on workers kept from earlier
// requests, whose stacks have grown already, and a keyed request of the
// in-memory store starts no wait for its head. Counted over the whole
// process, less what the same requests cost straight to the upstream.
func TestRequestGoroutines(t *testing.T) {
	// Not parallel: the process's goroutines are counted.
	e := newEnv(t)
	upstream := "http://" + e.proxy.ups[0].base.Host
	sample := []rtmetrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	created := func() uint64 {
		rtmetrics.Read(sample)
		return sample[0].Value.Uint64()
	}
	perRequest := func(base string, keyed bool) float64 {
		get := func() {
			hr, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatBody))
			if err != nil {
				t.Fatal(err)
			}
			hr.Header.Set("Content-Type", "application/json")
			if keyed {
				hr.Header.Set("Idempotency-Key", newKey("goroutines"))
			}
			resp, err := e.client.Do(hr)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if n, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != 200 || n == 0 {
				t.Fatalf("got %d, %d bytes, %v; want a stream", resp.StatusCode, n, err)
			}
		}
		for range 3 { // warm: the connections, and the workers
			get()
		}
		const n = 20
		// The lowest of a few runs: other goroutines' starts only add.
		best := math.Inf(1)
		for range 3 {
			before := created()
			for range n {
				get()
			}
			best = min(best, float64(created()-before)/n)
		}
		return best
	}
	direct := perRequest(upstream, false)
	for _, keyed := range []bool{false, true} {
		through := perRequest(e.url, keyed)
		t.Logf("keyed %v: %.2f goroutines started per request through the proxy, %.2f straight to the upstream", keyed, through, direct)
		if got := through - direct; got > 1.5 {
			t.Errorf("keyed %v: the proxy started %.2f goroutines per request; want at most 1 (fasthttp's take-over)", keyed, got)
		}
	}
	e.wantCalls(3 * (3 + 3*20)) // every request a new generation: no key repeats
}
