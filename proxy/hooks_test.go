package proxy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestHooksComplete: every hook is set in each listener's hooks and in
// their composition, so that a call site never calls a nil func, and a
// hook added to the struct and left out of nopHooks or compose fails here
// rather than in a request.
func TestHooksComplete(t *testing.T) {
	t.Parallel()
	p := &Proxy{}
	p.m = newMetrics(p)
	for name, h := range map[string]hooks{
		"nop":     nopHooks(),
		"metrics": p.m.hooks(),
		"trace":   p.traceHooks(),
		"both":    compose(p.m.hooks(), p.traceHooks()),
	} {
		v := reflect.ValueOf(h)
		for i := range v.NumField() {
			if v.Field(i).IsNil() {
				t.Errorf("%s: hook %s is nil; want it set", name, v.Type().Field(i).Name)
			}
		}
	}
}

// TestTelemetryThroughHooks: outside the listeners (metrics.go, genai.go,
// trace.go) and hooks.go, no file of the package counts a metric or
// touches a span itself: it calls a hook.
func TestTelemetryThroughHooks(t *testing.T) {
	t.Parallel()
	listeners := map[string]bool{"metrics.go": true, "genai.go": true, "trace.go": true, "hooks.go": true}
	fields := map[string]bool{}
	mt := reflect.TypeFor[metrics]()
	for i := range mt.NumField() {
		fields[mt.Field(i).Name] = true
	}
	delete(fields, "genAI") // genAI.op names a generation's labels, which its spans share
	spans := map[string]bool{"traceDecision": true, "traceAnswer": true, "traceFrom": true, "startCall": true,
		"sawEvent": true, "callUsage": true, "firstOutput": true, "endSettled": true, "endCall": true, "startRequest": true, "endRequest": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || listeners[name] {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.SelectorExpr); ok && x.Sel.Name == "m" && fields[sel.Sel.Name] {
				t.Errorf("%v: .m.%s counted outside the metrics; want a hook", fset.Position(sel.Pos()), sel.Sel.Name)
			}
			if spans[sel.Sel.Name] {
				if _, isHook := sel.X.(*ast.SelectorExpr); !isHook || sel.X.(*ast.SelectorExpr).Sel.Name != "hooks" {
					t.Errorf("%v: %s called outside the spans; want a hook", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}
