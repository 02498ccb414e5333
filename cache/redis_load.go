package cache

import (
	"context"

	"github.com/redis/rueidis"
)

// scriptBodies are the Lua scripts of the Redis store, as newScript and
// newScriptRetryable made them, for loadScripts.
var scriptBodies []string

// newScript is rueidis.NewLuaScript for a script of the store, which
// loadScripts loads when the store connects.
func newScript(body string) *rueidis.Lua {
	scriptBodies = append(scriptBodies, body)
	return rueidis.NewLuaScript(body)
}

// newScriptRetryable is rueidis.NewLuaScriptRetryable likewise.
func newScriptRetryable(body string) *rueidis.Lua {
	scriptBodies = append(scriptBodies, body)
	return rueidis.NewLuaScriptRetryable(body)
}

// loadScripts loads the store's scripts into every node c knows (SCRIPT
// LOAD), so that the first calls are EVALSHAs that find them. Otherwise
// every call in flight when a script is first used (a burst of claims as
// the replica starts) gets NOSCRIPT and is sent again as an EVAL carrying
// the whole script, which Redis hashes and reads each time. A node that
// joins later, or a Redis that restarted, loads them that way, one burst
// each. It returns the first error; the store works without the load.
func loadScripts(ctx context.Context, c rueidis.Client) error {
	var first error
	for _, node := range c.Nodes() {
		cmds := make(rueidis.Commands, 0, len(scriptBodies))
		for _, body := range scriptBodies {
			cmds = append(cmds, node.B().ScriptLoad().Script(body).Build())
		}
		for _, res := range node.DoMulti(ctx, cmds...) {
			if err := res.Error(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}
