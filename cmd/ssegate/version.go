package main

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// errVersion is what parseFlags returns for -version: main prints
// versionText and exits 0.
var errVersion = errors.New("version requested")

// version is the release's version, set with -ldflags "-X main.version=…"
// by a build that has no module version of its own (a go build from a
// checkout without VCS stamping); the build info's module version wins
// when it has one (go install …@v1.2.3, or a build in a git checkout).
var version string

// commit is the commit the release was built from, set with -ldflags
// "-X main.commit=…" by the Makefile for a build whose build info has no
// VCS stamp (a git worktree, or GOFLAGS=-buildvcs=false).
var commit string

// modified is "true" when that commit's tree had uncommitted changes, set
// with commit.
var modified string

// versionText describes this build from its build info: the module
// version, the commit it was built from and whether the tree had changes,
// the commit's time, and the Go version and platform.
func versionText() string {
	bi, _ := debug.ReadBuildInfo()
	return formatVersion(bi, version, commit, modified)
}

func formatVersion(bi *debug.BuildInfo, ldVersion, ldCommit, ldModified string) string {
	v := ""
	settings := map[string]string{}
	goVersion := runtime.Version()
	if bi != nil {
		v = bi.Main.Version
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
		if bi.GoVersion != "" {
			goVersion = bi.GoVersion
		}
	}
	if v == "" || v == "(devel)" {
		v = ldVersion
	}
	if v == "" {
		v = "(devel)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ssegate %s\n", v)
	if rev := settings["vcs.revision"]; rev != "" {
		fmt.Fprintf(&b, "commit   %s\n", rev)
		modified := settings["vcs.modified"]
		if modified == "" {
			modified = "false"
		}
		fmt.Fprintf(&b, "modified %s\n", modified)
		if t := settings["vcs.time"]; t != "" {
			fmt.Fprintf(&b, "time     %s\n", t)
		}
	} else if ldCommit != "" {
		fmt.Fprintf(&b, "commit   %s\n", ldCommit)
		if ldModified != "" {
			fmt.Fprintf(&b, "modified %s\n", ldModified)
		}
	} else {
		fmt.Fprintf(&b, "commit   unknown\n")
	}
	fmt.Fprintf(&b, "go       %s %s/%s\n", goVersion, runtime.GOOS, runtime.GOARCH)
	return b.String()
}
