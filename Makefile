# ssegate — see README.md.
GO ?= go
BIN := bin/ssegate
ADDR ?= 127.0.0.1:8080

.PHONY: build run check test cross observe vet fmt bench soak fuzz clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/ssegate

# ssegate in front of its embedded mock LLM, on $(ADDR).
run: build
	./$(BIN) -listen $(ADDR) -upstream mock -log-format text -fallback "mock-down=gpt-4o-mini;mock-rate-limited=gpt-4o-mini;mock-small=gpt-4o-mini"

# The formatting check of check and test: fails, listing them, when files
# need gofmt.
GOFMT_CHECK = @test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || (echo "gofmt needed:"; gofmt -l .; exit 1)

# Every platform the module must build for: cross vets ./... for each,
# test files included (go vet type-checks them, so it fails where a build
# or a test build would), and bench/firstevent, a module of its own.
# Platform-specific code lives in files named for what they hold, with a
# fallback for the others (proxy/sockwrite_*.go, proxy/peerclosed_*.go,
# bench/proc_*.go, internal/*/pause_*.go). The first run for a platform
# compiles its standard library and dependencies; after that the build
# cache answers all but the packages that changed. bench/caddy (its own
# module, all of Caddy) is left out: it is only a peer the bench builds
# on the machine it runs on. PLATFORMS=linux/arm64 checks one. check and
# test vet the host's platform first, so CROSS_VET skips it: cached, it
# adds about 1.5 s a platform (measured: 8.6 s for all five, 24.5 s after
# a change to proxy).
PLATFORMS ?= linux/amd64 linux/arm64 darwin/arm64 windows/amd64 freebsd/amd64
HOST_PLATFORM := $(shell $(GO) env GOOS)/$(shell $(GO) env GOARCH)
CROSS_VET = @set -e; for p in $(PLATFORMS); do \
		[ "$$p" != "$(HOST_PLATFORM)" ] || continue; \
		GOOS=$${p%/*} GOARCH=$${p\#*/} $(GO) vet ./... || { echo "go vet ./... failed for $$p"; exit 1; }; \
		GOOS=$${p%/*} GOARCH=$${p\#*/} $(GO) -C bench/firstevent vet . || { echo "go vet bench/firstevent failed for $$p"; exit 1; }; \
	done

cross:
	$(GO) vet ./...
	$(GO) -C bench/firstevent vet .
	$(CROSS_VET)

# The check before a commit, meant to take under a minute: vet (on every
# platform of cross), formatting, and the unit tests of sse, cache and
# proxy with the race detector; not the end-to-end packages (test/*),
# bench or cmd, which make test runs. cache's Redis tests need
# SSEGATE_REDIS_ADDR or redis-server installed (they skip otherwise).
# CHECKPKGS=./cache checks one package.
CHECKPKGS ?= ./sse ./cache ./proxy
check:
	$(GO) vet ./...
	$(CROSS_VET)
	$(GOFMT_CHECK)
	$(GO) test -race -count=1 -timeout 5m $(CHECKPKGS)

# Everything CI runs: vet, here and on every platform of cross
# (bench/firstevent is a module of its own), formatting, and the whole
# suite with the race detector.
test:
	$(GO) vet ./...
	$(GO) -C bench/firstevent vet .
	$(CROSS_VET)
	$(GOFMT_CHECK)
	$(GO) test -race -count=1 -timeout 15m ./...

# The shipped dashboard and rules (deploy/) in a real Prometheus scraping
# the built binary, promtool on the rules, and the traces in a real
# Jaeger (built from test/observe/jaeger on first use, a few minutes):
# the end-to-end package make test also runs. It needs Debian's
# prometheus (apt-get install prometheus), as .ci/run installs it.
observe:
	$(GO) test -count=1 -timeout 15m ./test/observe

# Every fuzz target of the module for $(FUZZTIME) each, one after the
# other (go fuzzes one target per run): the packages that have them and
# their targets are found with go test -list '^Fuzz', so a new target is
# fuzzed without being named here. Their seed corpora in testdata/fuzz run
# in every make test. FUZZFLAGS=-parallel=1 keeps it to one core;
# FUZZPKGS=./sse fuzzes one package's targets.
FUZZTIME ?= 30s
FUZZFLAGS ?=
FUZZPKGS ?= ./...
fuzz:
	@set -e; list=$$($(GO) test -list '^Fuzz' $(FUZZPKGS)); \
	targets=$$(printf '%s\n' "$$list" | awk '/^Fuzz/ { n[++k] = $$1; next } /^ok / { for (i = 1; i <= k; i++) print $$2 ":" n[i]; k = 0 }'); \
	test -n "$$targets" || { echo "no fuzz targets in $(FUZZPKGS)"; exit 1; }; \
	for pt in $$targets; do p=$${pt%%:*}; t=$${pt#*:}; \
		echo "== $$p $$t ($(FUZZTIME))"; \
		$(GO) test $$p -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS); \
	done

# The benchmark suite (bench/): every scenario against direct, httputil,
# fasthttp, nginx (when installed), caddy (built from bench/caddy, its own
# module), the Portkey gateway (installed with npm ci from bench/portkey
# when node and npm are installed) and ssegate with and without
# Idempotency-Key, 3 interleaved rounds; tables on stdout, JSON/Markdown/SVG
# in bench/results/. BENCHFLAGS=-peers ssegate,caddy picks the peers.
# BENCHFLAGS=-quick for a smoke run, or e.g. BENCHFLAGS='-scenarios a,b'.
# To show what a change costs, measure a second ssegate binary (built from
# the commit before it) beside ssegate in the same rounds, with the same
# flags: make bench BENCHFLAGS='-baseline /path/to/old-ssegate -scenarios a,b'
# adds the paths ssegate@baseline and ssegate@baseline+key and a summary of
# ssegate against them. To see where ssegate spends its CPU and memory,
# BENCHFLAGS='-profile DIR -scenarios a' writes its CPU profile (over the
# first -duration of the load) and heap profile (after it) for every
# ssegate measurement, as DIR/SCENARIO-STEP-rROUND-PATH.cpu.pprof and
# .heap.pprof, for go tool pprof.
bench:
	$(GO) run ./bench $(BENCHFLAGS)

# The soak (not in CI, not in make test): SOAK_STREAMS paced streams open
# at once for SOAK_DURATION against the built binary and its embedded mock
# (-upstream mock), keyed and not, with resumes; it reports lost and
# reordered events (must be 0), errors, and ssegate's goroutines and RSS
# during and after the load, and fails unless they come back. It raises
# RLIMIT_NOFILE to about 3 descriptors a stream (client, upstream call, and
# the embedded mock's end); where the hard limit is lower, run it as root
# or raise it first (ulimit -Hn). A short check: make soak SOAK_STREAMS=1000
# SOAK_DURATION=60s. More flags (-soak-events, -soak-pace, -soak-keyed,
# -soak-resume, -soak-settle) through SOAKFLAGS.
SOAK_STREAMS ?= 10000
SOAK_DURATION ?= 10m
soak:
	$(GO) run ./bench -soak -soak-streams $(SOAK_STREAMS) -soak-duration $(SOAK_DURATION) $(SOAKFLAGS)

clean:
	rm -rf bin
