// Command mcpmock serves internal/mcpmock's MCP server (the official MCP
// Go SDK's, with tools whose side effects are counted) on /mcp, for
// trying ssegate's -mcp-path by hand:
//
//	mcpmock -listen 127.0.0.1:9000 &
//	ssegate -upstream http://127.0.0.1:9000 -mcp-path /mcp
//
// GET /runs?target=T says how often a tool ran for T. It is a command of
// its own rather than part of -upstream mock so that the MCP SDK stays out
// of the ssegate binary.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ssegate/ssegate/internal/mcpmock"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to serve MCP on (at /mcp)")
	jsonMode := flag.Bool("json", false, "answer with application/json rather than SSE streams")
	sessions := flag.Bool("sessions", false, "keep sessions (Mcp-Session-Id), as servers of protocol revisions before 2026-07-28 do; without, every request stands alone")
	delay := flag.Duration("delay", 2*time.Second, "how long the write tool runs")
	flag.Parse()
	m := mcpmock.New(mcpmock.Config{JSON: *jsonMode, Stateless: !*sessions, Delay: *delay})
	url, err := m.Start(*listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "mcpmock: MCP on %s%s, runs on %s%s\n", url, mcpmock.Path, url, mcpmock.RunsPath)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	m.Close()
}
