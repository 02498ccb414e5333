//go:build linux

package deploy

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
)

// nfpmVersion is the nfpm the Makefile and .ci/run build.
const nfpmVersion = "v2.48.0"

// nfpm returns nfpm from the user cache directory, where .ci/run and make
// package put it, building it there first when it is missing (a few
// minutes).
func nfpm(t *testing.T) string {
	t.Helper()
	dir, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "ssegate-test", "nfpm")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command(goBin(), "install", "-trimpath", "github.com/goreleaser/nfpm/v2/cmd/nfpm@"+nfpmVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+filepath.Dir(bin), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install nfpm: %v\n%s", err, out)
	}
	return bin
}

// Where the .deb puts its files.
const (
	unitPath     = "/usr/lib/systemd/system/ssegate.service"
	envPath      = "/etc/ssegate/ssegate.env"
	installedBin = "/usr/bin/ssegate"
)

// TestPackage builds the .deb and .rpm of deploy/package, installs the
// .deb with dpkg, verifies the installed unit with systemd-analyze (its
// exposure score included), starts the installed binary as the unit would
// (its ExecStart, its EnvironmentFile edited as an administrator would, an
// unprivileged user; systemd itself cannot run here), streams through it,
// stops it with SIGTERM within the unit's TimeoutStopSec, and purges the
// package, after which none of its files remain.
func TestPackage(t *testing.T) {
	need(t, "the package test installs the .deb and checks its systemd unit", "dpkg", "systemd-analyze")
	if os.Geteuid() != 0 {
		missing(t, "the package test installs a .deb: run it as root")
	}
	if out, _ := exec.Command("dpkg-query", "-W", "-f=${Status}", "ssegate").Output(); strings.Contains(string(out), "installed") {
		missing(t, "an ssegate package is installed on this machine; the package test would replace it: dpkg --purge ssegate first")
	}
	bin := binary(t)
	nf := nfpm(t)
	out := t.TempDir()
	for _, format := range []string{"deb", "rpm"} {
		cmd := exec.Command(nf, "package", "-f", "deploy/package/nfpm.yaml", "-p", format, "-t", out+"/")
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "SSEGATE_PKG_ARCH="+runtime.GOARCH, "SSEGATE_PKG_VERSION=0.0.0~test", "SSEGATE_PKG_BINARY="+bin)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nfpm package -p %s: %v\n%s", format, err, b)
		}
	}
	debs, _ := filepath.Glob(filepath.Join(out, "*.deb"))
	rpms, _ := filepath.Glob(filepath.Join(out, "*.rpm"))
	if len(debs) != 1 || len(rpms) != 1 {
		t.Fatalf("nfpm wrote %v and %v; want one .deb and one .rpm", debs, rpms)
	}
	if _, err := exec.LookPath("rpm"); err == nil {
		b, err := exec.Command("rpm", "-qlp", rpms[0]).CombinedOutput()
		if err != nil || !strings.Contains(string(b), installedBin) || !strings.Contains(string(b), unitPath) {
			t.Errorf("rpm -qlp: %v\n%s; want the binary and the unit", err, b)
		}
	}

	run(t, "dpkg", "-i", debs[0])
	purged := false
	t.Cleanup(func() {
		if !purged {
			exec.Command("dpkg", "--purge", "ssegate").Run() //nolint:errcheck // the test failed; best effort
		}
	})
	for _, p := range []string{installedBin, unitPath, envPath} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("after dpkg -i: %v", err)
		}
	}
	if fi, _ := os.Stat(envPath); fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v; want 0600 (it may hold the secret)", envPath, fi.Mode().Perm())
	}
	run(t, "systemd-analyze", "verify", unitPath)
	sec, _ := exec.Command("systemd-analyze", "security", "--offline=true", "--no-pager", unitPath).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for ssegate.service: ([0-9.]+)`).FindSubmatch(sec)
	if m == nil {
		t.Fatalf("systemd-analyze security gave no score:\n%s", sec)
	}
	if score, _ := strconv.ParseFloat(string(m[1]), 64); score > 2.0 {
		t.Errorf("exposure score %v; want at most 2.0 (it was 1.4)", score)
	} else {
		t.Logf("systemd-analyze security: exposure %v", score)
	}

	unit := readUnit(t, unitPath)
	for k, want := range map[string]string{"DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict", "CapabilityBoundingSet": "",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX", "MemoryDenyWriteExecute": "yes", "PrivateTmp": "yes", "ProtectHome": "yes", "LockPersonality": "yes"} {
		if got, ok := unit[k]; !ok || got[0] != want {
			t.Errorf("%s: got %q; want %s=%s", unitPath, got, k, want)
		}
	}
	if len(unit["EnvironmentFile"]) != 1 || unit["EnvironmentFile"][0] != envPath || len(unit["ExecStart"]) != 1 {
		t.Fatalf("%s: EnvironmentFile %q, ExecStart %q; want %s and one command", unitPath, unit["EnvironmentFile"], unit["ExecStart"], envPath)
	}

	// An administrator sets the upstream and the address.
	addr := gatetest.FreePort(t)
	edit(t, envPath, map[string]string{"SSEGATE_UPSTREAM": "mock", "SSEGATE_LISTEN": addr})
	env := readEnvFile(t, envPath)
	stop, err := time.ParseDuration(unit["TimeoutStopSec"][0])
	if err != nil {
		t.Fatalf("TimeoutStopSec: %v", err)
	}
	drain, err := time.ParseDuration(env["SSEGATE_SHUTDOWN_TIMEOUT"])
	if err != nil || drain >= stop {
		t.Errorf("SSEGATE_SHUTDOWN_TIMEOUT %q, TimeoutStopSec %v; want the drain shorter than the stop timeout", env["SSEGATE_SHUTDOWN_TIMEOUT"], stop)
	}
	argv := strings.Fields(unit["ExecStart"][0])
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Dir = "/"
	// DynamicUser allocates a user of its own; nobody is as unprivileged.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var logs gatetest.LogBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck // it may have exited
		if t.Failed() {
			t.Logf("the installed ssegate's output:\n%s", logs.String())
		}
	})
	base := "http://" + addr
	waitHTTP(t, base, 30*time.Second, func() (bool, string) {
		select {
		case err := <-exited:
			exited <- err
			return false, logs.String()
		default:
			return true, logs.String()
		}
	})
	key := "deploy-package-" + runID
	first := post(t, base, key)
	checkWhole(t, "a keyed stream through the installed binary", first)
	second := post(t, base, key)
	checkWhole(t, "its repeat", second)
	if second.replayed != "true" || upstreamCalls(t, base) != 1 {
		t.Errorf("the repeat: Idempotent-Replayed %q, %d upstream calls; want true and 1", second.replayed, upstreamCalls(t, base))
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after SIGTERM: %v; want exit 0", err)
		}
	case <-time.After(stop):
		t.Errorf("not stopped within TimeoutStopSec (%v)", stop)
	}

	run(t, "dpkg", "--purge", "ssegate")
	purged = true
	for _, p := range []string{installedBin, unitPath, envPath, "/etc/ssegate"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("after dpkg --purge, %s remains", p)
		}
	}
}

// run runs a command and fails the test with its output on an error.
func run(t *testing.T, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// readUnit returns the [Service] settings of a unit file, each key's
// values in order (an empty value is kept, as it resets a list).
func readUnit(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			section = line
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok && section == "[Service]" {
			out[strings.TrimSpace(k)] = append(out[strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	return out
}

// readEnvFile reads an EnvironmentFile as systemd does for the plain
// KEY=VALUE lines the shipped one has: comments and blank lines skipped,
// quotes around a value removed.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not KEY=VALUE", path, line)
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		if v != "" {
			out[strings.TrimSpace(k)] = v
		}
	}
	return out
}

// edit sets KEY=VALUE lines in an env file, replacing the line of each
// key that has one and appending the others.
func edit(t *testing.T, path string, set map[string]string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	done := map[string]bool{}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimRight(line, "\n")
		if k, _, ok := strings.Cut(line, "="); ok {
			if v, want := set[k]; want {
				line = k + "=" + v
				done[k] = true
			}
		}
		lines = append(lines, line)
	}
	for k, v := range set {
		if !done[k] {
			lines = append(lines, fmt.Sprintf("%s=%s", k, v))
		}
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}
