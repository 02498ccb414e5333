package tiny

// C uses b (T and its field F) and d (M and D).
func C() int { return T{F: D}.M() }
