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
