package main

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// The shares of the soft memory limit that the store's byte bounds take by
// default when a limit is known (see applyMemory). Together 3/8: with
// -gc-percent 50 the heap peaks near 1.5 times what it holds, and the rest
// of the limit is each connection's own memory (buffers, goroutines, a
// request body being read), which no store bound counts. The two keep the
// 2:1 ratio of the flags' defaults.
const (
	storeShare = 0.25  // -max-store-bytes: committed responses
	liveShare  = 0.125 // -max-live-bytes: live journals
)

// cgroupRoot is the directory /proc and the cgroup mounts are read under:
// "/" in the process, a fake tree in tests.
var cgroupRoot = "/"

// cgroupUnlimited is the smallest cgroup v1 limit read as "no limit": v1
// writes no limit as a huge number (math.MaxInt64 rounded down to a page,
// 9223372036854771712), not as "max".
const cgroupUnlimited = 1 << 62

// memorySetting is the soft memory limit in effect and where it came from,
// for the start-up log.
type memorySetting struct {
	limit     int64  // the Go soft limit in bytes; 0 for none
	source    string // flag, GOMEMLIMIT, cgroup-v2, cgroup-v1 or none
	container int64  // the cgroup's limit in bytes; 0 when none was read
	derived   []string
	err       error // reading the cgroup failed (the limit is then none)
}

// applyMemory decides the soft memory limit and, from it, the defaults of
// the store's byte bounds that set names no value for (set holds the
// flags given on the command line or as SSEGATE_*). The limit is
// -memory-limit when given, else GOMEMLIMIT's, else ratio of the
// container's memory limit (cgroup v2 memory.max or v1
// memory.limit_in_bytes of this process's cgroup); with none, the bounds
// keep their defaults. A bound derived from the limit never exceeds its
// flag's default: a small container lowers them so that they fit, a big
// one leaves them as they are (raise them with the flags).
func (o *options) applyMemory(set map[string]bool, getenv func(string) string, ratio float64) memorySetting {
	var m memorySetting
	switch {
	case o.memoryLimit > 0:
		m.limit, m.source = o.memoryLimit, "flag"
	case getenv("GOMEMLIMIT") != "":
		m.source = "GOMEMLIMIT"
		if n := debug.SetMemoryLimit(-1); n != math.MaxInt64 { // the runtime parsed it
			m.limit = n
		}
	case ratio > 0:
		limit, source, err := cgroupMemoryLimit(cgroupRoot)
		m.err = err
		if limit > 0 {
			m.container, m.source = limit, source
			m.limit = int64(float64(limit) * ratio)
			o.memoryLimit = m.limit
		}
	}
	if m.source == "" {
		m.source = "none"
	}
	if m.limit <= 0 {
		return m
	}
	derive := func(name string, share float64, v *int64, floor int64) {
		if set[name] {
			return
		}
		n := max(int64(float64(m.limit)*share)&^(1<<20-1), 1<<20, floor) // whole MiB, at least one
		if n < *v {
			*v = n
			m.derived = append(m.derived, name)
		}
	}
	derive("max-store-bytes", storeShare, &o.maxStoreBytes, 0)
	// The live bound stays at least what the flags that must fit in it ask:
	// one whole stream (-max-stream-bytes) among them, or a small
	// container would cut a long answer that its own bound allows.
	derive("max-live-bytes", liveShare, &o.maxLiveBytes, max(o.sealLive, o.maxLiveTenant, int64(o.maxStream)))
	return m
}

// logArgs are the start-up log's attributes for m.
func (m memorySetting) logArgs(o *options) []any {
	var limit any = "none"
	if m.limit > 0 {
		limit = m.limit
	}
	args := []any{"memory_limit", limit, "source", m.source}
	if m.container > 0 {
		args = append(args, "container_memory", m.container)
	}
	derived := "none"
	if len(m.derived) > 0 {
		derived = strings.Join(m.derived, ",")
	}
	return append(args, "max_store_bytes", o.maxStoreBytes, "max_live_bytes", o.maxLiveBytes, "derived", derived)
}

