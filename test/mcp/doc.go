// Package mcp holds end-to-end tests of ssegate in front of an MCP server:
// the built binary with -mcp-path /mcp before internal/mcpmock (the
// official MCP Go SDK's server, in SSE and in JSON mode), driven by the
// official Go SDK client and by the TypeScript SDK client run by Node
// (test/mcp/node). Every test counts the tool's runs on the server: a
// re-issued tool call, however it comes back, runs once. The tests are in
// mcp_test; this file only gives the directory a package for tools that
// want one.
package mcp
