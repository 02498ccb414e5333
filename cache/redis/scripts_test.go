package redis

import "testing"

// TestParseClaimAnswer: every answer claimScript gives reads as its
// verdict, and one it does not give is an error, not a decision.
func TestParseClaimAnswer(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		out  []string
		want claimAnswer
		err  bool
	}{
		{out: []string{"conflict"}, want: claimAnswer{verdict: claimConflict}},
		{out: []string{"gone"}, want: claimAnswer{verdict: claimGone}},
		{out: []string{"new"}, want: claimAnswer{verdict: claimNew}},
		{out: []string{"replay", "17"}, want: claimAnswer{verdict: claimReplay, gen: 17}},
		{out: []string{"join", "18"}, want: claimAnswer{verdict: claimJoin, gen: 18}},
		{out: []string{"miss", "19", "0", "0"}, want: claimAnswer{verdict: claimMiss, gen: 19, fresh: "0"}},
		{out: []string{"miss", "20", "1", "1"}, want: claimAnswer{verdict: claimMiss, gen: 20, regenerated: true, reaped: true, fresh: "0"}},
		{out: []string{"miss", "21", "0", "0", "1", "2"}, want: claimAnswer{verdict: claimMiss, gen: 21, counted: true, fresh: "2"}},
		{out: []string{"miss", "22", "0", "0", "1", "x"}, want: claimAnswer{verdict: claimMiss, gen: 22, counted: true, fresh: "0"}},
		{out: []string{"join"}, err: true},
		{out: []string{"replay", "x"}, err: true},
		{out: []string{"later"}, err: true},
	} {
		got, err := parseClaimAnswer(c.out)
		if (err != nil) != c.err || (err == nil && got != c.want) {
			t.Errorf("parseClaimAnswer(%q) = %+v, %v; want %+v (error %v)", c.out, got, err, c.want, c.err)
		}
	}
}
