package redis

import (
	"github.com/ssegate/ssegate/cache"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/redistest"
)

// TestRedisScriptsLoaded: the store loads its scripts as it connects, so
// that a burst of first calls (claims as a replica starts) are EVALSHAs
// that find them, not NOSCRIPT answers sent again as EVALs with the
// whole script each.
func TestRedisScriptsLoaded(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "load", func(c *Config) { c.Lease = time.Minute })
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			b, err := r.Begin(cache.Scope{Tenant: "t", Key: strconv.Itoa(i)}, "fp")
			if err != nil || b.Flight == nil {
				t.Errorf("Begin %d: %+v, %v; want a miss", i, b, err)
				return
			}
			b.Flight.Fail(cache.StateFailedRetryable, "test", nil)
		})
	}
	wg.Wait()
	stats, err := redistest.Command(srv.Addr, 5*time.Second, "INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(stats, "\n") {
		if strings.HasPrefix(l, "cmdstat_eval:") {
			t.Errorf("scripts sent whole: %s; want none (loaded as the store connected)", strings.TrimSpace(l))
		}
	}
	if !strings.Contains(stats, "cmdstat_script|load:") && !strings.Contains(stats, "cmdstat_script:") {
		t.Errorf("no SCRIPT LOAD in %q", stats)
	}
}
