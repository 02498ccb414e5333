package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// kind names a server the load generator talks to.
type kind string

const (
	kindDirect   kind = "direct"   // the mock upstream itself, in the bench process
	kindHTTPUtil kind = "httputil" // httputil.ReverseProxy, a child of the bench binary
	kindFastHTTP kind = "fasthttp" // the minimal fasthttp relay, a child of the bench binary
	kindNginx    kind = "nginx"    // nginx, proxy_buffering off
	kindCaddy    kind = "caddy"    // Caddy's reverse_proxy, built from bench/caddy
	kindPortkey  kind = "portkey"  // the Portkey gateway (Node), installed from bench/portkey
	kindSsegate  kind = "ssegate"  // the ssegate binary built at the start of the run
	kindBaseline kind = "baseline" // the -baseline ssegate binary, run as ssegate is
	kindMock     kind = "mock"     // the upstream, a child of the bench binary
)

// server is one running peer: where to reach it and which processes to
// measure. A fresh one is started for every measurement, so that its idle
// RSS, CPU and peak RSS belong to that measurement alone.
type server struct {
	kind kind
	addr string
	pids []int // the process and its descendants; none for direct
	// admin is ssegate's admin listener with /debug/pprof (-profile), or "".
	admin string
	// headers are header lines (CRLF-terminated) every request to this
	// server carries: the Portkey gateway's routing headers.
	headers string
	cmd     *exec.Cmd
	dir     string
	exit    chan error // receives cmd.Wait's result
	log     *os.File
	env     *env
}

// freeAddr returns a loopback address with a port free at the time of the
// call.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr, nil
}

// ssegateFlags are the flags every measured ssegate runs with: quiet logs,
// a short drain, and bounds out of the measurements' way.
var ssegateFlags = []string{"-log-level", "warn", "-shutdown-timeout", "1s",
	"-max-streams", "100000", "-max-live-bytes", strconv.Itoa(8 << 30)}

// ssegateCmd is the command of the ssegate binary bin on addr in front of
// the mock upstream, with the suite's flags, the user's (-ssegate-args,
// -ssegate-env) and extra: the measured ssegate and the -baseline one run
// with the same command but for the binary.
func (e *env) ssegateCmd(bin, addr string, extra ...string) *exec.Cmd {
	args := append([]string{"-listen", addr, "-upstream", e.mockURL}, ssegateFlags...)
	args = append(args, e.ssegateArgs...)
	cmd := exec.Command(bin, append(args, extra...)...)
	if len(e.ssegateEnv) > 0 {
		cmd.Env = append(os.Environ(), e.ssegateEnv...)
	}
	return cmd
}