// cgroupMemoryLimit returns the memory limit in bytes of the cgroup this
// process is in (0: none) and which hierarchy gave it, cgroup-v1 or
// cgroup-v2, reading /proc/self/cgroup, /proc/self/mountinfo and the
// cgroup files under root. The v1 memory controller wins where it is
// mounted (a hybrid host keeps memory there); the limit is the smallest
// along the path from the process's cgroup up to the mount, since a
// parent's limit binds its children too. No cgroup files (not Linux, no
// cgroup mounted) is no limit, not an error.
func cgroupMemoryLimit(root string) (int64, string, error) {
	groups, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", err
	}
	mounts, err := readMounts(filepath.Join(root, "proc/self/mountinfo"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", err
	}
	var v1Path, v2Path string
	haveV1, haveV2 := false, false
	for line := range strings.Lines(string(groups)) {
		parts := strings.SplitN(strings.TrimRight(line, "\n"), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2Path, haveV2 = parts[2], true
			continue
		}
		for c := range strings.SplitSeq(parts[1], ",") {
			if c == "memory" {
				v1Path, haveV1 = parts[2], true
			}
		}
	}
	if haveV1 {
		if mnt, ok := findMount(mounts, "cgroup", "memory"); ok {
			n, err := walkLimit(root, mnt, v1Path, "memory.limit_in_bytes")
			return n, "cgroup-v1", err
		}
	}
	if haveV2 {
		if mnt, ok := findMount(mounts, "cgroup2", ""); ok {
			n, err := walkLimit(root, mnt, v2Path, "memory.max")
			return n, "cgroup-v2", err
		}
	}
	return 0, "", nil
}

// mount is one line of /proc/self/mountinfo, the fields that matter here.
type mount struct {
	root, point, fstype, superOpts string
}

func readMounts(path string) ([]mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 5 || len(b) < 1 {
			continue
		}
		m := mount{root: unescapeMount(a[3]), point: unescapeMount(a[4]), fstype: b[0]}
		if len(b) >= 3 {
			m.superOpts = b[2]
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// findMount returns the first mount of fstype whose super options include
// opt (any, when opt is empty).
func findMount(mounts []mount, fstype, opt string) (mount, bool) {
	for _, m := range mounts {
		if m.fstype != fstype {
			continue
		}
		if opt == "" {
			return m, true
		}
		for o := range strings.SplitSeq(m.superOpts, ",") {
			if o == opt {
				return m, true
			}
		}
	}
	return mount{}, false
}

// walkLimit reads file in the cgroup directory of path under mnt and in
// each parent up to the mount point, and returns the smallest limit (0:
// none). A path outside the mount's root (a cgroup namespace shows the
// process's own cgroup as the root) is read at the mount point.
func walkLimit(root string, mnt mount, path, file string) (int64, error) {
	top := filepath.Join(root, mnt.point)
	rel, ok := strings.CutPrefix(path, mnt.root)
	if mnt.root == "/" {
		rel, ok = path, true
	}
	dir := top
	if ok {
		dir = filepath.Join(top, rel)
	}
	if _, err := os.Stat(dir); err != nil {
		dir = top
	}
	var limit int64
	for {
		n, err := readLimit(filepath.Join(dir, file))
		if err != nil {
			return 0, err
		}
		if n > 0 && (limit == 0 || n < limit) {
			limit = n
		}
		if dir == top || len(dir) <= len(top) {
			return limit, nil
		}
		dir = filepath.Dir(dir)
	}
}

// readLimit reads one cgroup limit file: 0 for "max", v1's huge "no
// limit" value, or a missing file (the v2 root cgroup has none).
func readLimit(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a memory limit", path, s)
	}
	if n >= cgroupUnlimited {
		return 0, nil
	}
	return int64(n), nil
}
