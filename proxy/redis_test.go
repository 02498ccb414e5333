package proxy

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/mockllm"
	"github.com/ssegate/ssegate/internal/redistest"
)

// redisEnv is ssegate with a Redis store on addr in front of the mock,
// logging to logs.
func redisEnv(t *testing.T, addr string, logs *gatetest.LogBuffer, opts ...envOption) (*env, *cache.Redis) {
	t.Helper()
	store, err := cache.NewRedis(cache.RedisConfig{URL: "redis://" + addr, Prefix: redistest.Prefix(t),
		Lease: 400 * time.Millisecond, Timeout: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	e := newEnv(t, append([]envOption{func(pc *Config, _ *cache.Config, _ *mockllm.Config) {
		pc.Store = store
		pc.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}}, opts...)...)
	return e, store
}

// TestStoreErrorText: when Redis refuses (an ACL that forbids the claim's
// script) or cannot be reached, the 503 store_unavailable answer carries
// the cause's fixed message only, never the Redis client's error (the
// server's address, its refusal's words); the log has that error, with
// the key and the tenant's hash.
func TestStoreErrorText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		fault func(*redistest.Server) error
		want  string // in the log, not in the answer
	}{
		{"acl", func(s *redistest.Server) error {
			_, err := redistest.Command(s.Addr, time.Second, "ACL", "SETUSER", "default", "-evalsha", "-eval", "-hmget")
			return err
		}, "NOPERM"},
		{"down", func(s *redistest.Server) error { s.Stop(); return nil }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			var logs gatetest.LogBuffer
			e, _ := redisEnv(t, srv.Addr, &logs)
			if got := e.fetch(req{key: newKey("before")}); !clean(got) {
				t.Fatalf("before the fault: got %d; want a whole stream", got.status)
			}
			if err := c.fault(srv); err != nil {
				t.Fatal(err)
			}
			want := c.want
			if want == "" {
				want = srv.Addr
			}
			key := newKey("refused")
			for _, r := range []req{
				{key: key},
				{method: "GET", path: "/streams/" + key},
			} {
				got := e.fetch(r)
				if got.status != 503 || got.errType != "store_unavailable" {
					t.Fatalf("%s %s: got %d %q; want 503 store_unavailable", r.method, r.path, got.status, got.errType)
				}
				body := string(got.raw)
				for _, bad := range []string{srv.Addr, "127.0.0.1", "NOPERM", "redis", "dial", "refused"} {
					if strings.Contains(strings.ToLower(body), strings.ToLower(bad)) {
						t.Errorf("%s %s: the answer %s holds %q", r.method, r.path, body, bad)
					}
				}
			}
			waitFor(t, func() bool { return strings.Contains(logs.String(), want) })
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, "store_unavailable") && strings.Contains(line, want) {
					if !strings.Contains(line, "key="+key) || !strings.Contains(line, "tenant="+e.tenantOf("")) {
						t.Errorf("the log line %q lacks the key or the tenant", line)
					}
					return
				}
			}
			t.Errorf("no log line of the refusal names %q:\n%s", want, logs.String())
		})
	}
}
