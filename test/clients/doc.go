// Package clients holds end-to-end tests that drive ssegate with the
// clients its users run: a headless Chromium's EventSource, the official
// OpenAI and Anthropic Go SDKs (also through client.Transport, on
// connections a forwarder severs), and plain HTTP clients against the
// built binary while it drains on SIGTERM. The tests are in clients_test; this
// file only gives the directory a package for tools that want one.
package clients
