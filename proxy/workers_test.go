package proxy

import (
	"io"
	"math"
	"net/http"
	rtmetrics "runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/poll"
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
	upstream := "http://" + e.proxy.ups[0].Addr()
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

// TestWorkersTrickleEndsBurst: after a burst, a trickle of functions is
// served by the worker idle last, and the rest of the burst's workers end
// once idle. Workers that took turns would all stay: a trickle of one
// function per idle/40 would keep 16.
func TestWorkersTrickleEndsBurst(t *testing.T) {
	t.Parallel()
	const idle, burst = time.Second, 16
	w := newWorkers(idle)
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(burst)
	for range burst {
		w.run(func() { started.Done(); <-release })
	}
	started.Wait() // burst workers, each running a function
	close(release)
	if !poll.Until(idle/2, func() bool { return w.idleWorkers() == burst }) {
		t.Fatalf("%d workers idle half the idle time after the burst; want %d", w.idleWorkers(), burst)
	}
	// One function every idle/40 for 3×idle: each of 16 workers taking
	// turns would run one every 0.4×idle and never end.
	done := make(chan struct{})
	for end := time.Now().Add(3 * idle); time.Now().Before(end); time.Sleep(idle / 40) {
		w.run(func() { done <- struct{}{} })
		<-done
	}
	if n := w.idleWorkers(); n > 2 {
		t.Errorf("%d workers idle after a trickle of 3×idle; want the trickle's own (at most 2)", n)
	}
}

// TestWorkersRunEachOnce runs functions from many goroutines while
// workers end (idle 1 ms): every function runs exactly once, whether the
// worker it was handed to was about to end or not.
func TestWorkersRunEachOnce(t *testing.T) {
	t.Parallel()
	w := newWorkers(time.Millisecond)
	const callers, each = 8, 500
	var ran atomic.Int64
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				wg.Add(1)
				w.run(func() { ran.Add(1); wg.Done() })
				if (c+i)%7 == 0 {
					time.Sleep(time.Millisecond) // let some workers end
				}
			}
		}()
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d functions ran in 10s; want %d: some were handed to a worker that ended", ran.Load(), callers*each)
	}
	if got := ran.Load(); got != callers*each {
		t.Errorf("%d functions ran; want %d", got, callers*each)
	}
}

// idleWorkers is how many workers wait for a function.
func (w *workers) idleWorkers() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ready)
}
