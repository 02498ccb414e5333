package redistest

import (
	"strings"
	"testing"
	"time"
)

// TestStartCluster: the harness's cluster is ok on every node and each
// primary holds a share of the slots.
func TestStartCluster(t *testing.T) {
	c := StartCluster(t, 3)
	for _, s := range c.Nodes {
		nodes, err := command(s.Addr, 2*time.Second, "CLUSTER", "NODES")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(nodes, "master"); got != 3 {
			t.Fatalf("%s: CLUSTER NODES lists %d primaries; want 3\n%s", s.Addr, got, nodes)
		}
	}
	if !strings.Contains(c.URL(), "?addr=") {
		t.Fatalf("URL %q: want the other seeds as ?addr=", c.URL())
	}
}
