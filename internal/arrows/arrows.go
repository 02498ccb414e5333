// Command arrows measures how the files of one Go package lean on each
// other: go run ./internal/arrows ./proxy [./cache ...].
//
// An arrow runs from file a to file b (a ≠ b, both non-test files of the
// package) when code in a uses a declaration made in b: a package-level
// const, var, type or func, a method, or a field of a struct type declared
// in b. Several uses make one arrow. Files are those the host's build
// context selects (GOOS and GOARCH choose another).
//
// A back-arrow runs against a layered order of the files. The order is the
// one the greedy feedback-arc-set heuristic of Eades, Lin and Smyth (1993)
// builds: repeatedly, a file no remaining file uses (a source) goes to the
// front and a file that uses no remaining file (a sink) to the back;
// failing both, the file with the largest fan-out minus fan-in among the
// remaining ones goes to the front (ties: the first by name). Users then
// come before what they use, and a back-arrow is one from a later file to
// an earlier one: a file lower in the layers that uses one above it. The
// heuristic keeps such arrows few, so their share is a fair lower estimate
// of how far the package is from layers; a package without cycles has
// none. Two figures that need no order are counted too: the arrows inside
// a cycle of files (in one strongly connected component), and the two-way
// arrows, a → b where b → a as well.
//
// For each file it prints its fan-in (the files that use it), its fan-out
// (the files it uses) and its back-arrows out, in the layered order; then
// the totals; with -list, every arrow.
package main

import (
	"cmp"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	list := flag.Bool("list", false, "list every arrow (from → to, back-arrows marked)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: arrows [-list] DIR...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	for i, dir := range flag.Args() {
		g, err := load(dir)
		if err != nil {
			fmt.Fprintf(os.Stderr, "arrows: %s: %v\n", dir, err)
			os.Exit(1)
		}
		if i > 0 {
			fmt.Println()
		}
		g.report(os.Stdout, dir, *list)
	}
}

// graph holds the files of one package and the arrows between them.
type graph struct {
	files []string                   // base names, sorted
	out   map[string]map[string]bool // file → files it uses
	in    map[string]map[string]bool // file → files that use it
}

// load type-checks the non-test files of the package in dir and returns
// its arrows. Imports are read from the export data go list -export
// builds, so the package's dependencies must build.
func load(dir string) (*graph, error) {
	bp, err := build.ImportDir(dir, 0)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
	exports, err := exportData(dir)
	if err != nil {
		return nil, err
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})}
	pkg, err := conf.Check(bp.ImportPath, fset, files, info)
	if err != nil {
		return nil, err
	}
	g := newGraph(bp.GoFiles)
	for _, f := range files {
		from := filepath.Base(fset.Position(f.Pos()).Filename)
		ast.Inspect(f, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			obj := info.Uses[id]
			if obj == nil || obj.Pkg() != pkg || !declaredAtTop(obj, pkg) {
				return true
			}
			g.add(from, filepath.Base(fset.Position(obj.Pos()).Filename))
			return true
		})
	}
	return g, nil
}

// exportData returns the export data file of every dependency of the
// package in dir, by import path, as go list -export builds them.
func exportData(dir string) (map[string]string, error) {
	cmd := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}", ".")
	cmd.Dir, cmd.Stderr = dir, os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -export: %w", err)
	}
	m := map[string]string{}
	for line := range strings.Lines(string(out)) {
		if path, file, ok := strings.Cut(strings.TrimSpace(line), "\t"); ok && file != "" {
			m[path] = file
		}
	}
	return m, nil
}

// declaredAtTop reports whether obj is part of a package-level
// declaration: in the package scope, or a method or a field (which belong
// to the type they are declared in) rather than a local name.
func declaredAtTop(obj types.Object, pkg *types.Package) bool {
	switch o := obj.(type) {
	case *types.Func:
		return o.Signature().Recv() != nil || o.Parent() == pkg.Scope()
	case *types.Var:
		return o.IsField() || o.Parent() == pkg.Scope()
	default:
		return obj.Parent() == pkg.Scope()
	}
}

func newGraph(files []string) *graph {
	g := &graph{files: slices.Sorted(slices.Values(files)), out: map[string]map[string]bool{}, in: map[string]map[string]bool{}}
	for _, f := range g.files {
		g.out[f], g.in[f] = map[string]bool{}, map[string]bool{}
	}
	return g
}

// add records the arrow from → to, unless they are one file or to is not
// one of the graph's files.
func (g *graph) add(from, to string) {
	if from == to || g.out[to] == nil || g.out[from] == nil {
		return
	}
	g.out[from][to], g.in[to][from] = true, true
}

// arrows is the number of arrows.
func (g *graph) arrows() int {
	n := 0
	for _, f := range g.files {
		n += len(g.out[f])
	}
	return n
}

