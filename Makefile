# ssegate — see README.md.
GO ?= go
BIN := bin/ssegate
ADDR ?= 127.0.0.1:8080

.PHONY: build run test vet fmt bench fuzz clean

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

# Every fuzz target of ./sse for $(FUZZTIME) each, one after the other (go
# fuzzes one target per run). FUZZFLAGS=-parallel=1 keeps it to one core.
FUZZTIME ?= 30s
FUZZFLAGS ?=
fuzz:
	@set -e; for t in $$($(GO) test ./sse -list '^Fuzz' | grep '^Fuzz'); do \
		echo "== $$t ($(FUZZTIME))"; \
		$(GO) test ./sse -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS); \
	done

# The benchmark suite (bench/): every scenario against direct, httputil,
# nginx (when installed) and ssegate with and without Idempotency-Key,
# 3 interleaved rounds; tables on stdout, JSON/Markdown/SVG in bench/results/.
# BENCHFLAGS=-quick for a smoke run, or e.g. BENCHFLAGS='-scenarios a,b'.
bench:
	$(GO) run ./bench $(BENCHFLAGS)

clean:
	rm -rf bin
