# ssegate — see README.md.
GO ?= go
BIN := bin/ssegate
ADDR ?= 127.0.0.1:8080

.PHONY: build run check check-vet test test-norace test-valkey test-chart observe vet fmt bench soak fuzz clean cross image package release FORCE

# The version a build reports (ssegate -version) when its build info has
# none of its own: go build stamps the module version and commit in a git
# clone, but not in a git worktree or with GOFLAGS=-buildvcs=false.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
MODIFIED ?= $(shell test -z "$$(git status --porcelain 2>/dev/null)" && echo false || echo true)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.modified=$(MODIFIED)
GOBUILD = CGO_ENABLED=0 $(GO) build -buildvcs=auto -trimpath -ldflags '$(LDFLAGS)'
# Release binaries drop the symbol table and DWARF (a third of the size;
# panics and pprof still name functions).
DISTBUILD = CGO_ENABLED=0 $(GO) build -buildvcs=auto -trimpath -ldflags '-s -w $(LDFLAGS)'

build:
	$(GOBUILD) -o $(BIN) ./cmd/ssegate

# bin/dist/OS-ARCH/ssegate[.exe]: a static binary for another platform.
bin/dist/%/ssegate bin/dist/%/ssegate.exe: FORCE
	GOOS=$(word 1,$(subst -, ,$*)) GOARCH=$(word 2,$(subst -, ,$*)) $(DISTBUILD) -o $@ ./cmd/ssegate
FORCE:

# The container image (deploy/container/Containerfile) for IMAGE_ARCHS,
# one manifest list written as an OCI archive, $(IMAGE_ARCHIVE), pushed
# nowhere and not kept in podman's storage: podman load -i $(IMAGE_ARCHIVE). The binaries are
# cross-compiled here, so the Containerfile has no RUN and an arm64 image
# builds without emulation. PODMAN can name another runtime or engine
# (crun refuses a hybrid-cgroup host; runc works everywhere).
PODMAN ?= podman --runtime runc
IMAGE ?= localhost/ssegate:$(VERSION)
IMAGE_ARCHS ?= amd64 arm64
IMAGE_ARCHIVE ?= bin/ssegate-image.oci.tar
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
image: $(foreach a,$(IMAGE_ARCHS),bin/dist/linux-$(a)/ssegate)
	rm -rf bin/image && mkdir -p bin/image
	cp $(CA_BUNDLE) bin/image/ca-certificates.crt
	for a in $(IMAGE_ARCHS); do mkdir -p bin/image/linux-$$a && cp bin/dist/linux-$$a/ssegate bin/image/linux-$$a/; done
	$(PODMAN) manifest rm $(IMAGE) >/dev/null 2>&1 || true
	$(PODMAN) manifest create $(IMAGE)
	for a in $(IMAGE_ARCHS); do \
		$(PODMAN) build --layers=false --platform linux/$$a -t $(IMAGE)-$$a -f deploy/container/Containerfile bin/image && \
		$(PODMAN) manifest add $(IMAGE) containers-storage:$(IMAGE)-$$a || exit 1; \
	done
	rm -f $(IMAGE_ARCHIVE)
	$(PODMAN) manifest push --all $(IMAGE) oci-archive:$(IMAGE_ARCHIVE):$(IMAGE)
	$(PODMAN) manifest rm $(IMAGE) >/dev/null
	for a in $(IMAGE_ARCHS); do $(PODMAN) rmi $(IMAGE)-$$a >/dev/null || exit 1; done
	@echo "$(IMAGE_ARCHIVE): $(IMAGE) for $(IMAGE_ARCHS)"

# The .deb and .rpm (deploy/package: the binary, a hardened systemd unit
# and /etc/ssegate/ssegate.env) for PKG_ARCHS into bin/release/, with nfpm
# built once into the user cache directory (as .ci/run does). The package
# version is VERSION without its v, or 0.0.0~gitVERSION before any tag.
NFPM ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ssegate-test/nfpm
NFPM_VERSION ?= v2.48.0
PKG_ARCHS ?= amd64 arm64
PKG_VERSION ?= $(shell echo '$(VERSION)' | sed -e 's/^v//' -e '/^[0-9][0-9]*\.[0-9]/!s/^/0.0.0~git/' -e 's/-/./g')
RELEASE_DIR ?= bin/release
$(NFPM):
	GOBIN=$(dir $(NFPM)) CGO_ENABLED=0 $(GO) install -trimpath github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VERSION)
package: $(NFPM) $(foreach a,$(PKG_ARCHS),bin/dist/linux-$(a)/ssegate)
	mkdir -p $(RELEASE_DIR)
	for a in $(PKG_ARCHS); do for f in deb rpm; do \
		SSEGATE_PKG_ARCH=$$a SSEGATE_PKG_VERSION='$(PKG_VERSION)' SSEGATE_PKG_BINARY=bin/dist/linux-$$a/ssegate \
			$(NFPM) package -f deploy/package/nfpm.yaml -p $$f -t $(RELEASE_DIR)/ || exit 1; \
	done; done

