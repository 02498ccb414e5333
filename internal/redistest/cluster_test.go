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
		nodes, err := Command(s.Addr, 2*time.Second, "CLUSTER", "NODES")
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

// TestStartClusterReplicas: with one replica each, the cluster has three
// primaries holding the slots and three replicas, each following one of
// them.
func TestStartClusterReplicas(t *testing.T) {
	c := StartCluster(t, 3, 1)
	if len(c.Nodes) != 3 || len(c.Replicas) != 3 {
		t.Fatalf("%d primaries, %d replicas; want 3 and 3", len(c.Nodes), len(c.Replicas))
	}
	for _, p := range c.Nodes {
		rs := c.ReplicasOf(p)
		if len(rs) != 1 {
			t.Fatalf("primary %s: %d replicas; want 1", p.Addr, len(rs))
		}
		info, err := Command(rs[0].Addr, 2*time.Second, "INFO", "replication")
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := strings.Cut(p.Addr, ":")
		if !strings.Contains(info, "role:slave") || !strings.Contains(info, "master_port:"+port) {
			t.Fatalf("replica %s of %s:\n%s", rs[0].Addr, p.Addr, info)
		}
	}
}
