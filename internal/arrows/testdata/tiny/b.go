package tiny

// T is declared here; its method M in d.go.
type T struct{ F int }

// B uses c.
func B() int { return C() }
