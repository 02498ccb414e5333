package main

import (
	"bytes"
	"testing"
)

// TestMaxKeysPerTenantFlag: -max-keys-per-tenant defaults to a tenth of
// -max-keys, reads SSEGATE_MAX_KEYS_PER_TENANT, and refuses a negative.
func TestMaxKeysPerTenantFlag(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		want int
	}{
		{nil, nil, 100_000},
		{[]string{"-max-keys", "5000"}, nil, 500},
		{[]string{"-max-keys", "5"}, nil, 1},
		{[]string{"-max-keys-per-tenant", "42"}, nil, 42},
		{nil, map[string]string{"SSEGATE_MAX_KEYS_PER_TENANT": "7"}, 7},
	}
	for _, c := range cases {
		o, err := parseFlags(append([]string{"-upstream", "mock"}, c.args...), env(c.env), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%v %v: got error %v; want none", c.args, c.env, err)
		}
		if o.maxTenantKeys != c.want {
			t.Errorf("%v %v: got -max-keys-per-tenant %d; want %d", c.args, c.env, o.maxTenantKeys, c.want)
		}
	}
	if _, err := parseFlags([]string{"-upstream", "mock", "-max-keys-per-tenant", "-1"}, env(nil), &bytes.Buffer{}); err == nil {
		t.Error("-max-keys-per-tenant -1: got no error; want one")
	}
}

// TestTenantShareFlags: -max-stranger-keys and -max-live-bytes-per-tenant
// reach the store's limits (0 is the store's default share), read their
// SSEGATE_ variables, and refuse a negative or more than the whole.
func TestTenantShareFlags(t *testing.T) {
	o, err := parseFlags([]string{"-upstream", "mock", "-max-stranger-keys", "30"}, env(map[string]string{"SSEGATE_MAX_LIVE_BYTES_PER_TENANT": "4096"}), &bytes.Buffer{})
	if err != nil {
		t.Fatalf("got error %v; want none", err)
	}
	if o.maxStrangers != 30 || o.maxLiveTenant != 4096 {
		t.Errorf("got -max-stranger-keys %d, -max-live-bytes-per-tenant %d; want 30, 4096", o.maxStrangers, o.maxLiveTenant)
	}
	for _, args := range [][]string{
		{"-max-stranger-keys", "-1"},
		{"-max-keys", "10", "-max-stranger-keys", "11"},
		{"-max-live-bytes-per-tenant", "-1"},
		{"-max-live-bytes", "1000", "-max-live-bytes-per-tenant", "1001"},
	} {
		if _, err := parseFlags(append([]string{"-upstream", "mock"}, args...), env(nil), &bytes.Buffer{}); err == nil {
			t.Errorf("%v: got no error; want one", args)
		}
	}
}
