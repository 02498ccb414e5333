package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/poll"
)

// Cluster is a Redis Cluster of the test's own: redis-server processes
// (valkey-server with SSEGATE_REDIS_SERVER=valkey) in cluster mode on free loopback ports, without persistence, the primaries
// holding the 16384 slots between them, each with as many replicas as
// StartCluster was asked for. Every process is killed when the test ends.
type Cluster struct {
	Nodes    []*Server // the primaries, in the order redis-cli was given them
	Replicas []*Server // the replicas, in the order redis-cli was given them

	replicaOf map[*Server][]*Server // a primary's replicas, as created
}

// StartCluster starts a cluster of n primaries (at least 3, as redis-cli
// --cluster create requires), with replicas[0] replicas each when given
// (--cluster-replicas; none by default), and returns once every node
// reports cluster_state:ok and knows the others, and every replica's link
// to its primary is up. Without redis-server or redis-cli (valkey-server
// or valkey-cli) the test skips, unless CI is set: then it fails, since
// CI must run it.
func StartCluster(tb testing.TB, n int, replicas ...int) *Cluster {
	tb.Helper()
	r := 0
	if len(replicas) > 0 {
		r = replicas[0]
	}
	k := ServerKind(tb)
	for _, bin := range []string{k.Server, k.CLI} {
		if _, err := exec.LookPath(bin); err != nil {
			msg := fmt.Sprintf("%s is not installed: the Redis Cluster tests start a cluster of their own (%s and %s)", bin, k.Server, k.CLI)
			if os.Getenv("CI") != "" {
				tb.Fatal(msg)
			}
			tb.Skip(msg)
		}
	}
	c := &Cluster{replicaOf: map[*Server][]*Server{}}
	var all []*Server
	for range n * (1 + r) {
		port := freePort(tb, true)
		dir := tb.TempDir()
		all = append(all, startServer(tb, k, port,
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "2000"))
	}
	args := []string{"--cluster", "create"}
	for _, s := range all {
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(r), "--cluster-yes")
	if out, err := exec.Command(k.CLI, args...).CombinedOutput(); err != nil {
		tb.Fatalf("%s --cluster create: %v\n%s", k.CLI, err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	var info string
	var err error
	for _, s := range all {
		if !poll.Until(time.Until(deadline), func() bool {
			info, err = Command(s.Addr, time.Second, "CLUSTER", "INFO")
			return err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", len(all))) &&
				strings.Contains(info, "cluster_slots_ok:16384")
		}) {
			tb.Fatalf("cluster node %s not ok within 20s: %v\n%s", s.Addr, err, info)
		}
	}
	// Roles as the CLI assigned them: CLUSTER NODES lines are
	// "id ip:port@bus flags primary-id ...".
	// A replica shows as one once the configuration has spread.
	var nodes string
	if !poll.Until(time.Until(deadline), func() bool {
		nodes, err = Command(all[0].Addr, time.Second, "CLUSTER", "NODES")
		return err == nil && strings.Count(nodes, "slave") == n*r
	}) {
		tb.Fatalf("CLUSTER NODES: %d replicas within 20s; want %d: %v\n%s", strings.Count(nodes, "slave"), n*r, err, nodes)
	}
	byAddr, byID, primaryOf := map[string]*Server{}, map[string]*Server{}, map[*Server]string{}
	for _, s := range all {
		byAddr[s.Addr] = s
	}
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		s, ok := byAddr[addr]
		if !ok {
			tb.Fatalf("CLUSTER NODES names %s, not a node of the test", addr)
		}
		byID[f[0]] = s
		if strings.Contains(f[2], "slave") {
			primaryOf[s] = f[3]
		}
	}
	for _, s := range all {
		if id, ok := primaryOf[s]; ok {
			c.Replicas = append(c.Replicas, s)
			c.replicaOf[byID[id]] = append(c.replicaOf[byID[id]], s)
		} else {
			c.Nodes = append(c.Nodes, s)
		}
	}
	if len(c.Nodes) != n || len(c.Replicas) != n*r {
		tb.Fatalf("cluster has %d primaries and %d replicas; want %d and %d\n%s", len(c.Nodes), len(c.Replicas), n, n*r, nodes)
	}
	for _, s := range c.Replicas {
		if !poll.Until(time.Until(deadline), func() bool {
			info, err = Command(s.Addr, time.Second, "INFO", "replication")
			return err == nil && strings.Contains(info, "master_link_status:up")
		}) {
			tb.Fatalf("replica %s not in sync within 20s: %v\n%s", s.Addr, err, info)
		}
	}
	return c
}

// ReplicasOf returns the replicas the cluster was created with for
// primary p.
func (c *Cluster) ReplicasOf(p *Server) []*Server { return c.replicaOf[p] }

// Addrs returns the primaries' addresses.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, s := range c.Nodes {
		a = append(a, s.Addr)
	}
	return a
}

// URL returns a redis:// URL naming every primary as a seed (the first
// as host, the others with ?addr=), the form rueidis.ParseURL takes.
func (c *Cluster) URL() string {
	u := "redis://" + c.Nodes[0].Addr
	for i, s := range c.Nodes[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + s.Addr
	}
	return u
}

// Command sends one command (inline, arguments without spaces) to the
// node at addr and returns its reply: a status, an integer, an error or a
// bulk string.
func Command(addr string, timeout time.Duration, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(strings.Join(args, " ") + "\r\n")); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	switch line[0] {
	case '+', ':':
		return strings.TrimSpace(line[1:]), nil
	case '-':
		return "", fmt.Errorf("%s", strings.TrimSpace(line[1:]))
	case '$':
		var n int
		if _, err := fmt.Sscanf(line, "$%d", &n); err != nil || n < 0 {
			return "", fmt.Errorf("reply %q", strings.TrimSpace(line))
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return "", err
		}
		return string(b[:n]), nil
	}
	return "", fmt.Errorf("reply %q", strings.TrimSpace(line))
}
