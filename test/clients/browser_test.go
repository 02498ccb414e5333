package clients_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/poll"
)

// chromiumPath is where Debian's chromium package (installed by .ci/run)
// puts the browser.
const chromiumPath = "/usr/bin/chromium"

// The slow upstream's stream: long enough that the browser's automatic
// reconnection (about 3 s in Chromium) lands while the generation is
// still live, so the resume follows the live journal rather than only
// reading the stored result.
const (
	browserEvents   = 120
	browserInterval = 40 * time.Millisecond
	severAfter      = 15
)

// pageHTML opens an EventSource on /streams/{key} (same origin: the page
// itself came through ssegate) and records in window.st what the browser
// delivered. It closes the EventSource at [DONE]: the server then ends
// the stream, and the browser would otherwise reconnect and replay an
// empty tail forever.
const pageHTML = `<!doctype html>
<html><head><meta charset="utf-8"><title>ssegate EventSource</title></head>
<body><script>
window.st = {ids: [], data: [], opens: 0, errors: 0, done: false, aborted: "", state: -1};
const q = new URLSearchParams(location.search);
const es = new EventSource(q.get("src") || "/streams/" + encodeURIComponent(q.get("key")));
es.onopen = () => { st.opens++; };
es.onmessage = (e) => {
  st.ids.push(e.lastEventId);
  st.data.push(e.data);
  if (e.data === "[DONE]") { st.done = true; es.close(); }
};
es.addEventListener("error", (e) => {
  if (e.data !== undefined) { st.aborted = e.data; es.close(); return; } // ssegate's event: error
  st.errors++;                                                           // a network error
  st.state = es.readyState;
});
</script></body></html>`

// pageState mirrors window.st.
type pageState struct {
	IDs     []string `json:"ids"`
	Data    []string `json:"data"`
	Opens   int      `json:"opens"`
	Errors  int      `json:"errors"`
	Done    bool     `json:"done"`
	Aborted string   `json:"aborted"`
	State   int      `json:"state"`
}

// slowChatUpstream is a real HTTP upstream that serves the test page and a
// slow OpenAI chat-completions stream, counting the generations.
func slowChatUpstream(t *testing.T, calls *atomic.Int64) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /page.html", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprint(w, pageHTML)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		fl := w.(http.Flusher)
		chunk := func(delta, finish string) string {
			return fmt.Sprintf(`{"id":"chatcmpl-e2e","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`, delta, finish)
		}
		send := func(data string) bool {
			if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
				return false
			}
			fl.Flush()
			return true
		}
		if !send(chunk(`{"role":"assistant","content":""}`, "null")) {
			return
		}
		for i := 1; i <= browserEvents; i++ {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(browserInterval):
			}
			if !send(chunk(`{"content":"tok`+strconv.Itoa(i)+` "}`, "null")) {
				return
			}
		}
		send(chunk(`{}`, `"stop"`))
		send("[DONE]")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestBrowserEventSourceReconnect: a headless Chromium reads a live stream
// from GET /streams/{key} through a connection the test cuts mid-stream;
// the browser's own reconnection (with Last-Event-ID) gets the rest, and
// the page sees every event exactly once, in order. One upstream call.
// Twice: the anonymous tenant's stream by its path, and a credentialed
// tenant's by the signed Ssegate-Resume-Url of its POST (an EventSource
// cannot send the credential; the URL needs none).
func TestBrowserEventSourceReconnect(t *testing.T) {
	t.Run("anonymous", func(t *testing.T) { browserReconnect(t, "") })
	t.Run("signed resume URL", func(t *testing.T) { browserReconnect(t, "Bearer sk-browser-tenant") })
}

