package upstream

import (
	"io"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/valyala/fasthttp"
)

// testConfig is an upstream's config with the proxy's default bounds.
func testConfig() *Config {
	retry := &RetryConfig{}
	retry.SetDefaults()
	return &Config{ConnectTimeout: 10 * time.Second, HeadTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, MaxConns: 16, Retry: retry}
}

// TestAnswerConn: an answer from the upstream client leads back to the
// connection it is read from, which is how a generation writes its client
// before each read of the upstream's socket rather than before each event.
func TestAnswerConn(t *testing.T) {
	t.Parallel()
	mock := mockllm.New(mockllm.Config{Tokens: 20, Delay: time.Millisecond})
	url, err := mock.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mock.Close() })
	up, err := New(url, testConfig(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI(url + "/v1/chat/completions")
	req.Header.SetMethod("POST")
	req.SetBodyString(`{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Tell me a joke"}]}`)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	if err := up.Do(req, resp, true); err != nil {
		t.Fatal(err)
	}
	c := ConnOf(resp)
	if c == nil {
		t.Fatalf("the answer's LocalAddr is %T; want the upstream connection's own", resp.LocalAddr())
	}
	reads := 0
	c.SetBeforeRead(func() { reads++ })
	io.Copy(io.Discard, resp.BodyStream()) //nolint:errcheck // counted below
	c.SetBeforeRead(nil)
	if reads == 0 {
		t.Fatal("reading the body did not go through the connection's beforeRead")
	}
}
