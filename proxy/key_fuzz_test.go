package proxy

import (
	"net/url"
	"testing"

	"github.com/valyala/fasthttp"
)

// FuzzKey: validKey accepts exactly 1–255 visible ASCII bytes but "." and
// "..", and a valid key path-escaped into /streams/{key} comes back
// unchanged.
func FuzzKey(f *testing.F) {
	for _, s := range []string{"k", "a/b?c", "%zz", "é", "with space", "", "x\x00y", "../../etc", ".", ".."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := validKey(key)
		want := len(key) >= 1 && len(key) <= 255 && key != "." && key != ".."
		for i := 0; i < len(key); i++ {
			if key[i] < 0x21 || key[i] > 0x7e {
				want = false
			}
		}
		if (err == nil) != want {
			t.Fatalf("validKey(%q): got err %v; want valid=%v", key, err, want)
		}
		if !want {
			return
		}
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI("/streams/" + url.PathEscape(key))
		got, err := keyFromPath(&ctx, "/streams/")
		if err != nil || got != key {
			t.Fatalf("keyFromPath(escape(%q)): got %q, %v; want the key back", key, got, err)
		}
	})
}
