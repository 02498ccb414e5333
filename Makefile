# ssegate — see README.md.
GO ?= go
BIN := bin/ssegate
ADDR ?= 127.0.0.1:8080

.PHONY: build run test vet fmt bench soak fuzz clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/ssegate

# ssegate in front of its embedded mock LLM, on $(ADDR).
run: build
	./$(BIN) -listen $(ADDR) -upstream mock -log-format text

# Everything CI runs: vet, formatting, and the whole suite with the race detector.
test:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || (echo "gofmt needed:"; gofmt -l .; exit 1)
	$(GO) test -race -count=1 -timeout 15m ./...

# Every fuzz target (the SSE reader and writer, event ids and Last-Event-ID,
# the detector, the request fields, idempotency keys) for $(FUZZTIME) each,
# one after the other (go fuzzes one target per run); their seed corpora in
# testdata/fuzz run in every make test. FUZZFLAGS=-parallel=1 keeps it to
# one core.
FUZZTIME ?= 30s
FUZZFLAGS ?=
FUZZPKGS ?= ./sse ./proxy
fuzz:
	@set -e; for p in $(FUZZPKGS); do for t in $$($(GO) test $$p -list '^Fuzz' | grep '^Fuzz'); do \
		echo "== $$p $$t ($(FUZZTIME))"; \
		$(GO) test $$p -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS); \
	done; done

# The benchmark suite (bench/): every scenario against direct, httputil,
# nginx (when installed) and ssegate with and without Idempotency-Key,
# 3 interleaved rounds; tables on stdout, JSON/Markdown/SVG in bench/results/.
# BENCHFLAGS=-quick for a smoke run, or e.g. BENCHFLAGS='-scenarios a,b'.
# To show what a change costs, measure a second ssegate binary (built from
# the commit before it) beside ssegate in the same rounds, with the same
# flags: make bench BENCHFLAGS='-baseline /path/to/old-ssegate -scenarios a,b'
# adds the paths ssegate@baseline and ssegate@baseline+key and a summary of
# ssegate against them.
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
