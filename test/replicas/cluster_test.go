package replicas_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/mockllm"
)

// TestClusterKeySpread: 300 idempotency keys made through one replica on
// a 3-primary cluster land on every primary (each key's records share the
// slot of its hash tag, and the hashes spread over the slots), and each
// is committed once and replays from another replica.
func TestClusterKeySpread(t *testing.T) {
	const n = 300
	e := newClusterEnv(t, mockllm.Config{Tokens: 3, Delay: time.Millisecond})
	a, b := e.start("A"), e.start("B")
	keys := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for k := range keys {
				if s := post(t, a, k).readAll(); s.status != 200 || !s.clean() {
					t.Errorf("key %s: status %d, clean %v; want 200, clean", k, s.status, s.clean())
				}
			}
		})
	}
	for i := range n {
		keys <- fmt.Sprintf("spread-%d", i)
	}
	close(keys)
	wg.Wait()
	if t.Failed() {
		return
	}
	ctx := context.Background()
	var spread []string
	total := 0
	for i, node := range e.nodes {
		size, err := node.Do(ctx, node.B().Dbsize().Build()).AsInt64()
		if err != nil {
			t.Fatalf("DBSIZE: %v", err)
		}
		st, err := node.Do(ctx, node.B().Keys().Pattern("ssg:{*}:st").Build()).AsStrSlice()
		if err != nil {
			t.Fatalf("KEYS: %v", err)
		}
		spread = append(spread, fmt.Sprintf("primary %d: %d idempotency keys (%d Redis keys)", i, len(st), size))
		if len(st) == 0 {
			t.Errorf("primary %d holds no idempotency key's records", i)
		}
		total += len(st)
	}
	t.Logf("%d idempotency keys over 3 primaries: %s", n, strings.Join(spread, ", "))
	if total != n {
		t.Fatalf("records of %d idempotency keys in the cluster; want %d", total, n)
	}
	if got := e.atMostOneCommit(); got != n {
		t.Fatalf("commits: got %d; want %d", got, n)
	}
	for _, k := range []string{"spread-0", "spread-150", "spread-299"} {
		if s := post(t, b, k).readAll(); s.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("key %s on B: Idempotent-Replayed %q; want a replay", k, s.header.Get("Idempotent-Replayed"))
		}
	}
	if calls := e.mock.Calls(); calls != n {
		t.Fatalf("upstream calls: got %d; want %d", calls, n)
	}
}
