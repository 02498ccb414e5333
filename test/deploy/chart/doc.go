// Package chart tests the Helm chart in deploy/helm/ssegate offline:
// helm lint --strict, helm template over the CI values files with every
// object decoded strictly into its Kubernetes API type, the checks the
// deployment must pass, and what the chart must refuse. It is a module of
// its own so that the Kubernetes API modules stay out of ssegate's.
package chart
