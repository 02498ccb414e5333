package proxy

import "time"

// workers runs the goroutines every request starts (its generation, the
// wait for its head, its connection's next request) on goroutines kept a
// while after their last one, as fasthttp's server keeps its own: a new
// goroutine's stack starts at 2 KiB and is copied, frame by frame, each
// time it doubles on the way to the depth a request reaches, which cost
// about a tenth of a short stream's CPU.
//
// A worker belongs to no request: it runs what run hands it and ends once
// it was idle for workerIdle. Nothing it runs may outlive the proxy's own
// accounting (gens, clients), which the functions keep as a go statement's
// would.
type workers struct {
	ready chan func() // unbuffered: a send is taken only by an idle worker
}

// workerIdle is how long an idle worker waits for another function, as
// long as the server's own idle workers (Server.MaxIdleWorkerDuration).
const workerIdle = 2 * time.Second

func newWorkers() *workers { return &workers{ready: make(chan func())} }

// run runs fn on an idle worker, or on a new one when none is idle. Like a
// go statement, it does not wait for fn.
func (w *workers) run(fn func()) {
	select {
	case w.ready <- fn:
	default:
		go w.work(fn)
	}
}

// work runs fn, then each function run hands it, until none came for
// workerIdle.
func (w *workers) work(fn func()) {
	t := time.NewTimer(workerIdle)
	defer t.Stop()
	for {
		fn()
		fn = nil // what the last one held is not kept while idle
		t.Reset(workerIdle)
		select {
		case fn = <-w.ready:
		case <-t.C:
			return
		}
	}
}
