package observe_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
)

// What ships, relative to this package.
var (
	rulesFile     = filepath.Join("..", "..", "deploy", "prometheus", "ssegate.rules.yml")
	rulesTestFile = filepath.Join("..", "..", "deploy", "prometheus", "ssegate.rules.test.yml")
	dashboardFile = filepath.Join("..", "..", "deploy", "grafana", "ssegate.json")
)

// The built binary, built once for the package's tests (gatetest.Main),
// polled on /healthz until it answers and given the time to drain that
// a test's load needs.
var gates = gatetest.Config{Grace: 10 * time.Second}

func TestMain(m *testing.M) { gatetest.Main(m) }

// program returns the path of name on PATH, failing the test when it is
// missing: these tests are what shows the shipped files work, so they
// skip nothing (.ci/run installs them).
func program(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: apt-get install %s (as .ci/run does)", name, pkg)
	}
	return p
}

// abs returns path made absolute, for the programs the tests start in
// directories of their own.
func abs(t *testing.T, path string) string {
	t.Helper()
	p, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	return p
}
