// Package redistest gives tests a real redis-server: the one CI starts
// (SSEGATE_REDIS_ADDR), or one of their own on a free loopback port when
// the redis-server binary is installed. Without either, tests skip with a
// message saying how to run them; CI always has one, so they never skip
// there.
//
// The server may be Redis or Valkey (SSEGATE_REDIS_SERVER): CI runs the
// packages that talk to Redis once against each, the same tests, so that
// what docs/redis.md says is tested is what ran.
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
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/poll"
)

// EnvAddr names the environment variable with the address of a Redis the
// tests may share (CI sets it to 127.0.0.1:16379).
const EnvAddr = "SSEGATE_REDIS_ADDR"

// EnvServer names the environment variable that says which server the
// tests run against: redis (the default: redis-server and redis-cli) or
// valkey (valkey-server and valkey-cli). The server at SSEGATE_REDIS_ADDR
// must be of that kind: Shared fails the test otherwise, so that a run
// meant for one cannot pass on the other.
const EnvServer = "SSEGATE_REDIS_SERVER"

// Kind is a server implementation the tests run against.
type Kind struct {
	Name   string // as in SSEGATE_REDIS_SERVER and INFO's server_name
	Server string // the server binary
	CLI    string // its command-line client (--cluster create)
}

// Kinds are the servers the tests know, the default first.
var Kinds = []Kind{
	{Name: "redis", Server: "redis-server", CLI: "redis-cli"},
	{Name: "valkey", Server: "valkey-server", CLI: "valkey-cli"},
}

// ServerKind returns the kind SSEGATE_REDIS_SERVER names (redis when
// unset), and fails the test for a name it does not know.
func ServerKind(tb testing.TB) Kind {
	tb.Helper()
	name := os.Getenv(EnvServer)
	if name == "" {
		return Kinds[0]
	}
	for _, k := range Kinds {
		if k.Name == name {
			return k
		}
	}
	tb.Fatalf("%s=%q: want redis or valkey", EnvServer, name)
	return Kind{}
}

// sharedChecked remembers the shared server whose kind matched, so that
// its INFO is asked once per test binary.
var sharedChecked sync.Map // address → struct{}

// perTest holds, without SSEGATE_REDIS_ADDR, the server Shared started
// for a test that is still running.
var perTest sync.Map // testing.TB → address

// Shared returns the address of a Redis the test may share with other
// tests and packages running at the same time: it must keep to keys of
// its own (a prefix of its own) and never stop the server. The server at
// SSEGATE_REDIS_ADDR must be of the kind SSEGATE_REDIS_SERVER names.
// Without SSEGATE_REDIS_ADDR, a server is started for the test, once:
// its every call of Shared gets that one, as two replicas of one store
// must.
func Shared(tb testing.TB) string {
	tb.Helper()
	addr := os.Getenv(EnvAddr)
	if addr == "" {
		if a, ok := perTest.Load(tb); ok {
			return a.(string)
		}
		addr = Start(tb).Addr
		perTest.Store(tb, addr)
		tb.Cleanup(func() { perTest.Delete(tb) })
		return addr
	}
	if _, ok := sharedChecked.Load(addr); !ok {
		checkKind(tb, addr, ServerKind(tb))
		sharedChecked.Store(addr, struct{}{})
	}
	return addr
}

// Info returns the implementation (redis or valkey) and version of the
// server at addr, from INFO server: Valkey names itself in server_name
// and valkey_version (its redis_version is the Redis it is compatible
// with); Redis 7 has no server_name.
func Info(addr string, timeout time.Duration) (name, version string, err error) {
	info, err := Command(addr, timeout, "INFO", "server")
	if err != nil {
		return "", "", err
	}
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok {
			fields[k] = v
		}
	}
	name = fields["server_name"]
	if name == "" {
		name = "redis"
	}
	version = fields[name+"_version"]
	if version == "" {
		version = fields["redis_version"]
	}
	return name, version, nil
}

// checkKind fails the test unless the server at addr is of kind k.
func checkKind(tb testing.TB, addr string, k Kind) {
	tb.Helper()
	name, version, err := Info(addr, 2*time.Second)
	if err != nil {
		tb.Fatalf("INFO server of %s: %v", addr, err)
	}
	if name != k.Name {
		tb.Fatalf("the server at %s is %s %s; want %s (%s=%q)", addr, name, version, k.Name, EnvServer, os.Getenv(EnvServer))
	}
}

// Server is a redis-server (or valkey-server, per SSEGATE_REDIS_SERVER)
// of the test's own, which it may stop, pause and restart. It is killed
// when the test ends.
type Server struct {
	Addr string
	Kind Kind
	tb   testing.TB
	port int
	dir  string
	args []string // more redis-server flags (a cluster node's)
	cmd  *exec.Cmd
}

// Start starts a private redis-server (valkey-server with
// SSEGATE_REDIS_SERVER=valkey) without persistence on a free loopback
// port, or skips the test when the binary is missing, unless CI is set:
// then it fails, since CI must run it.
func Start(tb testing.TB) *Server {
	tb.Helper()
	k := ServerKind(tb)
	if _, err := exec.LookPath(k.Server); err != nil {
		msg := fmt.Sprintf("%s is not installed and %s is not set: install %s or point %s at a %s to run this test", k.Server, EnvAddr, k.Server, EnvAddr, k.Name)
		if os.Getenv("CI") != "" && os.Getenv(EnvServer) != "" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	return startServer(tb, k, freePort(tb, false))
}

func startServer(tb testing.TB, k Kind, port int, args ...string) *Server {
	tb.Helper()
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Kind: k, tb: tb, port: port, dir: tb.TempDir(), args: args}
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
	s.cmd = exec.Command(s.Kind.Server, append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", s.dir, "--loglevel", "warning"}, s.args...)...)
	if err := s.cmd.Start(); err != nil {
		s.tb.Fatalf("start %s: %v", s.Kind.Server, err)
	}
	var err error
	if !poll.Until(10*time.Second, func() bool {
		err = Ping(s.Addr, 200*time.Millisecond)
		return err == nil
	}) {
		s.tb.Fatalf("%s on %s did not answer: %v", s.Kind.Server, s.Addr, err)
	}
	// A binary of one name may be the other server (a compatibility
	// package's symlink): the run must be what it says.
	checkKind(s.tb, s.Addr, s.Kind)
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
