package cache

import "testing"

// CheckLedger is checkLedger for the tests outside the package
// (store_memory_contract_test.go).
func CheckLedger(t *testing.T, m *Memory) { checkLedger(t, m) }