// order returns the files in the layered order of the Eades–Lin–Smyth
// heuristic (see the package comment).
func (g *graph) order() []string {
	left := map[string]bool{}
	for _, f := range g.files {
		left[f] = true
	}
	deg := func(f string, m map[string]map[string]bool) int {
		n := 0
		for o := range m[f] {
			if left[o] {
				n++
			}
		}
		return n
	}
	var front, back []string
	for len(left) > 0 {
		moved := true
		for moved {
			moved = false
			for _, f := range g.files {
				if left[f] && deg(f, g.out) == 0 {
					back = append(back, f)
					delete(left, f)
					moved = true
				}
			}
			for _, f := range g.files {
				if left[f] && deg(f, g.in) == 0 {
					front = append(front, f)
					delete(left, f)
					moved = true
				}
			}
		}
		best, bestDelta := "", 0
		for _, f := range g.files {
			if !left[f] {
				continue
			}
			if d := deg(f, g.out) - deg(f, g.in); best == "" || d > bestDelta {
				best, bestDelta = f, d
			}
		}
		if best != "" {
			front = append(front, best)
			delete(left, best)
		}
	}
	slices.Reverse(back)
	return append(front, back...)
}

// backArrows returns, for each file, its back-arrows out in the order ord.
func (g *graph) backArrows(ord []string) map[string]int {
	pos := map[string]int{}
	for i, f := range ord {
		pos[f] = i
	}
	n := map[string]int{}
	for _, f := range g.files {
		for t := range g.out[f] {
			if pos[t] < pos[f] {
				n[f]++
			}
		}
	}
	return n
}

// cyclic returns the number of arrows whose two ends lie on one cycle of
// files (in one strongly connected component), by Tarjan's algorithm.
func (g *graph) cyclic() int {
	index, low, comp := map[string]int{}, map[string]int{}, map[string]int{}
	var stack []string
	on := map[string]bool{}
	next, ncomp := 0, 0
	var visit func(f string)
	visit = func(f string) {
		index[f], low[f] = next, next
		next++
		stack = append(stack, f)
		on[f] = true
		for _, t := range slices.Sorted(maps.Keys(g.out[f])) {
			if _, seen := index[t]; !seen {
				visit(t)
				low[f] = min(low[f], low[t])
			} else if on[t] {
				low[f] = min(low[f], index[t])
			}
		}
		if low[f] == index[f] {
			for {
				t := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				on[t] = false
				comp[t] = ncomp
				if t == f {
					break
				}
			}
			ncomp++
		}
	}
	for _, f := range g.files {
		if _, seen := index[f]; !seen {
			visit(f)
		}
	}
	n := 0
	for _, f := range g.files {
		for t := range g.out[f] {
			if comp[t] == comp[f] {
				n++
			}
		}
	}
	return n
}

// twoWay returns the number of arrows a → b where b → a as well.
func (g *graph) twoWay() int {
	n := 0
	for _, f := range g.files {
		for t := range g.out[f] {
			if g.out[t][f] {
				n++
			}
		}
	}
	return n
}

// report writes the table of dir's files and the totals.
func (g *graph) report(w io.Writer, dir string, list bool) {
	ord := g.order()
	back := g.backArrows(ord)
	fmt.Fprintf(w, "%s: %d files, layered order (users first)\n", dir, len(g.files))
	fmt.Fprintf(w, "%-28s %6s %7s %5s\n", "file", "fan-in", "fan-out", "back")
	for _, f := range ord {
		fmt.Fprintf(w, "%-28s %6d %7d %5d\n", f, len(g.in[f]), len(g.out[f]), back[f])
	}
	total, nback := g.arrows(), 0
	for _, n := range back {
		nback += n
	}
	fmt.Fprintf(w, "arrows %d, back-arrows %d (%s), within cycles %d (%s), two-way %d (%s)\n",
		total, nback, percent(nback, total), g.cyclic(), percent(g.cyclic(), total), g.twoWay(), percent(g.twoWay(), total))
	most := slices.SortedFunc(slices.Values(g.files), func(a, b string) int {
		return cmp.Or(cmp.Compare(len(g.in[b]), len(g.in[a])), cmp.Compare(a, b))
	})
	if len(most) > 0 {
		fmt.Fprintf(w, "most used: %s, used by %d files, using %d\n", most[0], len(g.in[most[0]]), len(g.out[most[0]]))
	}
	if !list {
		return
	}
	pos := map[string]int{}
	for i, f := range ord {
		pos[f] = i
	}
	for _, f := range ord {
		for _, t := range slices.Sorted(maps.Keys(g.out[f])) {
			mark := ""
			if pos[t] < pos[f] {
				mark = " (back)"
			}
			fmt.Fprintf(w, "%s → %s%s\n", f, t, mark)
		}
	}
}

func percent(n, of int) string {
	if of == 0 {
		return "0 %"
	}
	return fmt.Sprintf("%.0f %%", 100*float64(n)/float64(of))
}
