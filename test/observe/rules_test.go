package observe_test

import (
	"os/exec"
	"testing"
)

// TestRules: promtool accepts the rules and their unit tests pass (each
// alert fires on the series it watches, and only when it should).
func TestRules(t *testing.T) {
	t.Parallel()
	promtool := program(t, "promtool", "prometheus")
	for _, args := range [][]string{
		{"check", "rules", abs(t, rulesFile)},
		{"test", "rules", abs(t, rulesTestFile)},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
