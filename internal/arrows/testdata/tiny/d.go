package tiny

// D is used by c.
var D = 1

// M uses b (T and F).
func (t T) M() int { return t.F }