func browserReconnect(t *testing.T, auth string) {
	if _, err := os.Stat(chromiumPath); err != nil {
		if isCI() {
			t.Fatalf("%s: %v; CI must install Debian's chromium (see .ci/run)", chromiumPath, err)
		}
		t.Skipf("%s is absent (apt-get install chromium); the browser test needs it", chromiumPath)
	}
	var calls atomic.Int64
	up := slowChatUpstream(t, &calls)
	g := startGate(t, "-upstream", up.URL)
	fw := newForwarder(t, g.Addr)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The browser first, so that its start-up time does not eat into the
	// stream.
	browserOut := &gatetest.LogBuffer{}
	userData, err := os.MkdirTemp("", "ssegate-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromiumPath),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true), // CI runs as root
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), // containers have a tiny /dev/shm
		chromedp.UserDataDir(userData),
		chromedp.CombinedOutput(browserOut),
	)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc() // waits for the browser process to exit
		// Chromium's helpers may still write into the profile for a moment;
		// a leftover temp dir is not worth failing the test for.
		os.RemoveAll(userData)
		if t.Failed() {
			t.Logf("chromium output:\n%s", browserOut.String())
		}
	})
	t0 := time.Now()
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	t.Logf("chromium started in %v", time.Since(t0).Round(time.Millisecond))

	// Start the generation with a keyed POST straight to ssegate (not via
	// the forwarder, so the cut does not touch it), read to its end.
	key := fmt.Sprintf("browser-%d", time.Now().UnixNano())
	type postResult struct {
		events    []event
		err       error
		resumeURL string
	}
	started := make(chan struct{})
	resumeURL := make(chan string, 1)
	postDone := make(chan postResult, 1)
	go func() {
		var res postResult
		defer func() { postDone <- res }()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"count"}]}`))
		if err != nil {
			res.err = err
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			res.err = err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			res.err = fmt.Errorf("POST: got status %d; want 200", resp.StatusCode)
			return
		}
		res.resumeURL = resp.Header.Get("Ssegate-Resume-Url")
		resumeURL <- res.resumeURL
		once := false
		res.events, res.err = readEvents(resp.Body, func(event) {
			if !once {
				once = true
				close(started)
			}
		})
	}()
	select {
	case <-started:
	case res := <-postDone:
		t.Fatalf("POST ended before its first event: %v", res.err)
	case <-time.After(10 * time.Second):
		t.Fatal("POST: no first event within 10s")
	}

	pageURL := "http://" + fw.addr() + "/page.html?key=" + key
	if auth != "" {
		u := <-resumeURL
		if u == "" {
			t.Fatal("POST: no Ssegate-Resume-Url")
		}
		// The URL is relative to the request it answered, as a browser
		// resolves it: here the POST's, made through the forwarder's
		// address so that the page opens it on its own origin.
		ref, err := url.Parse(u)
		if err != nil {
			t.Fatalf("POST: Ssegate-Resume-Url %q: %v", u, err)
		}
		post := &url.URL{Scheme: "http", Host: fw.addr(), Path: "/v1/chat/completions"}
		pageURL += "&src=" + url.QueryEscape(post.ResolveReference(ref).String())
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(pageURL)); err != nil {
		t.Fatalf("navigate to %s: %v", pageURL, err)
	}
	state := func() pageState {
		t.Helper()
		st, err := chromedp.Run(bctx, chromedp.Evaluate[pageState](`window.st`))
		if err != nil {
			t.Fatalf("reading window.st: %v", err)
		}
		return st
	}
	// await waits, bounded, until cond holds for the page's state.
	await := func(what string, limit time.Duration, cond func(pageState) bool) pageState {
		t.Helper()
		var st pageState
		if !poll.Until(limit, func() bool { st = state(); return cond(st) }) {
			t.Fatalf("page: %s: not within %v; got ids %d, opens %d, errors %d, readyState %d, aborted %q",
				what, limit, len(st.IDs), st.Opens, st.Errors, st.State, st.Aborted)
		}
		return st
	}

	before := await("receive "+strconv.Itoa(severAfter)+" events", 10*time.Second, func(st pageState) bool {
		return len(st.IDs) >= severAfter || st.Done || st.Aborted != ""
	})
	if before.Done || before.Aborted != "" {
		t.Fatalf("page finished before the cut (done %v, aborted %q); the stream is too short to test a reconnection", before.Done, before.Aborted)
	}
	cutAt := time.Now()
	cut := fw.sever()
	atCut := len(state().IDs)
	t.Logf("cut %d connection(s) after the page had %d events", cut, atCut)
	if cut < 1 {
		t.Fatalf("forwarder cut: got %d connections; want at least 1 (the EventSource's)", cut)
	}

	final := await("see [DONE]", 20*time.Second, func(st pageState) bool { return st.Done || st.Aborted != "" })
	t.Logf("page saw [DONE] %v after the cut: %d events, %d opens, %d network errors",
		time.Since(cutAt).Round(time.Millisecond), len(final.IDs), final.Opens, final.Errors)
	if final.Aborted != "" {
		t.Fatalf("page got event: error %s; want the stream to the end", final.Aborted)
	}

	var post postResult
	select {
	case post = <-postDone:
	case <-time.After(20 * time.Second):
		t.Fatal("POST: not ended within 20s")
	}
	if post.err != nil {
		t.Fatalf("POST read: %v", post.err)
	}

	// The ids: one generation, sequence 1..N, no gap, no duplicate, and
	// the same events (ids and data) the POST client got.
	wantN := browserEvents + 3 // role chunk, content, finish chunk, [DONE]
	if len(final.IDs) != wantN {
		t.Errorf("page events: got %d; want %d", len(final.IDs), wantN)
	}
	gen := ""
	for i, id := range final.IDs {
		g, seq, ok := strings.Cut(id, "-")
		if !ok {
			t.Fatalf("page event %d: got id %q; want <generation>-<sequence>", i, id)
		}
		if gen == "" {
			gen = g
		}
		if g != gen || seq != strconv.Itoa(i+1) {
			t.Fatalf("page event %d: got id %q; want %s-%d (ids %v)", i, id, gen, i+1, final.IDs)
		}
	}
	if len(post.events) != len(final.IDs) {
		t.Fatalf("POST events: got %d; page got %d", len(post.events), len(final.IDs))
	}
	for i, ev := range post.events {
		if ev.id != final.IDs[i] || ev.data != final.Data[i] {
			t.Fatalf("event %d: page got id %q data %q; want the POST's id %q data %q", i, final.IDs[i], final.Data[i], ev.id, ev.data)
		}
	}
	if final.Opens < 2 || final.Errors < 1 {
		t.Errorf("reconnection: got %d opens, %d network errors; want at least 2 opens and 1 error", final.Opens, final.Errors)
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("upstream generations: got %d; want 1", got)
	}
}
