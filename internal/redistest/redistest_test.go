package redistest

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestInfoNamesKind: every installed server kind is told apart by its
// INFO, so that a run meant for one kind fails on the other; with CI set,
// both must be installed.
func TestInfoNamesKind(t *testing.T) {
	for _, k := range Kinds {
		t.Run(k.Name, func(t *testing.T) {
			if _, err := exec.LookPath(k.Server); err != nil {
				if os.Getenv("CI") != "" {
					t.Fatalf("%s is not installed, and CI runs the Redis tests on %s too", k.Server, k.Name)
				}
				t.Skipf("%s is not installed", k.Server)
			}
			s := startServer(t, k, freePort(t, false))
			name, version, err := Info(s.Addr, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if name != k.Name || version == "" {
				t.Fatalf("INFO of %s: got %q version %q; want %q and a version", k.Server, name, version, k.Name)
			}
			t.Logf("%s %s", name, version)
		})
	}
}

// TestSharedIsTheKind: the server the tests share (SSEGATE_REDIS_ADDR, or
// one of their own) is of the kind SSEGATE_REDIS_SERVER names.
func TestSharedIsTheKind(t *testing.T) {
	addr := Shared(t)
	name, version, err := Info(addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := ServerKind(t).Name; name != want {
		t.Fatalf("the shared server %s is %s %s; want %s", addr, name, version, want)
	}
	t.Logf("%s is %s %s", addr, name, version)
}
