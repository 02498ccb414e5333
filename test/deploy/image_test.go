package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/redistest"
)

// podmanArgs come first on every podman command: crun refuses a host with
// hybrid cgroups, runc runs everywhere.
var podmanArgs = []string{"--runtime", "runc"}

// runArgs are every container's: the host's loopback, a read-only root,
// no capability, no privilege gain, and rlimits within the host's hard
// limits (podman's default nofile exceeds them on some hosts).
var runArgs = []string{"--network", "host", "--read-only", "--cap-drop=ALL", "--security-opt", "no-new-privileges",
	"--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"}

// podman runs podman with args and returns its trimmed stdout, failing
// the test with its output on an error.
func podman(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "podman", append(append([]string{}, podmanArgs...), args...)...)
	var stderr gatetest.LogBuffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("podman %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

func imageName() string { return "localhost/ssegate-deploy-test:" + runID }

var (
	imageOnce  sync.Once
	imageBuilt bool
	imageErr   error
)

// image builds deploy/container/Containerfile once, for this machine's
// architecture, from the static binary and this machine's CA
// certificates, as make image does for each architecture.
func image(t *testing.T) string {
	t.Helper()
	need(t, "the image tests build and run the container image with podman and runc", "podman", "runc")
	bin := binary(t)
	imageOnce.Do(func() {
		ctxDir := filepath.Dir(filepath.Dir(bin))
		ca, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
		if err != nil {
			imageErr = fmt.Errorf("the CA bundle the image copies: %w (apt-get install ca-certificates)", err)
			return
		}
		if err := os.WriteFile(filepath.Join(ctxDir, "ca-certificates.crt"), ca, 0o644); err != nil {
			imageErr = err
			return
		}
		cmd := exec.Command("podman", append(append([]string{}, podmanArgs...), "build", "--layers=false", "--platform", "linux/"+runtime.GOARCH,
			"-f", filepath.Join(repoRoot, "deploy/container/Containerfile"), "-t", imageName(), ctxDir)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			imageErr = fmt.Errorf("podman build: %v\n%s", err, out)
			return
		}
		imageBuilt = true
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
	return imageName()
}

// container is one running ssegate container.
type container struct {
	t    *testing.T
	name string
	base string // http://its -listen
}

// start runs the image with runArgs, more podman run flags, and the
// SSEGATE_* variables env, listening on a free loopback port, and waits
// until it answers. The container is removed when the test ends.
func start(t *testing.T, more []string, env ...string) *container {
	t.Helper()
	img := image(t)
	addr := gatetest.FreePort(t)
	c := &container{t: t, name: fmt.Sprintf("ssegate-deploy-%s-%d", runID, time.Now().UnixNano()), base: "http://" + addr}
	args := append([]string{"run", "-d", "--name", c.name}, runArgs...)
	args = append(args, more...)
	for _, kv := range append([]string{"SSEGATE_LISTEN=" + addr, "SSEGATE_UPSTREAM=mock"}, env...) {
		args = append(args, "-e", kv)
	}
	podman(t, append(args, img)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s's output:\n%s", c.name, c.logs())
		}
		exec.Command("podman", append(append([]string{}, podmanArgs...), "rm", "-f", "-t", "0", c.name)...).Run() //nolint:errcheck // best effort
	})
	waitHTTP(t, c.base, 30*time.Second, func() (bool, string) { return c.running(), c.logs() })
	return c
}

func (c *container) logs() string {
	out, _ := exec.Command("podman", append(append([]string{}, podmanArgs...), "logs", c.name)...).CombinedOutput()
	return string(out)
}

func (c *container) running() bool {
	out, err := exec.Command("podman", append(append([]string{}, podmanArgs...), "inspect", "--format", "{{.State.Running}}", c.name)...).Output()
	return err == nil && strings.TrimSpace(string(out)) == "true"
}

// TestImage runs the image as it is meant to run (host network, read-only
// root, no capabilities, no new privileges) against its embedded mock: a
// stream comes through whole, a keyed repeat is replayed without a second
// upstream call, and SIGTERM lets an open stream finish and the container
// exit 0 within the drain. The image itself: a numeric non-root user, the
// default listen address 0.0.0.0:8080, nothing but the binary and the CA
// certificates.
func TestImage(t *testing.T) {
	img := image(t)
	var inspect []struct {
		Config struct {
			User       string
			Env        []string
			Entrypoint []string
		}
		Os, Architecture string
	}
	if err := json.Unmarshal([]byte(podman(t, "image", "inspect", img)), &inspect); err != nil || len(inspect) != 1 {
		t.Fatalf("podman image inspect: %v, %d images", err, len(inspect))
	}
	cfg := inspect[0]
	if cfg.Config.User != "65532:65532" {
		t.Errorf("user: got %q; want 65532:65532", cfg.Config.User)
	}
	if !strings.Contains(strings.Join(cfg.Config.Env, " "), "SSEGATE_LISTEN=0.0.0.0:8080") {
		t.Errorf("env: got %v; want SSEGATE_LISTEN=0.0.0.0:8080", cfg.Config.Env)
	}
	if len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/usr/bin/ssegate" {
		t.Errorf("entrypoint: got %v; want [/usr/bin/ssegate], no shell", cfg.Config.Entrypoint)
	}
	if cfg.Os != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("platform: got %s/%s; want linux/%s", cfg.Os, cfg.Architecture, runtime.GOARCH)
	}
	// The image holds the binary and the CA bundle and nothing else.
	files := podman(t, "image", "history", "--no-trunc", "--format", "{{.CreatedBy}}", img)
	if strings.Contains(files, "RUN ") || strings.Contains(files, "/bin/sh -c #(nop) RUN") {
		t.Errorf("the image was built with RUN:\n%s", files)
	}

	c := start(t, nil, "SSEGATE_SHUTDOWN_TIMEOUT=20s")
	if got := podman(t, "inspect", "--format", "{{.Config.User}}", c.name); got != "65532:65532" {
		t.Errorf("the container's user: got %q; want 65532:65532", got)
	}
	checkWhole(t, "a stream without a key", post(t, c.base, ""))
	key := "deploy-image-" + runID
	first := post(t, c.base, key)
	checkWhole(t, "the keyed stream", first)
	second := post(t, c.base, key)
	checkWhole(t, "its repeat", second)
	if second.replayed != "true" || second.body != first.body {
		t.Errorf("the repeat: Idempotent-Replayed %q, same body %v; want true and the first answer's events", second.replayed, second.body == first.body)
	}
	if n := upstreamCalls(t, c.base); n != 2 {
		t.Errorf("upstream calls: got %d; want 2 (the unkeyed stream and the first keyed one)", n)
	}

	// SIGTERM while a slow stream is open: the stream still ends whole,
	// and the container exits 0 well within -shutdown-timeout.
	slow := openStream(t, c.base, "X-Mock-Delay", "150ms") // 16 events, 2.4 s
	sent := time.Now()
	podman(t, "kill", "--signal", "TERM", c.name)
	code := podman(t, "wait", c.name)
	took := time.Since(sent)
	if code != "0" {
		t.Errorf("exit code after SIGTERM: got %s; want 0", code)
	}
	if took > 20*time.Second {
		t.Errorf("the drain took %v; want it within -shutdown-timeout (20s)", took)
	}
	checkWhole(t, "the stream open at SIGTERM", slow())
	if logs := c.logs(); !strings.Contains(logs, `"msg":"draining"`) || !strings.Contains(logs, `"msg":"stopped"`) {
		t.Errorf("the log lacks the drain:\n%s", logs)
	}
}

