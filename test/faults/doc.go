// Package faults holds the randomized fault test of ssegate
// (faults_test.TestFaults): a real ssegate, wired as cmd/ssegate wires it,
// in front of a real upstream on loopback that injects, at random from a
// seed, the failures real providers produce, while many clients send keyed
// and unkeyed requests, duplicate them, drop them and resume them, and MCP
// tool calls that are cut and re-issued before a faulty MCP server. After
// each round it checks what every client got, what the store kept, what
// the upstream was made to pay for, how often each tool ran, and that
// nothing was left running.
// The tests are in faults_test; this file only gives the directory a
// package for tools that want one.
package faults
