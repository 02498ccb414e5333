package mcpmock_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/ssegate/ssegate/internal/mcpmock"
	"github.com/ssegate/ssegate/internal/poll"
)

// connect starts a mock with cfg and a Go SDK client session on it; the
// progress notifications it gets are counted in progress.
func connect(t *testing.T, cfg mcpmock.Config, progress *atomic.Int64) (*mcpmock.Server, *mcp.ClientSession) {
	t.Helper()
	m := mcpmock.New(cfg)
	url, err := m.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	c := mcp.NewClient(&mcp.Implementation{Name: "mcpmock-test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progress.Add(1) },
	})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + mcpmock.Path, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return m, cs
}

func TestTools(t *testing.T) {
	for _, mode := range []struct {
		name            string
		json, stateless bool
	}{{"sse", false, false}, {"json", true, false}, {"sse-stateless", false, true}, {"json-stateless", true, true}} {
		t.Run(mode.name, func(t *testing.T) {
			var progress atomic.Int64
			m, cs := connect(t, mcpmock.Config{JSON: mode.json, Stateless: mode.stateless, Delay: 200 * time.Millisecond}, &progress)
			ctx := context.Background()
			p := &mcp.CallToolParams{Name: "write", Arguments: map[string]any{"target": "a"}}
			p.SetProgressToken("tok")
			for want := int64(1); want <= 2; want++ {
				r, err := cs.CallTool(ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				if got := m.Runs("a"); got != want {
					t.Fatalf("runs of a: got %d; want %d", got, want)
				}
				if r.IsError || !strings.Contains(mcpmock.Text(r), "wrote a") {
					t.Fatalf("write: got %+v; want wrote a", r)
				}
			}
			if !mode.json {
				// The client handles notifications apart from the result.
				poll.For(t, 2*time.Second, "8 progress notifications", func() bool { return progress.Load() == 8 })
			}
			r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "refuse", Arguments: map[string]any{"target": "b"}})
			if err != nil || !r.IsError {
				t.Fatalf("refuse: got %+v, %v; want isError", r, err)
			}
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "reject", Arguments: map[string]any{"target": "c"}}); err == nil || !strings.Contains(err.Error(), "rejected c") {
				t.Fatalf("reject: got %v; want a JSON-RPC error", err)
			}
			r, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "runs", Arguments: map[string]any{"target": "a"}})
			if err != nil || !strings.Contains(mcpmock.Text(r), "a: 2 runs") {
				t.Fatalf("runs: got %+v, %v; want a: 2 runs", r, err)
			}
			if m.Runs("b") != 1 || m.Runs("c") != 1 {
				t.Fatalf("runs of b, c: got %d, %d; want 1, 1", m.Runs("b"), m.Runs("c"))
			}
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			if _, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "write", Arguments: map[string]any{"target": "d", "die": true}}); err == nil {
				t.Fatal("write with die: got an answer; want none")
			}
			if got := m.Runs("d"); got != 1 {
				t.Fatalf("runs of d: got %d; want 1", got)
			}
		})
	}
}
