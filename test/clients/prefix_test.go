package clients_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	openaiopt "github.com/openai/openai-go/v3/option"

	"github.com/ssegate/ssegate/client"
	"github.com/ssegate/ssegate/internal/mockllm"
)

// prefixGateway is a gateway that serves ssegate under /llm/: it strips
// the prefix and relays to target (httputil), and answers 404 to every
// path outside it. It records the method and path (as sent) of every
// request it gets.
type prefixGateway struct {
	*httptest.Server
	mu   sync.Mutex // guards seen
	seen []string
}

func newPrefixGateway(t *testing.T, target string) *prefixGateway {
	t.Helper()
	u, err := url.Parse("http://" + target)
	if err != nil {
		t.Fatal(err)
	}
	g := &prefixGateway{}
	strip := http.StripPrefix("/llm", httputil.NewSingleHostReverseProxy(u))
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.seen = append(g.seen, r.Method+" "+r.URL.RequestURI())
		g.mu.Unlock()
		strip.ServeHTTP(w, r)
	}))
	t.Cleanup(g.Close)
	return g
}

func (g *prefixGateway) requests() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.seen...)
}

// TestPrefixResume: ssegate mounted under /llm/ behind a path-prefix
// gateway, an openai-go client with base URL {gateway}/llm/v1/ through
// client.Transport, and the connection between gateway and ssegate
// severed mid-stream. The Transport reconnects through the prefix, to
// /llm/streams/{key}, by the Ssegate-Resume-Url the answer carried
// (without its token: the request's credential is the client's own), and
// the caller reads the stored stream whole from one upstream call. The
// resume URL itself, resolved against the request's URL as a browser
// resolves it, opens the stream through the gateway too.
func TestPrefixResume(t *testing.T) {
	mock, upstream := startMock(t, mockllm.Config{Tokens: 30, Delay: 15 * time.Millisecond})
	g := startGate(t, "-upstream", upstream)
	f := newForwarder(t, g.Addr)
	gw := newPrefixGateway(t, f.addr())
	c := openAIClient(gw.URL+"/llm", &client.Transport{MinBackoff: 10 * time.Millisecond}, openaiopt.WithMaxRetries(0))
	key := fmt.Sprintf("prefix/resume?%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(client.WithIdempotencyKey(context.Background(), key), 20*time.Second)
	defer cancel()
	var resp *http.Response
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini", Messages: joke},
		openaiopt.WithResponseInto(&resp))
	defer stream.Close()
	var got []string
	severed := 0
	for stream.Next() {
		got = append(got, stream.Current().RawJSON())
		if len(got) == 5 {
			severed += f.sever()
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v (gateway saw %q)", err, gw.requests())
	}
	if severed < 1 {
		t.Errorf("severed: got %d connections; want at least 1", severed)
	}
	wantStoredOnce(t, got, mock, g.URL, url.PathEscape(key), "Authorization", "Bearer sk-e2e")
	resumes := 0
	for _, r := range gw.requests() {
		if !strings.HasPrefix(r, "POST /llm/v1/chat/completions") && !strings.HasPrefix(r, "GET /llm/streams/"+url.PathEscape(key)) {
			t.Errorf("gateway got %q; want the POST and GETs of /llm/streams/{key}", r)
		}
		if strings.Contains(r, "token=") {
			t.Errorf("gateway got %q; want the reconnection without the resume token", r)
		}
		if strings.HasPrefix(r, "GET ") {
			resumes++
		}
	}
	if resumes < 1 {
		t.Errorf("reconnections through the gateway: got %d; want at least 1", resumes)
	}

	// The resume URL, resolved against the URL of the request it answered.
	if resp == nil {
		t.Fatal("no answer recorded")
	}
	ref, err := url.Parse(resp.Header.Get("Ssegate-Resume-Url"))
	if err != nil || ref.Query().Get("token") == "" {
		t.Fatalf("Ssegate-Resume-Url %q: want a URL with a token", resp.Header.Get("Ssegate-Resume-Url"))
	}
	u := resp.Request.URL.ResolveReference(ref)
	if !strings.HasPrefix(u.Path, "/llm/streams/") {
		t.Fatalf("resume URL resolved against %s: got %s; want under /llm/streams/", resp.Request.URL, u)
	}
	sr, err := http.Get(u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer sr.Body.Close()
	evs, err := readEvents(sr.Body, nil)
	if err != nil || sr.StatusCode != 200 || len(evs) == 0 {
		t.Fatalf("GET %s: %s, %d events, %v; want 200 and the stream", u, sr.Status, len(evs), err)
	}
	if n := mock.Calls(); n != 1 {
		t.Errorf("upstream calls: got %d; want 1", n)
	}
}
