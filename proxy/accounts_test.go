package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/redis"
	"github.com/ssegate/ssegate/internal/mcpmock"
	"github.com/ssegate/ssegate/internal/redistest"
)

// extraCredentials are the places a client can put a credential the
// upstream ignores beside the one it bills (Authorization here), each a
// way to make every request a tenant of its own: set puts value v there.
var extraCredentials = []struct {
	name string
	set  func(r *req, v string)
}{
	{"x-goog-api-key", func(r *req, v string) { r.header = map[string]string{"x-goog-api-key": v} }},
	{"?key=", func(r *req, v string) { r.path = "/v1/chat/completions?key=" + v }},
	{"api-key", func(r *req, v string) { r.header = map[string]string{"api-key": v} }},
	{"x-api-key", func(r *req, v string) { r.header = map[string]string{"x-api-key": v} }},
	{"-tenant-header", func(r *req, v string) { r.header = map[string]string{"x-org": v} }},
}

// accountsStores are the stores the attacks run against: the memory
// store with cc, and a Redis store on the test's Redis with the same
// bounds.
func accountsStores(t *testing.T, name string, pc *Config, cc cache.Config) {
	t.Helper()
	if name != "redis" {
		return
	}
	r, err := redis.New(redis.Config{URL: "redis://" + redistest.Shared(t), Prefix: redistest.Prefix(t),
		Limits: cc.Limits, MaxKeys: cc.MaxKeys})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	pc.Store = r
}

// billed is an upstream that bills Authorization alone: sk-attacker's and
// sk-victim's requests are answered, any other gets 401, and every other
// credential is ignored.
func billed(answer func(w http.ResponseWriter, r *http.Request)) func(int64, http.ResponseWriter, *http.Request) {
	return func(_ int64, w http.ResponseWriter, r *http.Request) {
		if a := r.Header.Get("Authorization"); a != "Bearer sk-attacker" && a != "Bearer sk-victim" {
			status(http.StatusUnauthorized)(0, w, r)
			return
		}
		answer(w, r)
	}
}

// TestKeysPerCredential: a client that adds a credential the upstream
// ignores, new for each request (in each place one can go), is still
// held to -max-keys-per-tenant by the credential the upstream bills: its
// new keys stop at the bound with 503 capacity_exceeded, and never fill
// -max-keys, so that another customer's new keys are served, one upstream
// call each. Before the bounds counted credentials, each such request was
// a tenant of its own: the attacker's keys ran on to -max-keys, and the
// victim's got 503. With the memory store and with Redis.
func TestKeysPerCredential(t *testing.T) {
	t.Parallel()
	const maxKeys, perTenant, tries = 40, 4, 40
	for _, store := range []string{"memory", "redis"} {
		for _, extra := range extraCredentials {
			t.Run(store+"/"+extra.name, func(t *testing.T) {
				t.Parallel()
				up := newFaultServer(t, billed(func(w http.ResponseWriter, _ *http.Request) { okStream(w) }))
				cc := cache.Config{MaxKeys: maxKeys, Limits: cache.Limits{MaxKeysPerTenant: perTenant}}
				pc := Config{Retry: RetryConfig{BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, AttemptTimeout: 5 * time.Second},
					HeadTimeout: 5 * time.Second, TenantHeaders: []string{"x-org"}}
				accountsStores(t, store, &pc, cc)
				e := newEnvUpstream(t, up.url, nil, pc, cc)
				served, refused := 0, 0
				for i := range tries {
					r := req{key: newKey("attacker"), auth: "Bearer sk-attacker"}
					extra.set(&r, fmt.Sprintf("minted-%s-%d", store, i))
					got := e.fetch(r)
					switch {
					case clean(got):
						served++
					case got.status == http.StatusServiceUnavailable && got.errType == "capacity_exceeded":
						refused++
					default:
						t.Fatalf("attacker's key #%d: got %d %q; want a clean stream or 503 capacity_exceeded", i, got.status, got.raw)
					}
				}
				if served != perTenant || refused != tries-perTenant {
					t.Errorf("attacker varying %s: %d keys served, %d refused; want %d served (-max-keys-per-tenant), %d refused",
						extra.name, served, refused, perTenant, tries-perTenant)
				}
				for i := range perTenant {
					calls := up.calls.Load()
					v := req{key: newKey("victim"), auth: "Bearer sk-victim"}
					if r := e.fetch(v); !clean(r) || r.replayed {
						t.Fatalf("victim's new key #%d after the attack: got %d %q; want a clean stream of its own", i, r.status, r.raw)
					}
					if r := e.fetch(v); !clean(r) || !r.replayed {
						t.Fatalf("victim's key #%d again: got %d, replayed %v; want its replay", i, r.status, r.replayed)
					}
					wantCount(t, "upstream calls of the victim's key and its repeat", up.calls.Load()-calls, 1)
				}
			})
		}
	}
}

