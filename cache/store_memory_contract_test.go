package cache_test

import (
	"testing"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
)

// TestMemoryContracts runs the contracts every store keeps
// (storetest.Contracts) against Memory, and checks its ledger after each.
func TestMemoryContracts(t *testing.T) {
	for _, c := range storetest.Contracts {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			m, err := cache.NewMemory(cache.Config{MaxKeys: c.MaxKeys, Limits: c.Limits})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			c.Run(t, m)
			cache.CheckLedger(t, m)
		})
	}
}

// TestMemoryAliasTenants holds a Memory store's aliases to their tenants
// (storetest.AliasTenants).
func TestMemoryAliasTenants(t *testing.T) {
	t.Parallel()
	m, err := cache.NewMemory(cache.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	storetest.AliasTenants(t, m, m)
}

// Memory is a store of the contracts' (storetest.Store, AliasStore).
var (
	_ storetest.Store      = (*cache.Memory)(nil)
	_ storetest.AliasStore = (*cache.Memory)(nil)
)
