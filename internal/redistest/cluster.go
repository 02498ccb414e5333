package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Cluster is a Redis Cluster of the test's own: Primaries redis-server
// processes in cluster mode on free loopback ports, without persistence,
// holding the 16384 slots between them (no replicas). Every process is
// killed when the test ends.
type Cluster struct {
	Nodes []*Server // the primaries, in the order redis-cli was given them
}

// StartCluster starts a cluster of n primaries (at least 3, as redis-cli
// --cluster create requires) and returns once every node reports
// cluster_state:ok and knows the others. Without redis-server or
// redis-cli the test skips, unless CI is set: then it fails, since CI
// must run it.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			msg := fmt.Sprintf("%s is not installed: the Redis Cluster tests start a cluster of their own (apt-get install redis-server redis-tools)", bin)
			if os.Getenv("CI") != "" {
				tb.Fatal(msg)
			}
			tb.Skip(msg)
		}
	}
	c := &Cluster{}
	for range n {
		port := freePort(tb, true)
		dir := tb.TempDir()
		c.Nodes = append(c.Nodes, startServer(tb, port,
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "2000"))
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range c.Nodes {
		for {
			info, err := command(s.Addr, time.Second, "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n)) &&
				strings.Contains(info, "cluster_slots_ok:16384") {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("cluster node %s not ok within 20s: %v\n%s", s.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

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

// command sends one command (inline, arguments without spaces) to addr
// and returns its reply: a status, an error or a bulk string.
func command(addr string, timeout time.Duration, args ...string) (string, error) {
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
