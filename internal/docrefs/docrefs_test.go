package docrefs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// pages returns the pages held to the tree: README.md and docs/*.md, by
// their path from the root.
func pages(t *testing.T) map[string]string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range append(names, filepath.Join(root, "README.md")) {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, n)
		out[filepath.ToSlash(rel)] = string(b)
	}
	return out
}

// goFiles returns the non-test Go files of the module's packages by
// directory (from the root): nested modules, testdata and hidden
// directories are not the module's.
func goFiles(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") {
			out[path.Dir(rel)] = append(out[path.Dir(rel)], path.Base(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLayoutMap: the layout map of docs/design.md names every non-test Go
// file of every package under its directory, and nothing that is not one.
func TestLayoutMap(t *testing.T) {
	md := pages(t)["docs/design.md"]
	_, layout, ok := strings.Cut(md, "\n## Package layout\n")
	if !ok {
		t.Fatal("docs/design.md has no section Package layout")
	}
	listed := map[string]bool{} // dir/file
	for _, r := range Layout(layout) {
		if fi, err := os.Stat(filepath.Join(root, r.Dir)); err != nil || !fi.IsDir() {
			t.Errorf("docs/design.md, Package layout: %s is no directory", r.Dir)
			continue
		}
		for _, f := range r.Files {
			matches, _ := filepath.Glob(filepath.Join(root, r.Dir, f))
			if len(matches) == 0 {
				t.Errorf("docs/design.md, Package layout: %s/%s is no file", r.Dir, f)
			}
			for _, m := range matches {
				listed[r.Dir+"/"+filepath.Base(m)] = true
			}
		}
	}
	for dir, files := range goFiles(t) {
		for _, f := range files {
			if !listed[dir+"/"+f] {
				t.Errorf("docs/design.md, Package layout: %s/%s is not in the map (a row for %s, or a row of its own)", dir, f, dir)
			}
		}
	}
}

// TestNamedFilesExist: every file a page names as a path from the root
// (a code span such as proxy/causes.go) exists, and every link to a file
// of the repository leads to one, and to an anchor it has.
func TestNamedFilesExist(t *testing.T) {
	ps := pages(t)
	tops := map[string]bool{}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if e.IsDir() {
			tops[e.Name()] = true
		}
	}
	for name, md := range ps {
		for _, s := range CodeSpans(md) {
			top, _, _ := strings.Cut(s, "/")
			if strings.ContainsAny(s, " {}<>$=:") || !strings.Contains(s, "/") || !tops[top] {
				continue
			}
			p := strings.TrimSuffix(s, "/")
			if slices.ContainsFunc(generated, func(g string) bool { return p == g || strings.HasPrefix(p, g+"/") }) {
				continue
			}
			if m, _ := filepath.Glob(filepath.Join(root, p)); len(m) == 0 {
				t.Errorf("%s names %s, which is not in the tree", name, s)
			}
		}
		for _, l := range Links(md) {
			if strings.Contains(l, "://") || strings.HasPrefix(l, "mailto:") {
				continue
			}
			target, anchor, _ := strings.Cut(l, "#")
			file := name
			if target != "" {
				file = path.Join(path.Dir(name), target)
				if _, err := os.Stat(filepath.Join(root, file)); err != nil {
					t.Errorf("%s links to %s, which is not in the tree", name, l)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(root, file))
			if err != nil {
				t.Fatal(err)
			}
			if !Anchors(string(b))[anchor] {
				t.Errorf("%s links to %s, which has no heading #%s", name, file, anchor)
			}
		}
	}
}

// TestFuzzNames: every fuzz target a page names exists, and
// docs/development.md lists every one there is.
func TestFuzzNames(t *testing.T) {
	var targets []string
	for dir := range goFiles(t) {
		tests, _ := filepath.Glob(filepath.Join(root, dir, "*_test.go"))
		for _, f := range tests {
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range file.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Fuzz") {
					targets = append(targets, fd.Name.Name)
				}
			}
		}
	}
	if len(targets) == 0 {
		t.Fatal("no fuzz target found")
	}
	ps := pages(t)
	for name, md := range ps {
		for _, n := range FuzzNames(md) {
			if !slices.Contains(targets, n) {
				t.Errorf("%s names %s, which is no fuzz target", name, n)
			}
		}
	}
	listed := FuzzNames(ps["docs/development.md"])
	for _, n := range targets {
		if !slices.Contains(listed, n) {
			t.Errorf("docs/development.md does not list the fuzz target %s", n)
		}
	}
}

// others are flags the pages name that are not ssegate's: go test's,
// the bench's and the tools' in their examples.
var others = []string{
	"race", "run", "count", "timeout", "fuzz", "fuzztime", "parallel", "list", "v", "bench", "benchtime", "cpu", "short",
	"quick", "scenarios", "baseline", "profile", "peers", "duration",
	"soak", "soak-streams", "soak-duration", "soak-events", "soak-pace", "soak-keyed", "soak-resume", "soak-settle",
	"redis-load", "redis-join",
	"faults", "i", "n", "m", "s", "h", "e", "ldflags", "name",
}

// generated are the directories of what builds and runs write, which a
// page may name although a clean tree has none.
var generated = []string{"bin", "bench/results"}

// TestFlagNames: every flag a page names in a code span is a row of
// docs/flags.md (which cmd/ssegate's TestFlagsDoc holds to the flags
// themselves), or one of another program's.
func TestFlagNames(t *testing.T) {
	ps := pages(t)
	rows := map[string]bool{}
	for line := range strings.Lines(ps["docs/flags.md"]) {
		if rest, ok := strings.CutPrefix(line, "| `-"); ok {
			name, _, _ := strings.Cut(rest, "`")
			rows[name] = true
		}
	}
	if len(rows) < 50 {
		t.Fatalf("docs/flags.md: %d rows read; want the whole table", len(rows))
	}
	for name, md := range ps {
		for _, f := range Flags(md) {
			if !rows[f] && !slices.Contains(others, f) {
				t.Errorf("%s names -%s, which is not in docs/flags.md", name, f)
			}
		}
	}
}
