package cache

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestScopeLogValue: a scope logs as one attribute, a group of its tenant
// and key, in text and JSON alike, and never with its accounts.
func TestScopeLogValue(t *testing.T) {
	sc := Scope{Tenant: "t1", Key: "k1", Accounts: []string{"acct-hash"}}
	for _, tt := range []struct {
		name string
		new  func(*bytes.Buffer) slog.Handler
		want string
	}{
		{"text", func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) }, "scope.tenant=t1 scope.key=k1"},
		{"json", func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) }, `"scope":{"tenant":"t1","key":"k1"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			slog.New(tt.new(&b)).Info("m", "scope", sc)
			if got := b.String(); !strings.Contains(got, tt.want) || strings.Contains(got, "acct-hash") {
				t.Errorf("got %q; want it to hold %q and no account", got, tt.want)
			}
		})
	}
}
