package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// What the suite reads of a peer process from /proc: CPU time (utime+stime
// of /proc/<pid>/stat) and memory (VmRSS, VmHWM of /proc/<pid>/status),
// summed over the process and its descendants (nginx's workers).

// clockTick is the length of one clock tick of /proc/<pid>/stat, read from
// the auxiliary vector (AT_CLKTCK); 100 Hz when it cannot be read.
var clockTick = func() time.Duration {
	hz := int64(100)
	if b, err := os.ReadFile("/proc/self/auxv"); err == nil {
		const atClkTck = 17
		for i := 0; i+16 <= len(b); i += 16 {
			k := binary.LittleEndian.Uint64(b[i:])
			v := binary.LittleEndian.Uint64(b[i+8:])
			if k == atClkTck && v > 0 {
				hz = int64(v)
				break
			}
		}
	}
	return time.Second / time.Duration(hz)
}()

// procTree returns pid and its descendants, read from /proc.
func procTree(pid int) []int {
	if pid <= 0 {
		return nil
	}
	parent := map[int][]int{}
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		f := statFields(b)
		if len(f) < 2 {
			continue
		}
		p, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		pp, _ := strconv.Atoi(f[1])
		parent[pp] = append(parent[pp], p)
	}
	tree := []int{pid}
	for i := 0; i < len(tree); i++ {
		tree = append(tree, parent[tree[i]]...)
	}
	return tree
}

// statFields returns the fields of /proc/<pid>/stat after the command name:
// f[0] is the state (field 3), f[11] utime (field 14), f[12] stime (field 15).
func statFields(b []byte) []string {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// cpuTime returns the user+system CPU time of the processes in pids.
func cpuTime(pids []int) (time.Duration, error) {
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, fmt.Errorf("read stat: %w", err)
		}
		f := statFields(b)
		if len(f) < 13 {
			return 0, fmt.Errorf("short /proc/%d/stat", pid)
		}
		u, err1 := strconv.ParseInt(f[11], 10, 64)
		s, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
		}
		ticks += u + s
	}
	return time.Duration(ticks) * clockTick, nil
}

// memory returns the summed VmRSS and VmHWM of the processes in pids, in
// bytes. For several processes the HWM sum is an upper bound of the peak.
func memory(pids []int) (rss, hwm int64, err error) {
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			return 0, 0, fmt.Errorf("read status: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			name, val, ok := strings.Cut(line, ":")
			if !ok || (name != "VmRSS" && name != "VmHWM") {
				continue
			}
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
			if name == "VmRSS" {
				rss += kb << 10
			} else {
				hwm += kb << 10
			}
		}
	}
	return rss, hwm, nil
}
