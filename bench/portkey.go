package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// The Portkey gateway (@portkey-ai/gateway, Node) is installed on demand
// with npm ci from bench/portkey: a package.json that depends on the
// gateway and a package-lock.json that pins its dependencies. A plain npm
// install of the gateway takes the newest @hono/node-server, whose
// immutable response headers make the gateway answer 500 to every request
// (Portkey-AI/gateway#1389). The lockfile keeps @hono/node-server at
// 1.13.5, the version the gateway's repository patches
// (patches/@hono+node-server+1.13.5.patch, applied to what its own
// lockfile installs), and resolves the rest as npm did at the gateway's
// release (npm install --before 2026-08-23).
// The installation is kept in the user's cache directory under a name
// made of the hash of those files, so that it is made once and remade
// when they change.
//
// The gateway routes by headers: x-portkey-provider: openai and
// x-portkey-custom-host: http://<mock>/v1 send each request to the mock
// upstream, and x-portkey-forward-headers passes the mock's X-Mock-*
// headers through (Portkey forwards none of a client's headers but those
// it knows otherwise). The load generator adds them on this peer's
// requests only. The gateway listens on every interface; loopback.cjs,
// preloaded with node -r, binds it to 127.0.0.1.

// portkeyDir is where the Portkey files live, relative to the repository's
// root.
const portkeyDir = "bench/portkey"

// portkeyFiles are the files of portkeyDir that make an installation.
var portkeyFiles = []string{"package.json", "package-lock.json", "loopback.cjs"}

// portkeyMain is the gateway's entry point inside an installation.
const portkeyMain = "node_modules/@portkey-ai/gateway/build/start-server.js"

// installPortkey installs the gateway from root's bench/portkey into the
// cache (unless it is there already) and returns the installation's
// directory. It says on logf when it installs; npm's output goes to log.
func installPortkey(root string, logf func(format string, args ...any), log io.Writer) (string, error) {
	src := filepath.Join(root, portkeyDir)
	h := sha256.New()
	files := map[string][]byte{}
	for _, f := range portkeyFiles {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", err
		}
		files[f] = b
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "ssegate-bench", "portkey-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(filepath.Join(dir, portkeyMain)); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	// Install beside the final directory and rename it into place, so that
	// an interrupted install leaves nothing that looks whole.
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	logf("installing the Portkey gateway from %s into %s (npm ci)", src, dir)
	for f, b := range files {
		if err := os.WriteFile(filepath.Join(tmp, f), b, 0o644); err != nil {
			return "", err
		}
	}
	// No install scripts: the only one is the gateway's patch-package,
	// which finds no patches in the published package.
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error")
	cmd.Dir, cmd.Stdout, cmd.Stderr = tmp, log, log
	cmd.Env = append(os.Environ(), "npm_config_update_notifier=false")
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("npm ci in %s: %w", tmp, err)
	}
	if _, err := os.Stat(filepath.Join(tmp, portkeyMain)); err != nil {
		return "", fmt.Errorf("npm ci installed no gateway: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another run may have installed it meanwhile.
		if _, serr := os.Stat(filepath.Join(dir, portkeyMain)); serr != nil {
			return "", err
		}
	}
	return dir, nil
}

// portkeyCmd is the command of the gateway installed in dir, listening on
// addr (its port; loopback.cjs makes the host 127.0.0.1).
func portkeyCmd(dir, addr string) (*exec.Cmd, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if host != "127.0.0.1" {
		return nil, fmt.Errorf("portkey listens on 127.0.0.1 only, not %s", host)
	}
	if _, err := strconv.Atoi(port); err != nil {
		return nil, fmt.Errorf("port %q: %w", port, err)
	}
	cmd := exec.Command("node", "-r", filepath.Join(dir, "loopback.cjs"), filepath.Join(dir, portkeyMain),
		"--port="+port, "--headless")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	return cmd, nil
}

// portkeyHeaders are the header lines (CRLF-terminated) that route a
// request through the gateway to the mock upstream at mockAddr.
func portkeyHeaders(mockAddr string) string {
	return "x-portkey-provider: openai\r\n" +
		"x-portkey-custom-host: http://" + mockAddr + "/v1\r\n" +
		"x-portkey-forward-headers: x-mock-tokens,x-mock-delay\r\n"
}

// haveNode reports whether node and npm are on PATH.
func haveNode() error {
	for _, b := range []string{"node", "npm"} {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Errorf("%s is not on PATH", b)
		}
	}
	return nil
}

// portkeyVersion returns the installed gateway's version and Node's, or
// "" when dir is empty.
func portkeyVersion(dir string) string {
	if dir == "" {
		return ""
	}
	var pkg struct{ Version string }
	b, err := os.ReadFile(filepath.Join(dir, "node_modules/@portkey-ai/gateway/package.json"))
	if err == nil {
		err = json.Unmarshal(b, &pkg)
	}
	if err != nil || pkg.Version == "" {
		return ""
	}
	v := pkg.Version
	if out, err := exec.Command("node", "--version").Output(); err == nil {
		v += " (Node " + strings.TrimSpace(string(out)) + ")"
	}
	return v
}
