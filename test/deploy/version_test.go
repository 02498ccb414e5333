package deploy

import (
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// TestVersion: ssegate -version exits 0 and prints the version, the
// commit it was built from (the checkout's HEAD, when git can say),
// whether its tree was modified, and the Go version, and needs no other
// flag nor environment.
func TestVersion(t *testing.T) {
	out, err := exec.Command(binary(t), "-version").CombinedOutput()
	if err != nil {
		t.Fatalf("ssegate -version: %v; output:\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "ssegate ") || strings.TrimPrefix(lines[0], "ssegate ") == "" {
		t.Fatalf("got %q; want ssegate VERSION, the commit and the Go version", out)
	}
	if want := "go       " + runtime.Version() + " linux/" + runtime.GOARCH; lines[len(lines)-1] != want {
		t.Errorf("last line: got %q; want %q", lines[len(lines)-1], want)
	}
	if !strings.Contains(string(out), "\nmodified true\n") && !strings.Contains(string(out), "\nmodified false\n") {
		t.Errorf("got %q; want a line saying whether the tree was modified", out)
	}
	if head, err := exec.Command("git", "-C", repoRoot, "rev-parse", "HEAD").Output(); err == nil {
		if want := "commit   " + strings.TrimSpace(string(head)); !strings.Contains(string(out), want+"\n") {
			t.Errorf("got %q; want a line %q", out, want)
		}
	}
}
