package redis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"slices"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// scripts are the Lua scripts of the Redis store, as newScript and
// newScriptRetryable made them, for loadScripts.
var scripts struct {
	mu     sync.Mutex // guards bodies and infos: tests make scripts while stores load them
	bodies []string
	infos  map[*rueidis.Lua]scriptInfo
}

// scriptInfo is what a pipeline of EVALSHAs (scriptPipe) needs of a
// script: its SHA-1, and whether a call may be sent again after its
// connection failed.
type scriptInfo struct {
	sha       string
	retryable bool
	body      string // for an EVAL where the server lacks it (waited)
}

func addScript(body string, s *rueidis.Lua, retryable bool) *rueidis.Lua {
	scripts.mu.Lock()
	defer scripts.mu.Unlock()
	if !slices.Contains(scripts.bodies, body) {
		scripts.bodies = append(scripts.bodies, body)
	}
	if scripts.infos == nil {
		scripts.infos = make(map[*rueidis.Lua]scriptInfo)
	}
	sum := sha1.Sum([]byte(body))
	scripts.infos[s] = scriptInfo{sha: hex.EncodeToString(sum[:]), retryable: retryable, body: body}
	return s
}

// scriptInfoOf returns what addScript recorded of s.
func scriptInfoOf(s *rueidis.Lua) scriptInfo {
	scripts.mu.Lock()
	defer scripts.mu.Unlock()
	return scripts.infos[s]
}

// newScript is rueidis.NewLuaScript for a script of the store, which
// loadScripts loads when the store connects.
func newScript(body string) *rueidis.Lua {
	return addScript(body, rueidis.NewLuaScript(body), false)
}

// newScriptRetryable is rueidis.NewLuaScriptRetryable likewise.
func newScriptRetryable(body string) *rueidis.Lua {
	return addScript(body, rueidis.NewLuaScriptRetryable(body), true)
}

// loadAll loads the store's scripts into every node c knows (SCRIPT
// LOAD), so that the first calls are EVALSHAs that find them. Otherwise
// every call in flight when a script is first used (a burst of claims as
// the replica starts) gets NOSCRIPT and is sent again as an EVAL carrying
// the whole script, which Redis hashes and reads each time. A node that
// joins later, or a Redis that restarted or failed over, loads them that
// way, one burst each. The nodes load at once, each within timeout, so a
// slow node delays the start by one timeout at most. It returns the first
// error; the store works without the load.
func loadAll(ctx context.Context, c rueidis.Client, timeout time.Duration) error {
	scripts.mu.Lock()
	bodies := slices.Clone(scripts.bodies)
	scripts.mu.Unlock()
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for _, node := range c.Nodes() {
		wg.Go(func() {
			cmds := make(rueidis.Commands, 0, len(bodies))
			for _, body := range bodies {
				cmds = append(cmds, node.B().ScriptLoad().Script(body).Build())
			}
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			for _, res := range node.DoMulti(nctx, cmds...) {
				if err := res.Error(); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return first
}
