package redis

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/redistest"
)

// TestRedisSecretShared: replicas that ask for the secret at once all get
// one value, created by one of them; a later ask gets it again; another
// prefix (another deployment) has its own.
func TestRedisSecretShared(t *testing.T) {
	t.Parallel()
	rs := replicas(t, 4)
	expireSecret(t, rs[0])
	secrets := make([][]byte, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() {
			s, err := r.Secret(context.Background())
			if err != nil {
				t.Errorf("replica %d: Secret: %v", i, err)
			}
			secrets[i] = s
		})
	}
	wg.Wait()
	for i, s := range secrets {
		if len(s) < minSecret || !bytes.Equal(s, secrets[0]) {
			t.Fatalf("replica %d: secret %q; want replica 0's %q, at least %d bytes", i, s, secrets[0], minSecret)
		}
	}
	if s, _ := rs[1].Secret(context.Background()); !bytes.Equal(s, secrets[0]) {
		t.Fatalf("second ask: got %q; want %q", s, secrets[0])
	}
	other := newRedis(t, redistest.Shared(t), redistest.Prefix(t)+"-other", nil)
	expireSecret(t, other)
	if s, _ := other.Secret(context.Background()); bytes.Equal(s, secrets[0]) {
		t.Fatal("another prefix: got the same secret; want its own")
	}
}

// TestRedisSecretKept: a store that handed out the secret puts it back
// when Redis lost it, and logs an error when another value replaced it.
// It is not parallel: it sets the package's secretCheck, which every
// store's Secret reads.
func TestRedisSecretKept(t *testing.T) {
	old := secretCheck
	secretCheck = 20 * time.Millisecond
	t.Cleanup(func() { secretCheck = old })
	var logs gatetest.LogBuffer
	r := newRedis(t, redistest.Shared(t), redistest.Prefix(t), func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	expireSecret(t, r)
	secret, err := r.Secret(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	get := func() string {
		v, _ := r.c.Do(ctx, r.c.B().Get().Key(r.secretKey()).Build()).ToString()
		return v
	}
	if err := r.c.Do(ctx, r.c.B().Del().Key(r.secretKey()).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error {
		if v := get(); v != string(secret) {
			return fmt.Errorf("after DEL: Redis holds %q; want the secret back", v)
		}
		return nil
	})
	if err := r.c.Do(ctx, r.c.B().Set().Key(r.secretKey()).Value("another-secret-of-32-bytes-0123456").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error {
		if !strings.Contains(logs.String(), "level=ERROR") {
			return fmt.Errorf("another secret in Redis: no error logged:\n%s", logs.String())
		}
		return nil
	})
}

// expireSecret lets the secret of r's prefix expire soon after the test
// (it has no TTL of its own), on the Redis other tests share.
func expireSecret(t *testing.T, r *Store) {
	t.Cleanup(func() {
		r.c.Do(context.Background(), r.c.B().Pexpire().Key(r.secretKey()).Milliseconds(2000).Build()) //nolint:errcheck
	})
}
