package clients_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestOutOfFileDescriptors: the built binary runs out of file descriptors
// (its limit lowered under it, then connections opened past it) while a
// stream is live. It goes on: the live stream ends whole, the accepts that
// failed are waited out and counted, a request once descriptors are free
// again is answered; the process does not exit on its first failed
// accept, which ended every stream it relayed.
func TestOutOfFileDescriptors(t *testing.T) {
	g := startGate(t, "-upstream", "mock")
	live := &drainStream{name: "live", tokens: 30, delay: 40 * time.Millisecond, started: make(chan struct{}), done: make(chan struct{})}
	go live.run(context.Background(), &http.Client{}, g.URL, "")
	select {
	case <-live.started:
	case <-live.done:
		t.Fatalf("the live stream ended before its first event: %v", live.err)
	}
	var lim unix.Rlimit
	if err := unix.Prlimit(g.Pid(), unix.RLIMIT_NOFILE, nil, &lim); err != nil {
		t.Fatal(err)
	}
	low := unix.Rlimit{Cur: 64, Max: lim.Max}
	if err := unix.Prlimit(g.Pid(), unix.RLIMIT_NOFILE, &low, nil); err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	for range 80 { // past the limit: the rest wait in the listen backlog
		c, err := net.DialTimeout("tcp", g.Addr, time.Second)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	<-live.done
	if live.err != nil || len(live.events) == 0 || live.events[len(live.events)-1].data != "[DONE]" {
		t.Fatalf("the live stream while out of descriptors: %d events, last %v, err %v; want it whole, ending [DONE]", len(live.events), lastData(live.events), live.err)
	}
	for _, c := range conns {
		c.Close()
	}
	if err := unix.Prlimit(g.Pid(), unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatal(err)
	}
	if got := getStatus(g.URL + "/keys/after-the-shortage"); got != http.StatusNotFound {
		t.Fatalf("a request once descriptors are free: got %d; want 404 (answered)", got)
	}
	resp, err := http.Get(g.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if m := string(body); !strings.Contains(m, "ssegate_accept_errors_total ") || strings.Contains(m, "ssegate_accept_errors_total 0\n") {
		t.Errorf("ssegate_accept_errors_total after the shortage: want it above 0; the metrics:\n%s", grepLines(m, "accept_errors"))
	}
	if !strings.Contains(g.Logs(), "accept failed") {
		t.Errorf("no log line of the failed accepts; the logs:\n%s", g.Logs())
	}
}

func lastData(evs []event) string {
	if len(evs) == 0 {
		return ""
	}
	return evs[len(evs)-1].data
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
