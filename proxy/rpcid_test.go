package proxy

import (
	"encoding/json"
	"math/big"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// rpcIDCases are pairs of JSON-RPC ids as a caller and a server may write
// them, and whether they are the same id.
var rpcIDCases = []struct {
	a, b string
	same bool
}{
	{`1`, `1`, true},
	{`1`, `1.0`, true},
	{`1`, `1e0`, true},
	{`1`, `1E+0`, true},
	{`1`, `10e-1`, true},
	{`1`, `0.1e1`, true},
	{`1`, `100e-2`, true},
	{`42`, `4.2e1`, true},
	{`-7`, `-7.000`, true},
	{`0`, `-0`, true},
	{`0`, `0.0e99`, true},
	{`0`, `0e-99999999999999999999`, true},
	{`1`, `2`, false},
	{`1`, `-1`, false},
	{`1`, `1.0000000000000000001`, false}, // equal as float64s
	{`12345678901234567890`, `12345678901234567890.0`, true},
	{`12345678901234567890`, `12345678901234567891`, false}, // equal as float64s
	{`9007199254740993`, `9007199254740992`, false},         // equal as float64s
	{`123456789012345678901234567890`, `1.2345678901234567890123456789e29`, true},
	{`1e400`, `10e399`, true},
	{`1e400`, `1e401`, false},
	{`1e99999999999999999999`, `10e99999999999999999998`, true},
	{`1`, `"1"`, false},
	{`"1"`, `1`, false},
	{`"A"`, `"A"`, true},
	{`"A"`, `"\u0041"`, true},
	{`"A"`, `"\u0061"`, false},
	{`"a/b"`, `"a\/b"`, true},
	{`"é"`, `"\u00e9"`, true},
	{`"😀"`, `"\ud83d\ude00"`, true},
	{`"\ud800"`, `"\udbff"`, false}, // both U+FFFD to encoding/json
	{`"\ud800"`, `"\uD800"`, true},
	{`"a\nb"`, `"a\u000ab"`, true},
	{`"ab"`, `"a"`, false},
	{`"abc"`, `"ab\"c"`, false},
	{`null`, `null`, true},
	{`null`, `0`, false},
	{`true`, `1`, false},
	{`1.`, `1`, false},   // not JSON
	{`01`, `1`, false},   // not JSON
	{`"a`, `"a"`, false}, // not JSON
	{``, ``, false},
}

// TestRPCIDSame: JSON-RPC ids are compared as JSON values (sameID, the
// comparison a tool call's answer is recognised by).
func TestRPCIDSame(t *testing.T) {
	t.Parallel()
	for _, c := range rpcIDCases {
		for _, pair := range [][2]string{{c.a, c.b}, {c.b, c.a}} {
			if got := sameID(gjson.Parse(pair[0]), []byte(pair[1])); got != c.same {
				t.Errorf("sameID(%s, %s) = %v; want %v", pair[0], pair[1], got, c.same)
			}
		}
	}
}

// FuzzRPCIDSame checks sameRPCID against the values encoding/json and
// math/big give: numbers by value (with exponents small enough for
// big.Rat), strings by their decoding (without surrogate escapes, which
// encoding/json turns into U+FFFD), never a number for a string; and
// that it is symmetric.
func FuzzRPCIDSame(f *testing.F) {
	for _, c := range rpcIDCases {
		f.Add(c.a, c.b)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		got := sameRPCID(a, b)
		if got != sameRPCID(b, a) {
			t.Fatalf("sameRPCID(%q, %q) = %v, not symmetric", a, b, got)
		}
		if !json.Valid([]byte(a)) || !json.Valid([]byte(b)) {
			return
		}
		ta, tb := strings.TrimSpace(a), strings.TrimSpace(b)
		switch {
		case numberStart(ta[0]) && numberStart(tb[0]):
			if bigExponent(ta) || bigExponent(tb) {
				return
			}
			ra, okA := new(big.Rat).SetString(ta)
			rb, okB := new(big.Rat).SetString(tb)
			if !okA || !okB {
				t.Fatalf("big.Rat cannot read %q or %q", ta, tb)
			}
			if want := ra.Cmp(rb) == 0; got != want {
				t.Fatalf("sameRPCID(%s, %s) = %v; want %v", ta, tb, got, want)
			}
		case ta[0] == '"' && tb[0] == '"':
			if strings.Contains(strings.ToLower(ta+tb), `\ud`) {
				return
			}
			var sa, sb string
			if json.Unmarshal([]byte(ta), &sa) != nil || json.Unmarshal([]byte(tb), &sb) != nil {
				t.Fatalf("encoding/json cannot read %q or %q", ta, tb)
			}
			if !strings.ContainsRune(sa+sb, '\ufffd') {
				if want := sa == sb; got != want {
					t.Fatalf("sameRPCID(%s, %s) = %v; want %v", ta, tb, got, want)
				}
			}
		case (ta[0] == '"') != (tb[0] == '"') && (numberStart(ta[0]) || numberStart(tb[0])):
			if got {
				t.Fatalf("sameRPCID(%s, %s): a number is a string", ta, tb)
			}
		}
	})
}

// bigExponent reports whether the number s has an exponent big.Rat would
// take long over.
func bigExponent(s string) bool {
	i := strings.IndexAny(s, "eE")
	if i < 0 {
		return false
	}
	e := strings.TrimLeft(s[i+1:], "+-0")
	return len(e) > 3
}