// TestLiveBytesPerCredential: a client that adds a credential the
// upstream ignores, new for each stream (in each place one can go), is
// held to its billed credential's share of -max-live-bytes: its new
// streams are refused once that credential is past its share, so that a
// victim's stream within its own share runs to its clean end, one
// upstream call, and its repeat is a replay. Before, each stream was a
// tenant within its share: together they filled -max-live-bytes, and the
// victim's stream was cut store_full, its key left free for a second
// paid generation. With the memory store and with Redis.
func TestLiveBytesPerCredential(t *testing.T) {
	t.Parallel()
	const chunk = 1000
	content := strings.Repeat("x", chunk)
	event := func(w http.ResponseWriter, finish string) {
		fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":%s}]}\n\n", content, finish)
		w.(http.Flusher).Flush()
	}
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	answer := billed(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		if r.Header.Get("Authorization") == "Bearer sk-attacker" {
			for range 8 { // then a long pause
				event(w, "null")
			}
			select {
			case <-hold:
			case <-r.Context().Done():
			}
			return
		}
		for range 12 {
			event(w, "null")
		}
		event(w, `"stop"`)
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	const most = 7 // 8 KB streams: 56 KB of the 64 KB
	for _, store := range []string{"memory", "redis"} {
		for _, extra := range extraCredentials {
			t.Run(store+"/"+extra.name, func(t *testing.T) {
				t.Parallel()
				up := newFaultServer(t, answer)
				cc := cache.Config{Limits: cache.Limits{MaxLiveBytes: 64 << 10, MaxLiveBytesPerTenant: 16 << 10}}
				pc := Config{Retry: RetryConfig{BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, AttemptTimeout: 30 * time.Second},
					HeadTimeout: 5 * time.Second, TenantHeaders: []string{"x-org"}}
				accountsStores(t, store, &pc, cc)
				e := newEnvUpstream(t, up.url, nil, pc, cc)
				opened := 0
				var refused result
				for i := range most {
					a := req{key: newKey("attacker"), auth: "Bearer sk-attacker"}
					extra.set(&a, fmt.Sprintf("minted-%s-%d", store, i))
					calls := up.calls.Load()
					resp := e.do(a)
					if resp.StatusCode != http.StatusOK {
						refused = parseResultBody(t, resp)
						wantCount(t, "upstream calls of the attacker's refused stream", up.calls.Load()-calls, 0)
						break
					}
					t.Cleanup(func() { resp.Body.Close() })
					opened++
					br := bufio.NewReader(resp.Body)
					for n := 0; n < 8; {
						line, err := br.ReadString('\n')
						if err != nil {
							t.Fatalf("attacker's stream #%d: %v after %d events", i, err, n)
						}
						if strings.HasPrefix(line, "data: ") {
							n++
						}
					}
				}
				if refused.status != http.StatusServiceUnavailable || refused.errType != "capacity_exceeded" {
					t.Errorf("attacker varying %s opened %d streams of 8 KB, none refused; want its new ones refused past its 16 KB share", extra.name, opened)
				}
				calls := up.calls.Load()
				v := req{key: newKey("victim"), auth: "Bearer sk-victim"}
				if r := e.fetch(v); !clean(r) || r.aborted {
					t.Errorf("victim's stream within its share: got %d, aborted %v, %d events; want its clean end", r.status, r.aborted, len(r.events))
				}
				if r := e.fetch(v); !clean(r) || !r.replayed {
					t.Errorf("victim's stream again: got %d, replayed %v; want its stored replay", r.status, r.replayed)
				}
				wantCount(t, "upstream calls of the victim's stream and its repeat", up.calls.Load()-calls, 1)
			})
		}
	}
}

