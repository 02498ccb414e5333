package clients_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/poll"
)

// curl runs the curl binary with args and returns its standard output;
// -w '\n%{http_code}' puts the status on the last line.
func curl(t *testing.T, args ...string) (status, body string) {
	t.Helper()
	path, err := exec.LookPath("curl")
	if err != nil {
		t.Fatalf("curl is not installed (.ci/run installs it): %v", err)
	}
	out, err := exec.Command(path, append([]string{"-sS", "--max-time", "10", "-w", "\n%{http_code}"}, args...)...).Output()
	if err != nil {
		t.Fatalf("curl %v: %v", args, err)
	}
	s := string(out)
	i := strings.LastIndexByte(s, '\n')
	return s[i+1:], s[:i]
}

// TestStopWithCurl: a keyed stream through the built binary, stopped with
// the curl the docs show (DELETE /streams/{key}). Another tenant's curl
// is 404 and the stream runs on; the tenant's is 200 with the key's state
// cancelled; the upstream call ends within a second; the client's stream
// ends with stream_aborted code cancelled; the upstream was called once,
// and a repeat of the key is refused (409 stream_cancelled), not run.
func TestStopWithCurl(t *testing.T) {
	mock, upstream := startMock(t, mockllm.Config{Tokens: 2000, Delay: 20 * time.Millisecond})
	g := startGate(t, "-upstream", upstream)
	const key = "curl-stop-1"
	body := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer sk-one")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("keyed stream: %s", resp.Status)
	}
	first := make(chan struct{})
	type result struct {
		last event
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var once bool
		evs, err := readEvents(resp.Body, func(event) {
			if !once {
				once = true
				close(first)
			}
		})
		var last event
		if len(evs) > 0 {
			last = evs[len(evs)-1]
		}
		done <- result{last, err}
	}()
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}

	if st, b := curl(t, "-X", "DELETE", "-H", "Authorization: Bearer sk-two", g.URL+"/streams/"+key); st != "404" || !strings.Contains(b, "stream_not_found") {
		t.Fatalf("another tenant's curl: got %s %s; want 404 stream_not_found", st, b)
	}
	if mock.Active() != 1 {
		t.Fatalf("after another tenant's stop: %d upstream streams; want 1", mock.Active())
	}

	stopped := time.Now()
	st, b := curl(t, "-X", "DELETE", "-H", "Authorization: Bearer sk-one", g.URL+"/streams/"+key)
	var info struct{ Key, State string }
	if err := json.Unmarshal([]byte(b), &info); st != "200" || err != nil || info.State != "cancelled" || info.Key != key {
		t.Fatalf("curl -X DELETE /streams/%s: got %s %s; want 200 with the key's state cancelled", key, st, b)
	}
	if !poll.Until(time.Second, func() bool { return mock.Active() == 0 }) {
		t.Fatalf("a second after the stop the upstream still streams (%d active)", mock.Active())
	}
	t.Logf("the upstream call ended %v after the stop", time.Since(stopped).Round(time.Millisecond))

	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the client's stream did not end within 10s of the stop")
	}
	if r.last.typ != "error" || !strings.Contains(r.last.data, `"stream_aborted"`) || !strings.Contains(r.last.data, `"cancelled"`) {
		t.Fatalf("the client's last event: %+v (read error %v); want an error event stream_aborted, code cancelled", r.last, r.err)
	}

	req2, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/chat/completions", strings.NewReader(body))
	req2.Header.Set("Authorization", "Bearer sk-one")
	req2.Header.Set("Content-Type", "application/json")
	req2.Header.Set("Idempotency-Key", key)
	resp2, err := http.DefaultClient.Do(req2)
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Error struct{ Type string } `json:"error"`
	}
	json.NewDecoder(resp2.Body).Decode(&e) //nolint:errcheck // checked through e
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusConflict || e.Error.Type != "stream_cancelled" {
		t.Errorf("a repeat of the stopped key: got %d %q; want 409 stream_cancelled", resp2.StatusCode, e.Error.Type)
	}
	if n := mock.Calls(); n != 1 {
		t.Errorf("upstream calls: got %d; want 1", n)
	}
}
