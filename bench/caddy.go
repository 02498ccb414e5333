package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Caddy is built from its Go module (bench/caddy, a module of its own, so
// that ssegate's go.mod does not carry Caddy's dependencies) into the
// run's temporary directory, and started per measurement with a generated
// JSON configuration: the reverse proxy alone, flushing every write
// (flush_interval -1), keep-alive to the upstream, no admin endpoint, no
// automatic HTTPS, no access log, errors only in its log. Debian's caddy
// package (2.6.2) is not used: it truncates streams under load.

// caddyModuleDir is where the Caddy build lives, relative to the
// repository's root.
const caddyModuleDir = "bench/caddy"

// caddyConfig returns the JSON configuration of Caddy listening on listen
// and proxying to upstream (host:port).
func caddyConfig(listen, upstream string) ([]byte, error) {
	proxy := map[string]any{
		"handler":        "reverse_proxy",
		"upstreams":      []map[string]any{{"dial": upstream}},
		"flush_interval": -1,
		"transport": map[string]any{
			"protocol": "http",
			"keep_alive": map[string]any{
				"enabled":                 true,
				"max_idle_conns_per_host": 1024,
			},
		},
	}
	conf := map[string]any{
		"admin": map[string]any{"disabled": true},
		"logging": map[string]any{
			"logs": map[string]any{"default": map[string]any{"level": "ERROR"}},
		},
		"apps": map[string]any{
			"http": map[string]any{
				"servers": map[string]any{
					"bench": map[string]any{
						"listen":          []string{listen},
						"automatic_https": map[string]any{"disable": true},
						"routes":          []map[string]any{{"handle": []any{proxy}}},
					},
				},
			},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// writeCaddyConf writes Caddy's configuration into dir and returns its
// path.
func writeCaddyConf(dir, listen, upstream string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	b, err := caddyConfig(listen, upstream)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "caddy.json")
	return path, os.WriteFile(path, append(b, '\n'), 0o644)
}

// caddyCmd is the command of Caddy with the configuration conf; its data
// and configuration directories are dir, so that it writes nothing
// outside the run's temporary directory.
func caddyCmd(bin, conf, dir string) *exec.Cmd {
	cmd := exec.Command(bin, "run", "--config", conf)
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	return cmd
}

// buildCaddy builds Caddy from root's bench/caddy module into out; the
// module proxy serves its dependencies on the first build.
func buildCaddy(root, out string, log io.Writer) error {
	cmd := exec.Command("go", "build", "-C", filepath.Join(root, caddyModuleDir), "-trimpath", "-o", out, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build -C %s: %w", caddyModuleDir, err)
	}
	return nil
}

// caddyVersion returns Caddy's version (the first field of caddy version),
// or "" when bin is empty.
func caddyVersion(bin string) string {
	if bin == "" {
		return ""
	}
	out, _ := exec.Command(bin, "version").Output()
	v, _, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	return v
}
