package sse

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// FuzzMembers checks the hot-path JSON walker against gjson on valid
// objects, and that it never panics on anything.
func FuzzMembers(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"b":"x\"y","c":{"d":[1,{"e":"]"}]},"f":null}`, `{"k\u0065y":true}`, `[1,2]`, `{"a":`, `{"a":"\\"}`, ` { "a" : [ ] , "b" : -1.5e3 } `} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var got []string
		members(s, func(k, v string) {
			got = append(got, k, v)
			elements(v, func(string) {})
		})
		if !gjson.Valid(s) || !gjson.Parse(s).IsObject() {
			return
		}
		var want []string
		gjson.Parse(s).ForEach(func(k, v gjson.Result) bool {
			want = append(want, k.Str, v.Raw)
			return true
		})
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
			t.Fatalf("got %q; want %q", got, want)
		}
	})
}
