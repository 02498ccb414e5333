// Package tiny is the package the test of arrows measures: its arrows are
// a → b, a → c, b → c, c → b, c → d and d → b.
package tiny

import "strings"

// A uses b and c; its local C is no arrow.
func A() string {
	C := strings.Repeat("x", B())
	return C
}

// E is used by a's test only.
var E = C()
