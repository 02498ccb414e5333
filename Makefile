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

fuzz:
	$(GO) test ./sse -run '^$$' -fuzz FuzzRead -fuzztime 30s
	$(GO) test ./sse -run '^$$' -fuzz FuzzParseID -fuzztime 30s

# The benchmark suite (bench/): every scenario against direct, httputil,
# nginx (when installed) and ssegate with and without Idempotency-Key,
# 3 interleaved rounds; tables on stdout, JSON/Markdown/SVG in bench/results/.
# BENCHFLAGS=-quick for a smoke run, or e.g. BENCHFLAGS='-scenarios a,b'.
bench:
	$(GO) run ./bench $(BENCHFLAGS)

clean:
	rm -rf bin
