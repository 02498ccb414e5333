package redis

import (
	"context"
	"fmt"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/redistest"
)

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

// TestRedisAppendChecksEndByLength: past a journal's first batch, an
// append (and the finish) knows the journal ends where the owner thinks
// from its length (XLEN), without reading its last entry (XREVRANGE),
// which it reads only when the length does not match (a failover's loss,
// a batch whose reply was lost: TestRedisAppendsPrevInBatch).
func TestRedisAppendChecksEndByLength(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := newRedis(t, srv.Addr, "xlen", nil)
	const streams, events = 4, 20
	scs, fs, wants := mirroredStreams(t, r, "x", streams)
	calls := func(name string) int64 {
		t.Helper()
		out, err := r.c.Do(context.Background(), r.c.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		_, rest, ok := strings.Cut(out, "cmdstat_"+name+":calls=")
		if !ok {
			return 0
		}
		n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		return n
	}
	revBefore, lenBefore := calls("xrevrange"), calls("xlen")
	for seq := 2; seq <= events; seq++ {
		for i, f := range fs {
			wants[i] = append(wants[i], storetest.AppendN(t, f, seq, 1)...)
		}
		for i, sc := range scs {
			eventually(t, 5*time.Second, func() error {
				n, err := r.c.Do(context.Background(), r.c.B().Xlen().Key(r.keys(sc).j).Build()).AsInt64()
				if err != nil || n != int64(seq) {
					return fmt.Errorf("stream %d: the journal holds %d entries (%v); want %d", i, n, err, seq)
				}
				return nil
			})
		}
	}
	// The waits' own XLENs are counted too: the appends' are at least one
	// an event.
	if rev, xlen := calls("xrevrange")-revBefore, calls("xlen")-lenBefore; rev != 0 || xlen < streams*(events-1) {
		t.Fatalf("%d appends read the journal's last entry %d times and its length %d times; want 0 and at least one an append", streams*(events-1), rev, xlen)
	}
	commitAll(t, r, scs, fs, wants, -1)
}
