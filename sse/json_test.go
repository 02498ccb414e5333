package sse

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// FuzzWalker checks the JSON walker against gjson on valid objects, in
// both of its walks, that a strict walk that succeeds is also what the
// lenient one reads, and that it never panics on anything.
func FuzzWalker(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"b":"x\"y","c":{"d":[1,{"e":"]"}]},"f":null}`, `{"k\u0065y":true}`, `[1,2]`, `{"a":`, `{"a":"\\"}`, ` { "a" : [ ] , "b" : -1.5e3 } `, `{"a":1,}`, `{"a":[1,],"b":tru}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		walkAll := func(strict bool) (got []string, closed bool) {
			w := walk(s, 0, '{', strict)
			for w.next() {
				v := w.value()
				if strict && !delimited(v) {
					return got, false
				}
				got = append(got, w.name(), v)
				for a := walk(v, 0, '[', strict); a.next(); {
					a.value()
				}
			}
			return got, w.closed()
		}
		lenient, lenientClosed := walkAll(false)
		strict, strictClosed := walkAll(true)
		if strictClosed && (!lenientClosed || strings.Join(strict, "\x00") != strings.Join(lenient, "\x00")) {
			t.Fatalf("lenient: got %q, closed %v; want %q, closed (the strict walk's)", lenient, lenientClosed, strict)
		}
		if !gjson.Valid(s) || !gjson.Parse(s).IsObject() {
			return
		}
		var want []string
		gjson.Parse(s).ForEach(func(k, v gjson.Result) bool {
			want = append(want, k.Str, v.Raw)
			return true
		})
		for _, got := range [][]string{lenient, strict} {
			if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
				t.Fatalf("got %q; want %q", got, want)
			}
		}
		if !lenientClosed || !strictClosed {
			t.Fatalf("closed: got %v (lenient), %v (strict); want true", lenientClosed, strictClosed)
		}
	})
}

// TestWalker holds where the strict and the lenient walks part: a comma
// before the closing bracket, and what follows the object.
func TestWalker(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in              string
		lenient, strict bool // closed
		names           string
	}{
		{`{}`, true, true, ""},
		{` { "a" : 1 , "b\u0063" : [1,] } `, true, true, "a bc"},
		{`{"a":1,}`, true, false, "a"},
		{`{"a":1,,"b":2}`, false, false, "a"},
		{`{"a":1}x`, false, false, "a"},
		{`{"a":1 "b":2}`, false, false, "a"},
		{`{"a":1`, false, false, "a"},
		{`{"a"`, false, false, ""},
		{`{"a":}`, true, true, "a"}, // the value is cut empty, which ParseRequest's delimited refuses
		{`[{"a":1}]`, false, false, ""},
		{``, false, false, ""},
	} {
		for _, strict := range []bool{false, true} {
			w := walk(tt.in, 0, '{', strict)
			var names []string
			for w.next() {
				names = append(names, w.name())
				w.value()
			}
			want := tt.lenient
			if strict {
				want = tt.strict
			}
			if got := w.closed(); got != want || strings.Join(names, " ") != tt.names {
				t.Errorf("%q (strict %v): got closed %v, members %q; want %v, %q", tt.in, strict, got, names, want, tt.names)
			}
		}
	}
}
