// Package deploy tests what ssegate ships besides its code: the container
// image (deploy/container), the .deb with its systemd unit
// (deploy/package), the memory limit read from a container's cgroup, and
// -version. It builds one static binary and one image for the whole
// package (TestMain), runs containers with podman (runc, host network, a
// read-only root, every capability dropped) and installs the .deb with
// dpkg. Without podman, dpkg or root the tests that need them skip,
// unless CI is set: then they fail, since CI must run them (.ci/run
// installs them).
package deploy

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/poll"
)

// repoRoot is the repository's root, relative to this package.
const repoRoot = "../.."

var (
	workDir string // the package's temporary directory; removed by TestMain
	runID   string // names this run's image and containers
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ssegate-deploy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workDir = dir
	b := make([]byte, 4)
	rand.Read(b) //nolint:errcheck // never fails
	runID = hex.EncodeToString(b)
	code := m.Run()
	if imageBuilt {
		exec.Command("podman", "rmi", "-f", imageName()).Run() //nolint:errcheck // best effort
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// need skips the test when a command is missing, or fails it under CI.
func need(t *testing.T, why string, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if _, err := exec.LookPath(c); err != nil {
			missing(t, fmt.Sprintf("%s is not installed: %s (apt-get install %s; .ci/run installs it)", c, why, c))
		}
	}
}

// missing skips the test with msg, or fails it under CI.
func missing(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// binary builds cmd/ssegate once, static (CGO_ENABLED=0, -trimpath) for
// linux on this machine's architecture, with the version and commit
// passed as the Makefile passes them, and returns its path, in a
// directory laid out as the image's build context wants it
// (linux-ARCH/ssegate).
func binary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binPath = filepath.Join(workDir, "context", "linux-"+runtime.GOARCH, "ssegate")
		version, commit := "dev", ""
		if out, err := exec.Command("git", "-C", repoRoot, "describe", "--tags", "--always", "--dirty").Output(); err == nil {
			version = strings.TrimSpace(string(out))
		}
		if out, err := exec.Command("git", "-C", repoRoot, "rev-parse", "HEAD").Output(); err == nil {
			commit = strings.TrimSpace(string(out))
		}
		modified := "false"
		if out, err := exec.Command("git", "-C", repoRoot, "status", "--porcelain").Output(); err == nil && len(out) > 0 {
			modified = "true"
		}
		cmd := exec.Command(goBin(), "build", "-buildvcs=auto", "-trimpath",
			"-ldflags", "-s -w -X main.version="+version+" -X main.commit="+commit+" -X main.modified="+modified,
			"-o", binPath, "github.com/ssegate/ssegate/cmd/ssegate")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/ssegate: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func goBin() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// chat is a streaming chat completion for the embedded mock; the mock
// answers the same body with the same events.
const chat = `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hello"}]}`

// answer is one HTTP answer, its body read to the end.
type answer struct {
	status   int
	replayed string // Idempotent-Replayed
	body     string
}

// post sends chat to base with the Idempotency-Key key (none if empty)
// and extra headers, and reads the whole answer.
func post(t *testing.T, base, key string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chat))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	c := &http.Client{Timeout: 60 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v (so far %q)", err, body)
	}
	return answer{resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body)}
}

// openStream sends chat to base without a key, waits for the answer's
// first event, and returns the function that reads the rest.
func openStream(t *testing.T, base string, header ...string) func() answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chat))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	var head strings.Builder
	for !strings.HasPrefix(head.String(), "data:") && !strings.Contains(head.String(), "\ndata:") {
		line, err := r.ReadString('\n')
		head.WriteString(line)
		if err != nil {
			resp.Body.Close()
			t.Fatalf("the stream ended before its first event: %v (%q)", err, head.String())
		}
	}
	return func() answer {
		defer resp.Body.Close()
		rest, err := io.ReadAll(r)
		if err != nil {
			t.Errorf("reading the stream: %v", err)
		}
		return answer{resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), head.String() + string(rest)}
	}
}

// checkWhole fails unless a is a 200 SSE stream that ended with [DONE].
func checkWhole(t *testing.T, what string, a answer) {
	t.Helper()
	if a.status != 200 || !strings.Contains(a.body, "data: [DONE]") {
		t.Fatalf("%s: got %d %q; want 200 and a stream ending in [DONE]", what, a.status, a.body)
	}
}

// upstreamCalls returns the upstream attempts that got an answer, from
// ssegate's /metrics (ssegate_upstream_attempts_total{outcome="ok"}).
func upstreamCalls(t *testing.T, base string) int {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, `ssegate_upstream_attempts_total{outcome="ok"} `); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("metrics line %q: %v", line, err)
			}
			n += int(v)
		}
	}
	return n
}

// waitHTTP waits until base answers /healthz, or fails after limit; alive
// says whether the process is still there to wait for.
func waitHTTP(t *testing.T, base string, limit time.Duration, alive func() (bool, string)) {
	t.Helper()
	c := &http.Client{Timeout: time.Second}
	exited := false
	answered := poll.Until(limit, func() bool {
		if resp, err := c.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return true
			}
		}
		ok, _ := alive()
		exited = !ok
		return exited
	})
	_, out := alive()
	switch {
	case exited:
		t.Fatalf("ssegate exited before it answered; its output:\n%s", out)
	case !answered:
		t.Fatalf("%s/healthz did not answer within %v; the output:\n%s", base, limit, out)
	}
}

// logLine returns the first JSON log line of out whose msg is msg.
func logLine(out, msg string) string {
	for line := range strings.Lines(out) {
		if strings.Contains(line, `"msg":"`+msg+`"`) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
