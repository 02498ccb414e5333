package cache

import (
	"errors"
	"fmt"
	"github.com/ssegate/ssegate/cache/internal/wiretest"
	"testing"
)

func TestResultAfter(t *testing.T) {
	t.Parallel()
	m := newMemory(t, Config{})
	_, all := commitStream(t, m, Scope{Tenant: "t", Key: "k"}, "fp", 4)
	b := begin(t, m, Scope{Tenant: "t", Key: "k"}, "fp")
	r := b.Result
	evs := wiretest.ParseWire(t, all)
	for seq := uint64(0); seq <= 5; seq++ {
		t.Run(fmt.Sprint(seq), func(t *testing.T) {
			got, err := r.After(seq)
			if seq > 4 {
				if !errors.Is(err, ErrPosition) {
					t.Fatalf("got %v; want ErrPosition", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("got %v; want none", err)
			}
			wiretest.CheckSeq(t, wiretest.ParseWire(t, got), evs[0].ID.Gen, seq, 4)
		})
	}
}
