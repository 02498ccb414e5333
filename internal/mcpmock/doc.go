// Package mcpmock is an MCP server for ssegate's tests and demos, built
// with the official MCP Go SDK and served over streamable HTTP on /mcp,
// answering either with SSE streams or with application/json
// (Config.JSON), with sessions (protocol revisions up to 2025-11-25) or
// without (Config.Stateless, which 2026-07-28 needs).
//
// Its tools have side effects a test can count (Server.Runs, the runs
// tool over MCP, or GET /runs?target=T), so that a test proves a tool ran
// once however often it was called through ssegate:
//
//	write {target, ms?, die?}  counts a run for target, sends progress
//	                           notifications for about Config.Delay (or ms),
//	                           then answers "wrote TARGET (run N)"; with die
//	                           it cuts its caller's connection after the
//	                           run began, as a server that died mid-call
//	refuse {target}            counts a run and answers isError: true
//	reject {target}            counts a run and answers a JSON-RPC error
//	runs {target}              answers how many runs target has had
package mcpmock
