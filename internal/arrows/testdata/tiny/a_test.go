package tiny

import "testing"

// TestD makes no arrow: test files are left out.
func TestD(t *testing.T) { _ = D + E }
