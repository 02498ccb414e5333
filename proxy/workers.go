package proxy

import (
	"sync"
	"time"
)

// workers runs the goroutines every request starts (its generation, the
// wait for its head, its connection's next request) on goroutines kept a
// while after their last one, as fasthttp's server keeps its own: a new
// goroutine's stack starts at 2 KiB and is copied, frame by frame, each
// time it doubles on the way to the depth a request reaches, which cost
// about a tenth of a short stream's CPU.
//
// The idle workers are a stack: run hands a function to the one idle
// last, so that under a trickle of requests the few most recent workers
// serve it and the rest of a burst's workers end after idle, as
// fasthttp's do. (Idle workers waiting on one channel would take turns,
// and a trickle of one function per idle/n would keep n of them.)
//
// A worker belongs to no request: it runs what run hands it and ends once
// it was idle for idle. Nothing it runs may outlive the proxy's own
// accounting (gens, clients), which the functions keep as a go statement's
// would.
type workers struct {
	idle time.Duration

	mu    sync.Mutex // guards ready
	ready []*worker  // the idle workers, the one idle last at the end
}

// worker is one idle-able goroutine; run hands it a function on fn.
type worker struct {
	fn chan func() // buffered 1: run's send never waits
}

// workerIdle is how long an idle worker waits for another function, as
// long as the server's own idle workers (Server.MaxIdleWorkerDuration).
const workerIdle = 2 * time.Second

func newWorkers(idle time.Duration) *workers { return &workers{idle: idle} }

// run runs fn on the worker idle last, or on a new one when none is idle.
// Like a go statement, it does not wait for fn.
func (w *workers) run(fn func()) {
	w.mu.Lock()
	if n := len(w.ready); n > 0 {
		k := w.ready[n-1]
		w.ready[n-1] = nil
		w.ready = w.ready[:n-1]
		w.mu.Unlock()
		k.fn <- fn
		return
	}
	w.mu.Unlock()
	go w.work(&worker{fn: make(chan func(), 1)}, fn)
}

// work runs fn, then each function run hands it, until none came for
// idle.
func (w *workers) work(k *worker, fn func()) {
	t := time.NewTimer(w.idle)
	defer t.Stop()
	for {
		fn()
		fn = nil // what the last one held is not kept while idle
		w.mu.Lock()
		w.ready = append(w.ready, k)
		w.mu.Unlock()
		t.Reset(w.idle)
		select {
		case fn = <-k.fn:
			continue
		case <-t.C:
		}
		// Idle for w.idle: leave, unless run took k from ready meanwhile
		// and its function is on the way.
		if w.leave(k) {
			return
		}
		fn = <-k.fn
	}
}

// leave takes k out of ready and reports whether it was there. The
// workers idle longest are at the start, where a worker that ends is
// nearly always found and taken off without moving the rest.
func (w *workers) leave(k *worker) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, r := range w.ready {
		if r != k {
			continue
		}
		if i == 0 {
			w.ready[0] = nil
			w.ready = w.ready[1:]
		} else {
			copy(w.ready[i:], w.ready[i+1:])
			w.ready[len(w.ready)-1] = nil
			w.ready = w.ready[:len(w.ready)-1]
		}
		return true
	}
	return false
}
