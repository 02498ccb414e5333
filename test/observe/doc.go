// Package observe holds end-to-end tests of what ships to watch ssegate:
// the Prometheus rules in deploy/prometheus (promtool's check and unit
// tests), the Grafana dashboard in deploy/grafana and the rules evaluated
// by a real Prometheus scraping the built binary under a short load, and
// the traces it exports over OTLP to a real receiver. The tests are in
// observe_test; this file only gives the directory a package for tools
// that want one.
package observe