# A release in $(RELEASE_DIR): static archives for RELEASE_PLATFORMS
# (tar.gz, zip for windows), the packages, the image archive, and
# SHA256SUMS over them all. Nothing is published.
RELEASE_PLATFORMS ?= linux-amd64 linux-arm64 darwin-arm64 windows-amd64
release:
	rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)
	$(MAKE) --no-print-directory $(foreach p,$(RELEASE_PLATFORMS),bin/dist/$(p)/ssegate$(if $(findstring windows,$(p)),.exe))
	for p in $(RELEASE_PLATFORMS); do \
		d=bin/dist/$$p; n=ssegate-$(VERSION)-$$p; cp README.md docs/flags.md docs/deploy.md $$d/ || exit 1; \
		case $$p in \
		windows-*) (cd $$d && rm -f ../$$n.zip && zip -q ../$$n.zip ssegate.exe README.md flags.md deploy.md) && mv bin/dist/$$n.zip $(RELEASE_DIR)/ ;; \
		*) tar -C $$d -czf $(RELEASE_DIR)/$$n.tar.gz --owner=0 --group=0 ssegate README.md flags.md deploy.md ;; \
		esac || exit 1; \
	done
	$(MAKE) --no-print-directory package
	$(MAKE) --no-print-directory image
	cp $(IMAGE_ARCHIVE) $(RELEASE_DIR)/ssegate-$(VERSION)-image.oci.tar
	cd $(RELEASE_DIR) && sha256sum ssegate* > SHA256SUMS
	@ls -l $(RELEASE_DIR)

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
# fallback for the others (proxy/sockwrite_*.go,
# proxy/upstream/peerclosed_*.go, bench/proc_*.go, internal/*/pause_*.go).
# The first run for a platform compiles its standard library and
# dependencies; after that the build cache answers all but the packages
# that changed. bench/caddy (its own module, all of Caddy) is left out:
# it is only a peer the bench builds on the machine it runs on. PLATFORMS=linux/arm64 checks one. check and
# test vet the host's platform first, so CROSS_VET skips it. The
# platforms are vetted at once, each in a process of its own, and the
# output of those that fail is shown: a cached go vet ./... mostly waits
# (loading and hashing packages), so at once they overlap (measured on a
# shared 2-core machine, cached: make cross 17-29 s one platform after the
# other, 12.5-13 s at once); after a change to proxy each platform vets
# proxy and what imports it again, CPU the two cores share.
PLATFORMS ?= linux/amd64 linux/arm64 darwin/arm64 windows/amd64 freebsd/amd64
HOST_PLATFORM := $(shell $(GO) env GOOS)/$(shell $(GO) env GOARCH)
CROSS_VET = @set -e; logs=$$(mktemp -d); jobs=; \
	for p in $(PLATFORMS); do \
		[ "$$p" != "$(HOST_PLATFORM)" ] || continue; \
		log=$$logs/$$(echo $$p | tr / -).log; \
		( GOOS=$${p%/*} GOARCH=$${p\#*/} $(GO) vet ./... && \
		  GOOS=$${p%/*} GOARCH=$${p\#*/} $(GO) -C bench/firstevent vet . ) >$$log 2>&1 & \
		jobs="$$jobs $$!=$$p"; \
	done; \
	failed=; for j in $$jobs; do \
		p=$${j\#*=}; wait $${j%%=*} || { cat $$logs/$$(echo $$p | tr / -).log; echo "go vet failed for $$p"; failed="$$failed $$p"; }; \
	done; \
	rm -rf $$logs; test -z "$$failed"

cross:
	$(GO) vet ./...
	$(GO) -C bench/firstevent vet .
	$(CROSS_VET)

# The check before a commit, meant to take under a minute and a half:
# vet (on every platform of cross), formatting, and the unit tests of
# sse, cache, cache/redis, proxy and proxy/upstream with the race
# detector; not the end-to-end packages (test/*), bench or cmd, which
# make test runs. cache/redis's tests need SSEGATE_REDIS_ADDR or
# redis-server installed (they skip otherwise); cache's need no server.
# CHECKPKGS=./cache checks one package; proxy, the slowest, comes first,
# so that go test (two packages at a time on two cores) starts it at once
# rather than after sse. The tests' results are cached
# (go test's cache: a package whose code, test files, files read and
# environment read are the same as at its last pass is not run again),
# so a change to proxy runs proxy's tests, not sse's and cache's;
# CHECKFLAGS=-count=1 runs them all. The vetting and the formatting
# check (check-vet) run beside the tests, their output held until the
# tests end: vetting mostly waits, and cached it took 12-13 s before the
# tests could start. check fails when either does.
CHECKPKGS ?= ./proxy/... ./cache/... ./sse
CHECKFLAGS ?=
check:
	@log=$$(mktemp); \
	$(MAKE) --no-print-directory check-vet >$$log 2>&1 & vet=$$!; \
	echo '$(GO) test -race $(CHECKFLAGS) -timeout 5m $(CHECKPKGS)'; \
	$(GO) test -race $(CHECKFLAGS) -timeout 5m $(CHECKPKGS); tests=$$?; \
	wait $$vet; vetted=$$?; cat $$log; rm -f $$log; \
	[ $$vetted = 0 ] || echo "check-vet failed"; \
	[ $$tests = 0 ] && [ $$vetted = 0 ]

# check's vetting and formatting check.
check-vet:
	$(GO) vet ./...
	$(CROSS_VET)
	$(GOFMT_CHECK)

# Everything CI runs: vet, here and on every platform of cross
# (bench/firstevent and test/deploy/chart are modules of their own),
# formatting, the whole suite with the race detector, the tests the race
# detector would spoil without it, the Helm chart's tests, and the Redis
# tests again on Valkey.
test:
	$(GO) vet ./...
	$(GO) -C bench/firstevent vet .
	$(GO) -C test/deploy/chart vet ./...
	$(CROSS_VET)
	$(GOFMT_CHECK)
	$(GO) test -race -count=1 -timeout 15m ./...
	$(MAKE) --no-print-directory test-norace
	$(MAKE) --no-print-directory test-chart
	$(MAKE) --no-print-directory test-valkey

# The tests of the files built only without the race detector
# (//go:build !race): allocation counts and heap sizes, which it would
# change (0 allocations per event, a live stream's bytes). The -race pass
# leaves them out, so they run here, without it: each package's tests
# of those files, found by name, so that a new one is run too.
test-norace:
	@set -e; for d in $$($(GO) list -f '{{.Dir}}' ./...); do \
		files=$$(grep -l '^//go:build.*!race' $$d/*_test.go 2>/dev/null || true); \
		[ -n "$$files" ] || continue; \
		run=$$(grep -ho '^func Test[A-Za-z0-9_]*' $$files | sed 's/^func //' | paste -sd'|' -); \
		[ -n "$$run" ] || continue; \
		echo "$(GO) test -count=1 -run '^($$run)\$$' $$d"; \
		$(GO) test -count=1 -run "^($$run)\$$" $$d; \
	done

# The Helm chart (deploy/helm/ssegate): helm lint --strict, helm template
# over its CI values files with every object decoded strictly into the
# Kubernetes API types, and what it must refuse. A module of its own
# (test/deploy/chart), so that the Kubernetes modules stay out of
# ssegate's go.mod. It needs helm: .ci/run builds it into the user cache
# directory (ssegate-test/helm), or one on PATH; without, it skips
# (fails with CI set).
test-chart:
	$(GO) -C test/deploy/chart test -count=1 ./...

# The tests that talk to Redis, again on Valkey (SSEGATE_REDIS_SERVER=
# valkey: internal/redistest starts valkey-server and valkey-cli, and
# fails a test whose shared server is not Valkey): the same tests, not a
# copy. VALKEY_WHOLE run whole; in VALKEY_SOME only the tests of the
# files that use internal/redistest. VALKEY_ADDR names a Valkey to share
# (.ci/run starts one); empty, each test starts its own. Without
# valkey-server it is skipped, unless CI is set (docs/redis.md says which
# versions are tested). Without the race detector: the code is the one
# the first pass ran with it, and this pass is about the server; it took
# 5 minutes without it on a loaded 2-core machine, over 20 with it
# (VALKEY_FLAGS=-race adds it).
VALKEY_ADDR ?=
VALKEY_FLAGS ?=
VALKEY_WHOLE ?= ./internal/redistest ./cache/redis ./test/replicas
VALKEY_SOME ?= ./proxy ./test/mcp ./test/observe
test-valkey:
	@set -e; \
	if ! command -v valkey-server >/dev/null; then \
		if [ -n "$$CI" ]; then echo "valkey-server is not installed, and CI runs the Redis tests on Valkey too"; exit 1; fi; \
		echo "valkey-server is not installed: the Redis tests were not run on Valkey"; exit 0; \
	fi; \
	export SSEGATE_REDIS_SERVER=valkey SSEGATE_REDIS_ADDR=$(VALKEY_ADDR); \
	echo "== on Valkey: $(VALKEY_WHOLE)"; \
	$(GO) test $(VALKEY_FLAGS) -count=1 -timeout 15m $(VALKEY_WHOLE); \
	for p in $(VALKEY_SOME); do \
		run=$$(grep -l 'redistest\.' $$p/*_test.go | xargs sed -n 's/^func \(Test[A-Za-z0-9_]*\)(.*/\1/p' | paste -sd'|'); \
		test -n "$$run" || { echo "$$p: no test uses internal/redistest"; exit 1; }; \
		echo "== on Valkey: $$p -run '^($$run)\$$'"; \
		$(GO) test $(VALKEY_FLAGS) -count=1 -timeout 15m -run "^($$run)\$$" $$p; \
	done

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
