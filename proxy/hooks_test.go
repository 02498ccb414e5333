package proxy

import (
	"reflect"
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
