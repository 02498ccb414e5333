package observe_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// request is one call of the load.
type request struct {
	path, body  string
	key, fault  string // Idempotency-Key, X-Mock-Fault (the embedded mock's)
	lastEventID string
	traceparent string        // the caller's span (W3C Trace Context)
	delay       time.Duration // before it is sent
}

// answer is what the client got: the status and the SSE ids, in order.
type answer struct {
	status int
	ids    []string
}

// send makes r against the ssegate at base and reads its answer to the end
// (an aborted stream included: that is a fault of the load's making).
func send(t *testing.T, base string, r request) answer {
	t.Helper()
	time.Sleep(r.delay)
	req, err := http.NewRequest(http.MethodPost, base+r.path, strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-observe")
	for h, v := range map[string]string{"Idempotency-Key": r.key, "X-Mock-Fault": r.fault, "Last-Event-ID": r.lastEventID, "traceparent": r.traceparent} {
		if v != "" {
			req.Header.Set(h, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", r.path, err)
		return answer{}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body) // a cut stream ends in an error here: what was read is kept
	a := answer{status: resp.StatusCode}
	for line := range strings.Lines(string(raw)) {
		if id, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "id: "); ok {
			a.ids = append(a.ids, id)
		}
	}
	return a
}
