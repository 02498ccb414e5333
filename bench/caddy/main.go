// Command caddy is the Caddy web server with only the modules the bench
// needs (the HTTP app and its reverse proxy), built by the suite as a peer.
// It is a module of its own, so that ssegate's go.mod does not carry
// Caddy's dependencies.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

func main() {
	caddycmd.Main()
}
