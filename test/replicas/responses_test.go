package replicas_test

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/tidwall/gjson"
)

// TestResponsesResumeOnOtherReplica: a keyed Responses stream begun on A
// is resumed on B by OpenAI's own API, GET /v1/responses/{id}?stream=true
// &starting_after=N: B knows the id through Redis and answers from the
// journal, live, the events after N to response.completed; one upstream
// call.
func TestResponsesResumeOnOtherReplica(t *testing.T) {
	backends(t, func(t *testing.T, be backend) {
		e := be.newEnv(t, mockllm.Config{Tokens: 60, Delay: 10 * time.Millisecond})
		a, b := e.start("A"), e.start("B")
		do := func(method, url, key, body string) *stream {
			t.Helper()
			req, err := http.NewRequest(method, url, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer replicas-test")
			req.Header.Set("Content-Type", "application/json")
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			return &stream{status: resp.StatusCode, header: resp.Header, resp: resp, r: bufio.NewReader(resp.Body)}
		}
		s := do(http.MethodPost, a.URL+"/v1/responses", "responses", `{"model":"gpt-4o-mini","stream":true,"input":"hi"}`)
		s.readN(t, 10)
		s.close()
		id := gjson.Get(s.events[0].data, "response.id").String()
		if id == "" {
			t.Fatalf("no response id in %q", s.events[0].data)
		}
		r := do(http.MethodGet, b.URL+"/v1/responses/"+id+"?stream=true&starting_after=7", "", "").readAll()
		if r.status != 200 || len(r.events) == 0 || r.events[len(r.events)-1].typ != "response.completed" {
			t.Fatalf("resume on B: status %d, %d events; want 200 on to response.completed", r.status, len(r.events))
		}
		for i, ev := range r.events {
			if got := gjson.Get(ev.data, "sequence_number").Int(); got != int64(8+i) {
				t.Fatalf("event %d: sequence_number %d; want %s", i, got, strconv.Itoa(8+i))
			}
		}
		if n := e.mock.Calls(); n != 1 {
			t.Fatalf("upstream calls: got %d; want 1", n)
		}
	})
}
