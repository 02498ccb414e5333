// Package redistest gives tests a real redis-server: the one CI starts
// (SSEGATE_REDIS_ADDR), or one of their own on a free loopback port when
// the redis-server binary is installed. Without either, tests skip with a
// message saying how to run them; CI always has one, so they never skip
// there.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/poll"
)

// EnvAddr names the environment variable with the address of a Redis the
// tests may share (CI sets it to 127.0.0.1:16379).
const EnvAddr = "SSEGATE_REDIS_ADDR"

// Shared returns the address of a Redis the test may share with other
// tests and packages running at the same time: it must keep to keys of
// its own (a prefix of its own) and never stop the server.
func Shared(tb testing.TB) string {
	tb.Helper()
	if addr := os.Getenv(EnvAddr); addr != "" {
		return addr
	}
	return Start(tb).Addr
}

// Server is a redis-server of the test's own, which it may stop, pause
// and restart. It is killed when the test ends.
type Server struct {
	Addr string
	tb   testing.TB
	port int
	dir  string
	args []string // more redis-server flags (a cluster node's)
	cmd  *exec.Cmd
}

// Start starts a private redis-server without persistence on a free
// loopback port, or skips the test when the binary is missing.
func Start(tb testing.TB) *Server {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		tb.Skipf("redis-server is not installed and %s is not set: install redis-server (apt-get install redis-server) or point %s at a Redis to run this test", EnvAddr, EnvAddr)
	}
	return startServer(tb, freePort(tb, false))
}

func startServer(tb testing.TB, port int, args ...string) *Server {
	tb.Helper()
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), tb: tb, port: port, dir: tb.TempDir(), args: args}
	s.start()
	tb.Cleanup(s.Stop)
	return s
}

// freePort returns a free loopback port; with bus, one whose cluster bus
// port (port+10000) is free too.
func freePort(tb testing.TB, bus bool) int {
	tb.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("free port: %v", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !bus {
			return port
		}
		if port+10000 > 65535 {
			continue
		}
		bl, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		bl.Close()
		return port
	}
	tb.Fatal("no free port with a free cluster bus port (port+10000)")
	return 0
}

func (s *Server) start() {
	s.tb.Helper()
	s.cmd = exec.Command("redis-server", append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", s.dir, "--loglevel", "warning"}, s.args...)...)
	if err := s.cmd.Start(); err != nil {
		s.tb.Fatalf("start redis-server: %v", err)
	}
	var err error
	if !poll.Until(10*time.Second, func() bool {
		err = Ping(s.Addr, 200*time.Millisecond)
		return err == nil
	}) {
		s.tb.Fatalf("redis-server on %s did not answer: %v", s.Addr, err)
	}
}

// Stop kills the server (SIGKILL: nothing is saved) and waits for it.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = resume(s.cmd.Process) // a paused server cannot die otherwise promptly
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart starts a fresh server (empty, since nothing was saved) on the
// same port after Stop.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	s.start()
}

// errNoPause: without SIGSTOP (Windows) a process cannot be paused; the
// tests that pause one are for systems that have it.
var errNoPause = errors.New("pausing a process needs SIGSTOP, which this system lacks")

// Pause stops the server with SIGSTOP: connections stay open and nothing
// answers, as with a hung or partitioned server. Where there is no
// SIGSTOP (Windows) the test is skipped.
func (s *Server) Pause() {
	if err := pause(s.cmd.Process); errors.Is(err, errNoPause) {
		s.tb.Skip(err.Error())
	}
}

// Resume continues a paused server.
func (s *Server) Resume() { _ = resume(s.cmd.Process) }

// Ping sends PING to addr and waits for PONG.
func Ping(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// Prefix returns a key prefix unique to this test run, so tests sharing a
// Redis never see each other's keys.
func Prefix(tb testing.TB) string {
	return fmt.Sprintf("ssgtest%d%d", os.Getpid(), time.Now().UnixNano())
}
