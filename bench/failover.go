package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// Scenario shard's failover (-shard-failover): the step's server gets a
// replica, the drivers reach the server through a forwarder in the bench
// process, and in the middle of the window the primary is SIGKILLed, the
// replica promoted (REPLICAOF NO ONE) and the forwarder pointed at it, as
// a Sentinel or an operator would: the drivers' connections break and
// redial to the new primary at the same address. The drivers count what
// their streams got, and afterwards claim every key they saw committed
// again: one that is not a replay would be paid for twice by a retry.

// forwarder relays TCP connections to a target it can move.
type forwarder struct {
	ln net.Listener

	mu     sync.Mutex // guards target and conns
	target string
	conns  map[net.Conn]struct{}
}

// newForwarder listens on a free loopback port and relays to target.
func newForwarder(target string) (*forwarder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &forwarder{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go f.serve()
	return f, nil
}

func (f *forwarder) addr() string { return f.ln.Addr().String() }

// serve accepts connections until the listener closes.
func (f *forwarder) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		go f.relay(c)
	}
}

// relay copies c to and from a connection to the current target.
func (f *forwarder) relay(c net.Conn) {
	f.mu.Lock()
	target := f.target
	f.mu.Unlock()
	u, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	f.mu.Lock()
	f.conns[c], f.conns[u] = struct{}{}, struct{}{}
	f.mu.Unlock()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(u, c)
		u.Close()
		close(done)
	}()
	_, _ = io.Copy(c, u)
	c.Close()
	<-done
	f.mu.Lock()
	delete(f.conns, c)
	delete(f.conns, u)
	f.mu.Unlock()
}

// retarget points new connections at target and cuts the open ones.
func (f *forwarder) retarget(target string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.target = target
	for c := range f.conns {
		c.Close()
	}
}

// close stops the forwarder and cuts its connections.
func (f *forwarder) close() {
	f.ln.Close()
	f.retarget("")
}

// redisDo sends one command of several words to addr and returns the
// first line of its answer, an error for an error answer.
func redisDo(addr string, words ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(words))
	for _, w := range words {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(w), w)
	}
	if _, err := io.WriteString(c, b.String()); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSpace(line)
	if strings.HasPrefix(line, "-") {
		return "", errors.New(line)
	}
	return line, nil
}

// waitReplica waits until the replica at addr has its link to the
// primary up.
func waitReplica(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		lines, err := redisInfo(addr, "replication")
		if err == nil {
			for _, l := range lines {
				if strings.TrimSpace(l) == "master_link_status:up" {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the replica at %s is not in step after %v", addr, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// failover SIGKILLs primary, promotes replica and points fw at it.
func failover(primary, replica *server, fw *forwarder) error {
	if err := primary.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("kill the primary: %w", err)
	}
	if _, err := redisDo(replica.addr, "REPLICAOF", "NO", "ONE"); err != nil {
		return fmt.Errorf("promote the replica: %w", err)
	}
	fw.retarget(replica.addr)
	return nil
}
