package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// fakeTree writes files (path relative to the tree → content) under a
// temporary directory and returns it, as a root for cgroupMemoryLimit.
func fakeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// The mountinfo of a hybrid host (v1 controllers, cgroup2 on unified), of
// a v1 container (the mount's root is the container's cgroup) and of a
// pure v2 host.
const (
	hybridMountinfo = `30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	containerV1Mountinfo = `600 590 0:31 /machine.slice/libpod-abc.scope /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory
601 590 0:28 /machine.slice/libpod-abc.scope /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct
`
	v2Mountinfo = `25 20 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
)

// TestCgroupMemoryLimit reads the limit from fake cgroup trees: v1 and v2,
// "max" and v1's huge no-limit value, a parent's tighter limit, a
// container whose mount root is its own cgroup, and no cgroup at all.
func TestCgroupMemoryLimit(t *testing.T) {
	cases := []struct {
		name   string
		files  map[string]string
		limit  int64
		source string
	}{
		{"v1 container", map[string]string{
			"proc/self/cgroup":                           "5:memory:/machine.slice/libpod-abc.scope\n4:cpu,cpuacct:/machine.slice/libpod-abc.scope\n0::/\n",
			"proc/self/mountinfo":                        containerV1Mountinfo,
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "268435456\n",
		}, 256 << 20, "cgroup-v1"},
		{"v1 unlimited", map[string]string{
			"proc/self/cgroup":    "4:memory:/process_api/x\n0::/\n",
			"proc/self/mountinfo": hybridMountinfo,
			"sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": "9223372036854771712\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes":               "9223372036854771712\n",
		}, 0, "cgroup-v1"},
		{"v1 parent tighter", map[string]string{
			"proc/self/cgroup":                               "4:memory:/a/b\n0::/\n",
			"proc/self/mountinfo":                            hybridMountinfo,
			"sys/fs/cgroup/memory/a/b/memory.limit_in_bytes": "1073741824\n",
			"sys/fs/cgroup/memory/a/memory.limit_in_bytes":   "536870912\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes":     "9223372036854771712\n",
		}, 512 << 20, "cgroup-v1"},
		{"v2 limit", map[string]string{
			"proc/self/cgroup":    "0::/system.slice/ssegate.service\n",
			"proc/self/mountinfo": v2Mountinfo,
			"sys/fs/cgroup/system.slice/ssegate.service/memory.max": "805306368\n",
			"sys/fs/cgroup/system.slice/memory.max":                 "max\n",
		}, 768 << 20, "cgroup-v2"},
		{"v2 max", map[string]string{
			"proc/self/cgroup":                    "0::/user.slice\n",
			"proc/self/mountinfo":                 v2Mountinfo,
			"sys/fs/cgroup/user.slice/memory.max": "max\n",
		}, 0, "cgroup-v2"},
		{"v2 namespace root", map[string]string{ // a cgroup namespace: the process is at "/"
			"proc/self/cgroup":         "0::/\n",
			"proc/self/mountinfo":      v2Mountinfo,
			"sys/fs/cgroup/memory.max": "268435456\n",
		}, 256 << 20, "cgroup-v2"},
		{"hybrid v2 without memory", map[string]string{ // memory on v1, which wins
			"proc/self/cgroup":                           "4:memory:/\n0::/\n",
			"proc/self/mountinfo":                        hybridMountinfo,
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "134217728\n",
			"sys/fs/cgroup/unified/memory.max":           "max\n",
		}, 128 << 20, "cgroup-v1"},
		{"no cgroup", map[string]string{}, 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			limit, source, err := cgroupMemoryLimit(fakeTree(t, c.files))
			if err != nil {
				t.Fatal(err)
			}
			if limit != c.limit || source != c.source {
				t.Errorf("got %d from %q; want %d from %q", limit, source, c.limit, c.source)
			}
		})
	}
	_, _, err := cgroupMemoryLimit(fakeTree(t, map[string]string{
		"proc/self/cgroup":         "0::/\n",
		"proc/self/mountinfo":      v2Mountinfo,
		"sys/fs/cgroup/memory.max": "lots\n",
	}))
	if err == nil || !strings.Contains(err.Error(), "lots") {
		t.Errorf("a malformed memory.max: got %v; want an error quoting it", err)
	}
}