// TestImageMemoryCap: in a container capped at 256 MiB, with no
// -memory-limit nor GOMEMLIMIT, ssegate takes 90% of the cgroup's limit
// as its soft memory limit and a quarter and an eighth of that (in whole
// MiB) as -max-store-bytes and -max-live-bytes, and logs where they came
// from.
func TestImageMemoryCap(t *testing.T) {
	c := start(t, []string{"--memory", "256m"})
	line := logLine(c.logs(), "memory")
	var got struct {
		Limit     int64  `json:"memory_limit"`
		Source    string `json:"source"`
		Container int64  `json:"container_memory"`
		Store     int64  `json:"max_store_bytes"`
		Live      int64  `json:"max_live_bytes"`
		Derived   string `json:"derived"`
	}
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		t.Fatalf("the memory log line %q: %v", line, err)
	}
	const limit = 256 << 20
	const soft = 241591910 // 90% of limit, in bytes
	if got.Container != limit || got.Limit != soft || (got.Source != "cgroup-v1" && got.Source != "cgroup-v2") {
		t.Errorf("got memory_limit %d from %s (container %d); want %d from the cgroup (container %d)", got.Limit, got.Source, got.Container, soft, limit)
	}
	mib := int64(1 << 20)
	if want := soft / 4 / mib * mib; got.Store != want {
		t.Errorf("max_store_bytes: got %d; want %d", got.Store, want)
	}
	if want := soft / 8 / mib * mib; got.Live != want {
		t.Errorf("max_live_bytes: got %d; want %d", got.Live, want)
	}
	if got.Derived != "max-store-bytes,max-live-bytes" {
		t.Errorf("derived: got %q; want both bounds", got.Derived)
	}
	if line := logLine(c.logs(), "ssegate listening"); !strings.Contains(line, `"memory_limit":`+strconv.FormatInt(soft, 10)) {
		t.Errorf("the listening line does not show the limit in effect: %s", line)
	}
	checkWhole(t, "a stream under the cap", post(t, c.base, ""))
}

// TestImageReplicasShareRedis: two containers on one Redis are replicas:
// a key answered by one is replayed by the other, which makes no upstream
// call of its own.
func TestImageReplicasShareRedis(t *testing.T) {
	image(t) // skip before a Redis is started for nothing
	redis := "redis://" + redistest.Shared(t)
	a := start(t, nil, "SSEGATE_REDIS="+redis)
	b := start(t, nil, "SSEGATE_REDIS="+redis)
	key := "deploy-replicas-" + runID
	first := post(t, a.base, key)
	checkWhole(t, "the stream on A", first)
	second := post(t, b.base, key)
	checkWhole(t, "the repeat on B", second)
	if second.replayed != "true" || second.body != first.body {
		t.Errorf("the repeat on B: Idempotent-Replayed %q, same body %v; want true and A's events", second.replayed, second.body == first.body)
	}
	if na, nb := upstreamCalls(t, a.base), upstreamCalls(t, b.base); na != 1 || nb != 0 {
		t.Errorf("upstream calls: got A %d, B %d; want 1 and 0", na, nb)
	}
}