// start starts a server of kind k in front of the mock upstream.
func (e *env) start(k kind) (*server, error) {
	if k == kindDirect {
		return &server{kind: k, addr: e.mockAddr}, nil
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	var cmd *exec.Cmd
	dir, admin := "", ""
	var profile []string // ssegate's flags for -profile
	if e.profile && (k == kindSsegate || k == kindBaseline) {
		if admin, err = freeAddr(); err != nil {
			return nil, err
		}
		profile = []string{"-admin-listen", admin, "-pprof"}
	}
	switch k {
	case kindSsegate:
		args, environ := e.tracesArgs()
		cmd = e.ssegateCmd(e.ssegateBin, addr, append(profile, args...)...)
		if environ != nil {
			cmd.Env = append(append(os.Environ(), e.ssegateEnv...), environ...)
		}
	case kindBaseline:
		if e.baselineBin == "" {
			return nil, errors.New("no -baseline binary")
		}
		cmd = e.ssegateCmd(e.baselineBin, addr, profile...)
	case kindHTTPUtil:
		cmd = exec.Command(e.self, httputilCommand, addr, e.mockURL)
	case kindFastHTTP:
		cmd = exec.Command(e.self, fasthttpCommand, addr, e.mockURL)
	case kindMock:
		cmd = exec.Command(e.self, mockCommand, addr)
	case kindNginx:
		if e.nginxBin == "" {
			return nil, errors.New("nginx not found on PATH")
		}
		dir = e.peerDir(k)
		conf, err := writeNginxConf(dir, addr, e.mockAddr)
		if err != nil {
			return nil, err
		}
		cmd = exec.Command(e.nginxBin, "-p", dir, "-c", conf, "-e", filepath.Join(dir, "error.log"))
	case kindCaddy:
		if e.caddyBin == "" {
			return nil, errors.New("caddy was not built (see the notes)")
		}
		dir = e.peerDir(k)
		conf, err := writeCaddyConf(dir, addr, e.mockAddr)
		if err != nil {
			return nil, err
		}
		cmd = caddyCmd(e.caddyBin, conf, dir)
	case kindPortkey:
		if e.portkeyDir == "" {
			return nil, errors.New("the Portkey gateway is not installed (see the notes)")
		}
		if cmd, err = portkeyCmd(e.portkeyDir, addr); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown server kind %q", k)
	}
	s, err := e.launch(k, addr, cmd)
	if err != nil {
		return nil, err
	}
	s.dir, s.admin = dir, admin
	if k == kindPortkey {
		s.headers = portkeyHeaders(e.mockAddr)
	}
	// nginx forks its workers after it listens; wait for them.
	for i := 0; i < 50; i++ {
		s.pids = procTree(cmd.Process.Pid)
		if k != kindNginx || len(s.pids) > 1 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s, nil
}

// peerDir returns a new directory name under the run's temporary one for
// a measurement of k: KIND-N, N counting k's measurements.
func (e *env) peerDir(k kind) string {
	if e.dirs == nil {
		e.dirs = map[kind]int{}
	}
	e.dirs[k]++
	return filepath.Join(e.tmp, fmt.Sprintf("%s-%d", k, e.dirs[k]))
}

// launch starts cmd as a peer of kind k listening on addr, in a process
// group of its own, its output in the log directory, and waits until addr
// accepts connections.
func (e *env) launch(k kind, addr string, cmd *exec.Cmd) (*server, error) {
	s := &server{kind: k, addr: addr, exit: make(chan error, 1)}
	var err error
	s.log, err = os.OpenFile(filepath.Join(e.logDir, string(k)+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = s.log, s.log
	ownGroup(cmd)
	if err := cmd.Start(); err != nil {
		_ = s.log.Close()
		return nil, fmt.Errorf("start %s: %w", k, err)
	}
	s.cmd = cmd
	e.track(s, true)
	go func() { s.exit <- cmd.Wait() }()
	ready := 10 * time.Second
	if k == kindPortkey || k == kindCaddy {
		ready = 30 * time.Second // Node loads the gateway's modules first; a busy machine is slow at it
	}
	if err := s.waitReady(ready); err != nil {
		s.stop()
		return nil, fmt.Errorf("%s did not come up on %s: %w (see %s)", k, addr, err, s.log.Name())
	}
	s.pids = procTree(cmd.Process.Pid)
	return s, nil
}

// track adds s to the running servers, or removes it.
func (e *env) track(s *server, running bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running == nil {
		e.running = map[*server]struct{}{}
	}
	if running {
		e.running[s] = struct{}{}
		s.env = e
	} else {
		delete(e.running, s)
	}
}

// killAll kills the process groups of every running server, for an
// interrupted run.
func (e *env) killAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for s := range e.running {
		if s.cmd != nil && s.cmd.Process != nil {
			killGroup(s.cmd.Process)
		}
	}
}

// waitReady waits until the server accepts connections.
func (s *server) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case werr := <-s.exit:
			s.exit <- werr
			return fmt.Errorf("exited: %v", werr)
		default:
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop ends the server: SIGTERM, then SIGKILL to its process group if it
// is still there after a few seconds.
func (s *server) stop() {
	if s.cmd == nil {
		return
	}
	terminate(s.cmd.Process)
	select {
	case <-s.exit:
	case <-time.After(5 * time.Second):
		killGroup(s.cmd.Process)
		<-s.exit
	}
	if s.kind == kindNginx || s.kind == kindPortkey {
		// nginx's workers leave with the master, and whatever Node may
		// have spawned with the gateway; make sure none lingers.
		killGroup(s.cmd.Process)
	}
	s.cmd = nil
	if s.env != nil {
		s.env.track(s, false)
	}
	if s.log != nil {
		_ = s.log.Close()
	}
}