// TestToolHoldsPerCredential: tool calls held commit_unknown (each holds
// its key for -mcp-unknown-ttl) count against the credential the
// upstream bills: a client that varies a credential beside it holds at
// most -max-keys-per-tenant of them, its next calls are refused with 503
// capacity_exceeded and never sent, and another customer's call is sent.
// With the memory store and with Redis.
func TestToolHoldsPerCredential(t *testing.T) {
	t.Parallel()
	const perTenant, tries = 3, 8
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int64
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Ssegate-Outcome", "unknown")
				fmt.Fprintf(w, `{"jsonrpc":"2.0","id":1,"error":{"code":%d,"message":"the outcome is unknown"}}`, UnknownCode)
			}))
			t.Cleanup(up.Close)
			cc := cache.Config{MaxKeys: 40, Limits: cache.Limits{MaxKeysPerTenant: perTenant}}
			pc := Config{MCPPaths: []string{mcpmock.Path}}
			accountsStores(t, store, &pc, cc)
			e := &mcpEnv{env: newEnvUpstream(t, up.URL, nil, pc, cc)}
			held, refused := 0, 0
			for i := range tries {
				key := newKey("tool-attacker")
				resp := e.post(callBody(i+1, "write", map[string]any{"target": key}, nil),
					"Idempotency-Key", key, "Authorization", "Bearer sk-attacker", "x-goog-api-key", fmt.Sprintf("minted-%d", i))
				raw, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(raw), "capacity_exceeded") {
					refused++
					continue
				}
				wantUnknown(t, readRPC(t, resp, raw), i+1)
				held++
			}
			if held != perTenant || refused != tries-perTenant {
				t.Errorf("attacker varying x-goog-api-key: %d calls held commit_unknown, %d refused; want %d held (-max-keys-per-tenant), %d refused",
					held, refused, perTenant, tries-perTenant)
			}
			wantCount(t, "calls to the server", calls.Load(), int64(held))
			key := newKey("tool-victim")
			wantUnknown(t, e.call(callBody(1, "write", map[string]any{"target": key}, nil), "Idempotency-Key", key, "Authorization", "Bearer sk-victim"), 1)
			wantCount(t, "calls to the server with the victim's", calls.Load(), int64(held)+1)
		})
	}
}

// TestAccountHeader: where one upstream key serves many customers and an
// authenticating layer in front names each in a header (-account-header),
// every customer has bounds of its own: one organization that fills
// -max-keys-per-tenant does not refuse another's new keys under the same
// API key, and varying a credential the upstream ignores escapes neither.
// A request without the header is counted against its credential, as
// without the flag. With the memory store and with Redis.
func TestAccountHeader(t *testing.T) {
	t.Parallel()
	const perTenant = 3
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			up := newFaultServer(t, billed(func(w http.ResponseWriter, _ *http.Request) { okStream(w) }))
			cc := cache.Config{MaxKeys: 100, Limits: cache.Limits{MaxKeysPerTenant: perTenant}}
			pc := Config{Retry: RetryConfig{BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, AttemptTimeout: 5 * time.Second},
				HeadTimeout: 5 * time.Second, AccountHeader: "X-Org"}
			accountsStores(t, store, &pc, cc)
			e := newEnvUpstream(t, up.url, nil, pc, cc)
			fetch := func(org, minted string) result {
				r := req{key: newKey("org"), auth: "Bearer sk-attacker", header: map[string]string{}}
				if org != "" {
					r.header["x-org"] = org
				}
				if minted != "" {
					r.header["x-goog-api-key"] = minted
				}
				return e.fetch(r)
			}
			refusedAt := func(org string, vary bool) int {
				for i := range perTenant + 2 {
					minted := ""
					if vary {
						minted = fmt.Sprintf("minted-%s-%s-%d", store, org, i)
					}
					got := fetch(org, minted)
					switch {
					case clean(got):
					case got.status == http.StatusServiceUnavailable && got.errType == "capacity_exceeded":
						return i
					default:
						t.Fatalf("org %q key #%d: got %d %q; want a clean stream or 503 capacity_exceeded", org, i, got.status, got.raw)
					}
				}
				return -1
			}
			if n := refusedAt("org-a", true); n != perTenant {
				t.Errorf("org-a varying x-goog-api-key: first refused at key #%d; want #%d (its own -max-keys-per-tenant)", n, perTenant)
			}
			if n := refusedAt("org-b", false); n != perTenant {
				t.Errorf("org-b under the same API key after org-a filled its bound: first refused at key #%d; want #%d", n, perTenant)
			}
			if n := refusedAt("", false); n != perTenant {
				t.Errorf("no -account-header value: first refused at key #%d; want #%d (the credential's own account)", n, perTenant)
			}
		})
	}
}
