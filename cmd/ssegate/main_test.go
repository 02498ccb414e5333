package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
)

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

// TestFlagsFromEnv: every flag reads SSEGATE_<NAME>; the command line wins.
func TestFlagsFromEnv(t *testing.T) {
	o, err := parseFlags([]string{"-heartbeat", "3s"}, env(map[string]string{
		"SSEGATE_UPSTREAM":       "http://a.example,http://b.example",
		"SSEGATE_MAX_BODY":       "1024",
		"SSEGATE_HEARTBEAT":      "9s",
		"SSEGATE_RETRY_ATTEMPTS": "5",
		"SSEGATE_KEY_HEADER":     "webhook-id",
	}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if got := o.upstreams.String(); got != "http://a.example,http://b.example" {
		t.Errorf("upstreams: got %q; want both from SSEGATE_UPSTREAM", got)
	}
	if o.maxBody != 1024 || o.retry.Attempts != 5 || o.keyHeaders.String() != "webhook-id" {
		t.Errorf("got max-body %d, retry-attempts %d, key-header %q; want 1024, 5, webhook-id", o.maxBody, o.retry.Attempts, o.keyHeaders.String())
	}
	if o.heartbeat != 3*time.Second {
		t.Errorf("heartbeat: got %v; want the command line's 3s over the environment's 9s", o.heartbeat)
	}
}

// TestGCSettings: -gc-percent applies by default (50), gives way to a
// GOGC environment variable, and wins when given.
func TestGCSettings(t *testing.T) {
	cases := []struct {
		args  []string
		env   map[string]string
		set   bool
		value int
	}{
		{nil, nil, true, 50},
		{nil, map[string]string{"GOGC": "200"}, false, 50},
		{[]string{"-gc-percent", "80"}, map[string]string{"GOGC": "200"}, true, 80},
		{nil, map[string]string{"GOGC": "200", "SSEGATE_GC_PERCENT": "30"}, true, 30},
		{[]string{"-gc-percent", "-1"}, nil, true, -1},
	}
	for _, c := range cases {
		o, err := parseFlags(append([]string{"-upstream", "mock"}, c.args...), env(c.env), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if o.setGC != c.set || o.gcPercent != c.value {
			t.Errorf("%v %v: set %v, %d; want %v, %d", c.args, c.env, o.setGC, o.gcPercent, c.set, c.value)
		}
	}
}

// TestTimeBudgetDefaults: no silent upstream holds a client for minutes
// by default: a stream's head within 30s, a silence within 2m; only a
// non-streaming answer, which comes when done, may take 10m.
func TestTimeBudgetDefaults(t *testing.T) {
	o, err := parseFlags([]string{"-upstream", "mock"}, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.headTimeout != 30*time.Second || o.idleTimeout != 2*time.Minute || o.retry.AttemptTimeout != 10*time.Minute {
		t.Errorf("got -head-timeout %v, -upstream-idle-timeout %v, -attempt-timeout %v; want 30s, 2m, 10m", o.headTimeout, o.idleTimeout, o.retry.AttemptTimeout)
	}
	o, err = parseFlags([]string{"-upstream", "mock"}, env(map[string]string{"SSEGATE_HEAD_TIMEOUT": "5s"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.headTimeout != 5*time.Second {
		t.Errorf("-head-timeout: got %v; want SSEGATE_HEAD_TIMEOUT's 5s", o.headTimeout)
	}
}

// TestBadValues: a bad value stops start-up with one line naming the flag.
func TestBadValues(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-upstream", "mock", "-max-body", "abc"}, nil, "-max-body"},
		{[]string{"-upstream", "mock"}, map[string]string{"SSEGATE_MAX_BODY": "x"}, "SSEGATE_MAX_BODY (-max-body)"},
		{[]string{"-upstream", "mock", "-missing-body", "lose"}, nil, "-missing-body"},
		{[]string{"-upstream", "mock", "-redis-down", "ignore"}, nil, "-redis-down"},
		{[]string{"-upstream", "mock", "-redis-abandon-max", "0"}, nil, "-redis-abandon-max"},
		{[]string{"-upstream", "mock", "-anonymous-keys", "maybe"}, nil, "-anonymous-keys"},
		{[]string{"-upstream", "mock", "-secret", "short"}, nil, "-secret"},
		{[]string{"-upstream", "mock", "-retry-attempts", "0"}, nil, "-retry-attempts"},
		{[]string{"-upstream", "mock", "-breaker-models", "0"}, nil, "-breaker-models"},
		{[]string{"-upstream", "mock", "-breaker-open-max", "100ms"}, nil, "-breaker-open-max"},
		{[]string{"-upstream", "mock", "-gc-percent", "-2"}, nil, "-gc-percent"},
		{[]string{"-upstream", "mock", "-memory-limit", "-5"}, nil, "-memory-limit"},
		{[]string{"-upstream", "mock", "-seal-stream-bytes", "0"}, nil, "-seal-stream-bytes"},
		{[]string{"-upstream", "mock", "-seal-age", "0s"}, nil, "-seal-age"},
		{[]string{"-upstream", "mock", "-ambiguous-status", "404"}, nil, "-ambiguous-status"},
		{[]string{"-upstream", "mock"}, map[string]string{"SSEGATE_AMBIGUOUS_STATUS": "50x"}, "-ambiguous-status"},
		{[]string{"-upstream", "mock", "-seal-live-bytes", "-1"}, nil, "-seal-live-bytes"},
		{[]string{"-upstream", "mock", "-max-live-bytes", "4194304", "-seal-live-bytes", "8388608"}, nil, "-seal-live-bytes"},
		{nil, nil, "-upstream is required"},
	}
	for _, c := range cases {
		var out bytes.Buffer
		_, err := parseFlags(c.args, env(c.env), &out)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v %v: got %v; want one line naming %s", c.args, c.env, err, c.want)
		}
		if out.Len() != 0 {
			t.Errorf("%v: printed %q; want nothing but the error", c.args, out.String())
		}
	}
}

// TestHelp: -h documents every flag with its default.
func TestHelp(t *testing.T) {
	var out bytes.Buffer
	_, err := parseFlags([]string{"-h"}, env(nil), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("got %v; want flag.ErrHelp", err)
	}
	for _, name := range []string{"-listen", "-upstream", "-max-body", "-secret", "-tenant-header", "-anonymous-keys", "-retry-budget", "-redis", "-admin-listen", "-key-header", "-shutdown-timeout", "-breaker-open-max", "-breaker-models", "-head-timeout"} {
		if !strings.Contains(out.String(), "  "+name+" ") && !strings.Contains(out.String(), "  "+name+"\n") {
			t.Errorf("-h does not document %s", name)
		}
	}
	if !strings.Contains(out.String(), "(default 33554432)") || !strings.Contains(out.String(), "SSEGATE_") {
		t.Errorf("-h lacks defaults or the environment note:\n%s", out.String())
	}
}

// TestFlagsDoc: docs/flags.md has a row for every flag and none for
// another, and its default column says what the flag's default is (the
// first code span of the cell; a flag without a default, a cell without
// one). The flags' defaults are the one table; the doc is held to it.
func TestFlagsDoc(t *testing.T) {
	doc, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{} // flag → its default cell
	for line := range strings.Lines(string(doc)) {
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`-") {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`-")
		if _, dup := rows[name]; dup {
			t.Errorf("docs/flags.md: two rows for -%s", name)
		}
		rows[name] = strings.TrimSpace(cells[2])
	}
	fs := flagSet(&options{})
	fs.VisitAll(func(f *flag.Flag) {
		cell, ok := rows[f.Name]
		delete(rows, f.Name)
		if !ok {
			t.Errorf("docs/flags.md: no row for -%s", f.Name)
			return
		}
		got, _, hasCode := strings.Cut(strings.TrimPrefix(cell, "`"), "`")
		if !strings.HasPrefix(cell, "`") {
			got, hasCode = "", false
		}
		want := f.DefValue
		if d, err := time.ParseDuration(want); err == nil && hasCode {
			if gd, err := time.ParseDuration(got); err == nil && gd == d {
				got = want
			}
		}
		if got != want {
			t.Errorf("docs/flags.md, -%s: default %q; want %q (the flag's)", f.Name, cell, want)
		}
	})
	for name := range rows {
		t.Errorf("docs/flags.md: a row for -%s, which is no flag", name)
	}
}

// TestTenantFlags: -tenant-header, -anonymous-keys and -secret, from the
// command line or SSEGATE_<NAME>.
func TestTenantFlags(t *testing.T) {
	o, err := parseFlags([]string{"-upstream", "mock", "-tenant-header", "X-User-Id"}, env(map[string]string{
		"SSEGATE_TENANT_HEADER":  "X-Org-Id",
		"SSEGATE_ANONYMOUS_KEYS": "deny",
		"SSEGATE_SECRET":         "0123456789abcdef0123",
	}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.tenantHeaders.String() != "X-Org-Id,X-User-Id" || o.anonymousKeys != "deny" || o.secret != "0123456789abcdef0123" {
		t.Errorf("got -tenant-header %q, -anonymous-keys %q, -secret %q; want X-Org-Id,X-User-Id, deny and SSEGATE_SECRET's", o.tenantHeaders.String(), o.anonymousKeys, o.secret)
	}
	o, err = parseFlags([]string{"-upstream", "mock"}, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.anonymousKeys != "allow" || o.secret != "" {
		t.Errorf("defaults: got -anonymous-keys %q, -secret %q; want allow and none", o.anonymousKeys, o.secret)
	}
}

// TestStartupLogHidesCredentials: the start-up log names the upstreams
// without a password or query, and never the secret.
func TestStartupLogHidesCredentials(t *testing.T) {
	logs := startupLog(t, []string{"-listen", "127.0.0.1:0", "-upstream", "http://user:pw-XYZ@127.0.0.1:1/v1?key=q-XYZ",
		"-log-level", "debug"}, env(map[string]string{"SSEGATE_SECRET": "secret-XYZ-0123456789"}))
	if !strings.Contains(logs.String(), "127.0.0.1:1") {
		t.Fatalf("the log does not name the upstream:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "XYZ") {
		t.Fatalf("the log carries a credential:\n%s", logs.String())
	}
}

// startRun runs ssegate with args until it listens, and returns the
// address it bound, what it logs, and stop, which ends the run and
// returns its error. The test fails if run ends before it listens.
func startRun(t *testing.T, args []string, getenv func(string) string) (addr string, logs *gatetest.LogBuffer, stop func() error) {
	t.Helper()
	logs = &gatetest.LogBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, getenv, logs, ready) }()
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	return addr, logs, func() error { cancel(); return <-done }
}

// startupLog runs ssegate with args until it listens, stops it, and
// returns what it logged.
func startupLog(t *testing.T, args []string, getenv func(string) string) *gatetest.LogBuffer {
	t.Helper()
	_, logs, stop := startRun(t, args, getenv)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	return logs
}

// TestStartupLogMemoryLimit: the start-up log says "none" when no memory
// limit is set, not the runtime's math.MaxInt64, and the bytes of one
// -memory-limit sets.
func TestStartupLogMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(math.MaxInt64) // as with no GOMEMLIMIT
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	cgroupRoot = t.TempDir() // no cgroup, whatever this machine's
	t.Cleanup(func() { cgroupRoot = "/" })
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, `"memory_limit":"none"`},
		{[]string{"-memory-limit", "1073741824"}, `"memory_limit":1073741824`},
	} {
		logs := startupLog(t, append([]string{"-listen", "127.0.0.1:0", "-upstream", "mock"}, c.args...), env(nil))
		if !strings.Contains(logs.String(), c.want) {
			t.Errorf("%v: the start-up log lacks %s:\n%s", c.args, c.want, logs.String())
		}
	}
}

// TestFallbackFlag: SSEGATE_FALLBACK's rules separated by semicolons, the
// command line's -fallback besides them (and over them for the same
// model), -fallback-on-code, and the errors of a rule without its parts.
func TestFallbackFlag(t *testing.T) {
	o, err := parseFlags([]string{"-upstream", "mock", "-fallback", "gpt-4o=gpt-4.1", "-fallback", "*=gpt-4o-mini", "-fallback-on-code", "context_length_exceeded,string_above_max_length"},
		env(map[string]string{"SSEGATE_FALLBACK": "gpt-4o=gpt-4o-mini ; claude-opus-4=claude-sonnet-4,claude-haiku-4"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := o.fallbacks.String(), "*=gpt-4o-mini;claude-opus-4=claude-sonnet-4,claude-haiku-4;gpt-4o=gpt-4.1"; got != want {
		t.Errorf("rules: got %q; want %q", got, want)
	}
	if got := o.fallbackCodes.String(); got != "context_length_exceeded,string_above_max_length" {
		t.Errorf("codes: got %q", got)
	}
	for _, bad := range []string{"gpt-4o", "=gpt-4o-mini", "gpt-4o=", "gpt-4o= , "} {
		if _, err := parseFlags([]string{"-upstream", "mock", "-fallback", bad}, env(nil), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "-fallback") {
			t.Errorf("-fallback %q: got %v; want an error naming -fallback", bad, err)
		}
	}
}

// TestListenFile: with -listen 127.0.0.1:0, -listen-file holds the
// address the process bound once it serves, and is gone after it exits.
func TestListenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "listen")
	addr, _, stop := startRun(t, []string{"-listen", "127.0.0.1:0", "-listen-file", path, "-upstream", "mock"}, env(nil))
	b, err := os.ReadFile(path)
	if err != nil || string(b) != addr+"\n" || strings.HasSuffix(addr, ":0") {
		t.Fatalf("-listen-file: got %q, %v; want the bound address %q and a newline", b, err, addr)
	}
	resp, err := http.Get("http://" + strings.TrimSpace(string(b)) + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz at the file's address: %v", err)
	}
	resp.Body.Close()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("-listen-file after exit: %v; want it removed", err)
	}
}
