// Package gatetest runs the built ssegate binary for end-to-end tests:
// it builds cmd/ssegate once per test binary, starts processes of it on
// free loopback ports, and stops them when the test ends, printing their
// output if the test failed. The tests thus drive exactly what an
// operator deploys, with its flag parsing and signal handling, rather
// than the in-package wiring.
//
// A package using it calls [Main] from its TestMain:
//
//	func TestMain(m *testing.M) { gatetest.Main(m) }
//
// and starts processes with [Config.Start]:
//
//	g := gatetest.Config{Grace: 10 * time.Second}.Start(t, "-upstream", "mock")
//	resp, err := http.Get(g.URL + "/healthz")
//
// The processes run without the test's SSEGATE_* environment variables,
// which the binary would read as flags: what they get is on their command
// line, and in [Config.Env].
package gatetest