// TestMemoryFromCgroup: with no -memory-limit and no GOMEMLIMIT, the soft
// limit is -memory-limit-ratio of the cgroup's limit, and the store
// bounds not given default to a quarter and an eighth of it; given ones,
// GOMEMLIMIT and -memory-limit take precedence; a big container leaves
// the defaults.
func TestMemoryFromCgroup(t *testing.T) {
	prev := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	v1 := func(limit string) string {
		return fakeTree(t, map[string]string{
			"proc/self/cgroup":                           "5:memory:/machine.slice/libpod-abc.scope\n",
			"proc/self/mountinfo":                        containerV1Mountinfo,
			"sys/fs/cgroup/memory/memory.limit_in_bytes": limit,
		})
	}
	const mib = 1 << 20
	cases := []struct {
		name        string
		root        string
		args        []string
		env         map[string]string
		limit       int64
		source      string
		store, live int64
	}{
		{"256m container", v1("268435456"), nil, nil, 241591910, "cgroup-v1", 57 * mib, 28 * mib},
		{"ratio 0.5", v1("268435456"), []string{"-memory-limit-ratio", "0.5"}, nil, 128 * mib, "cgroup-v1", 32 * mib, 16 * mib},
		{"ratio 0 ignores the cgroup", v1("268435456"), []string{"-memory-limit-ratio", "0"}, nil, 0, "none", 512 * mib, 256 * mib},
		{"given bounds stay", v1("268435456"), []string{"-max-store-bytes", "1000000"}, map[string]string{"SSEGATE_MAX_LIVE_BYTES": "300000000"}, 241591910, "cgroup-v1", 1000000, 300000000},
		{"flag wins", v1("268435456"), []string{"-memory-limit", "1073741824"}, nil, 1 << 30, "flag", 256 * mib, 128 * mib},
		{"GOMEMLIMIT wins", v1("268435456"), nil, map[string]string{"GOMEMLIMIT": "1GiB"}, 0, "GOMEMLIMIT", 512 * mib, 256 * mib},
		{"big container", v1("17179869184"), nil, nil, 15461882265, "cgroup-v1", 512 * mib, 256 * mib},
		{"unlimited", v1("9223372036854771712"), nil, nil, 0, "none", 512 * mib, 256 * mib},
		{"live bound holds one whole stream", v1("134217728"), nil, nil, 120795955, "cgroup-v1", 28 * mib, 16 * mib},
		{"live bound fits -seal-live-bytes", v1("268435456"), []string{"-seal-live-bytes", "50000000"}, nil, 241591910, "cgroup-v1", 57 * mib, 50000000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cgroupRoot = c.root
			t.Cleanup(func() { cgroupRoot = "/" })
			o, err := parseFlags(append([]string{"-upstream", "mock"}, c.args...), env(c.env), &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			m := o.memory
			if m.limit != c.limit && c.source != "GOMEMLIMIT" || m.source != c.source {
				t.Errorf("limit: got %d from %s; want %d from %s", m.limit, m.source, c.limit, c.source)
			}
			if o.maxStoreBytes != c.store || o.maxLiveBytes != c.live {
				t.Errorf("bounds: got -max-store-bytes %d, -max-live-bytes %d; want %d, %d", o.maxStoreBytes, o.maxLiveBytes, c.store, c.live)
			}
		})
	}
	cgroupRoot = v1("268435456")
	t.Cleanup(func() { cgroupRoot = "/" })
	logs := startupLog(t, []string{"-listen", "127.0.0.1:0", "-upstream", "mock", "-log-format", "text"}, env(nil))
	for _, want := range []string{"memory_limit=241591910 source=cgroup-v1 container_memory=268435456", "max_store_bytes=59768832 max_live_bytes=29360128 derived=max-store-bytes,max-live-bytes"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the start-up log lacks %q:\n%s", want, logs.String())
		}
	}
	if got := debug.SetMemoryLimit(-1); got != 241591910 {
		t.Errorf("the runtime's memory limit: got %d; want 241591910", got)
	}
}

// TestVersion: -version is an action (errVersion, no -upstream needed,
// SSEGATE_VERSION ignored), and its text names the module version, the
// commit and whether the tree was modified, and the Go version.
func TestVersion(t *testing.T) {
	if _, err := parseFlags([]string{"-version"}, env(nil), &bytes.Buffer{}); err != errVersion {
		t.Errorf("-version: got %v; want errVersion", err)
	}
	if _, err := parseFlags([]string{"-upstream", "mock"}, env(map[string]string{"SSEGATE_VERSION": "true"}), &bytes.Buffer{}); err != nil {
		t.Errorf("SSEGATE_VERSION: got %v; want it ignored", err)
	}
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/ssegate/ssegate", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "2026-12-07T00:00:00Z"}}}
	got := formatVersion(bi, "v9.9.9", "", "")
	for _, want := range []string{"ssegate v1.2.3\n", "commit   0123abcd\n", "modified true\n", "go       go1.26.8 "} {
		if !strings.Contains(got, want) {
			t.Errorf("got %q; want it to contain %q", got, want)
		}
	}
	got = formatVersion(&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "v1.2.3-4-gabcdef", "abcdef", "false")
	if !strings.HasPrefix(got, "ssegate v1.2.3-4-gabcdef\ncommit   abcdef\nmodified false\n") {
		t.Errorf("a build without a module version: got %q; want the -X version and commit", got)
	}
}
