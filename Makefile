# batchgen — run `make help` for the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO          ?= go
BIN         := bin
FUNCTIONS   := splitter generator exporter api sweeper events
GOFLAGS_LAMBDA := -trimpath -tags lambda.norpc -ldflags='-s -w'

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: batchgen
batchgen: ## build the single binary bin/batchgen
	$(GO) build -o $(BIN)/batchgen ./cmd/batchgen

.PHONY: run
run: batchgen ## run a job on the bundled example sheet (embedded: no AWS, no API key)
	$(BIN)/batchgen run --in examples/skus.xlsx --out examples/skus.result.xlsx --sim-latency 200ms --concurrency 16

# The test targets' build flags, exported to their go commands so that the batchgen binary the
# CLI tests build with -race gets the same (and shares the build cache):
#   - SQLite here is C transpiled to Go (modernc.org/sqlite/lib on modernc.org/libc and
#     modernc.org/memory). The race detector instruments every memory access of the code it
#     builds, so under -race a test spent most of its time in SQLite's own loads and stores: the
#     task store's tests took 21.6 s with them instrumented and 3.3 s without, the pipeline's 88 s
#     and 44 s. Races inside SQLite's C are not ours to find; its Go driver (modernc.org/sqlite),
#     the standard library and every line of ours stay instrumented.
#   - -trimpath keeps the checkout's directory out of the build cache's keys: a fresh clone (as CI
#     makes) reuses what an earlier clone compiled instead of compiling every package again.
#   - -ldflags=-w leaves DWARF out of the test binaries, most of what linking some sixty of them
#     costs; stack traces and race reports read the symbol table, not DWARF.
TEST_GOFLAGS := -trimpath -ldflags=-w -gcflags=modernc.org/sqlite/lib=-race=false -gcflags=modernc.org/libc/...=-race=false -gcflags=modernc.org/memory=-race=false
test test-unit test-chaos: export GOFLAGS := $(strip $(GOFLAGS) $(TEST_GOFLAGS))

.PHONY: test
test: ## the whole test suite: vet, gofmt, unit + race, fuzz smoke, emulator and template checks
	./scripts/test.sh

.PHONY: test-chaos
test-chaos: ## the kill loop: SIGKILL batchgen run at 20 points (split, mid-batch, export) and resume
	$(GO) test -race -count=1 -tags chaos -run 'TestChaos|TestDiskFull' -v ./cmd/batchgen

.PHONY: test-office
test-office: ## openpyxl and LibreOffice read the round-tripped public workbooks (installs LibreOffice and the venv when missing)
	SOFFICE=$$(scripts/ensure-libreoffice.sh) && . infra/venv.sh && batchgen_venv && BATCHGEN_SOFFICE=$$SOFFICE BATCHGEN_PYTHON=$$VENV/bin/python $(GO) test -count=1 -tags office -run '^TestOffice' -v ./internal/sheet

.PHONY: test-browser
test-browser: ## the web page in headless Chromium against batchgen serve (installs Debian's chromium when missing)
	BATCHGEN_CHROMIUM=$$(scripts/ensure-chromium.sh) && export BATCHGEN_CHROMIUM && $(GO) test -count=1 -tags browser -run '^TestBrowser' -v ./internal/web

.PHONY: test-unit
test-unit: ## unit and embedded integration tests only (no emulator)
	$(GO) test -race -count=1 -p 4 ./...

.PHONY: bench
bench: ## the benchmark table: every figure against its target (met/MISSED), JSON in bench-results/
	./scripts/bench.sh

.PHONY: bench-quick
bench-quick: ## the reduced benchmark table (quota, overhead, speedup, columns, fairness), about two minutes
	./scripts/bench.sh --quick

# make bench-compare OLD NEW, or make bench-compare OLD=a.json NEW=b.json
ifeq (bench-compare,$(firstword $(MAKECMDGOALS)))
  COMPARE_ARGS := $(wordlist 2,$(words $(MAKECMDGOALS)),$(MAKECMDGOALS))
  ifneq ($(COMPARE_ARGS),)
    $(eval .PHONY: $(COMPARE_ARGS))
    $(eval $(COMPARE_ARGS):;@:)
  endif
endif
.PHONY: bench-compare
bench-compare: ## compare two bench runs: make bench-compare OLD.json NEW.json
	$(GO) run ./cmd/batchgen-bench compare $(or $(OLD),$(word 1,$(COMPARE_ARGS))) $(or $(NEW),$(word 2,$(COMPARE_ARGS)))

.PHONY: bench-go
bench-go: ## Go micro-benchmarks of the hot paths (sheet, store, queue, limiter, providers)
	$(GO) test -run '^$$' -bench . -benchmem ./internal/...

.PHONY: build
build: ## build the Lambda artifacts bin/<function>/bootstrap (linux/arm64, static, lambda.norpc)
	@for f in $(FUNCTIONS); do \
	  echo "build $$f"; \
	  CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build $(GOFLAGS_LAMBDA) -o $(BIN)/$$f/bootstrap ./functions/$$f || exit 1; \
	done

.PHONY: sizes
sizes: build ## print the size of each Lambda artifact (each links only what it uses)
	@for f in $(FUNCTIONS); do printf '%-10s %6d KiB\n' $$f $$(( $$(stat -c %s $(BIN)/$$f/bootstrap) / 1024 )); done

.PHONY: deploy
deploy: build ## sam build && sam deploy (SAM CLI from the project's .venv; pass SAM_FLAGS="--config-env prod")
	. infra/venv.sh && batchgen_venv && GOFLAGS=-tags=lambda.norpc "$$VENV/bin/sam" build && "$$VENV/bin/sam" deploy $(SAM_FLAGS)

.PHONY: emulator
emulator: ## start the local AWS emulator (moto) and print AWS_ENDPOINT_URL
	@infra/emulator/start.sh

.PHONY: emulator-stop
emulator-stop: ## stop the local AWS emulator
	@infra/emulator/stop.sh

.PHONY: lint
lint: ## go vet, staticcheck (one pass with every test tag: the tags only add files) and gofmt
	$(GO) vet -tags emulator,chaos,browser,office ./...
	$(GO) tool staticcheck -tags emulator,chaos,browser,office ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

.PHONY: fuzz
fuzz: ## run each fuzz target for 30s
	$(GO) test ./internal/prompt -run '^$$' -fuzz FuzzRender -fuzztime 30s
	$(GO) test ./internal/sheet -run '^$$' -fuzz FuzzReadCSV -fuzztime 30s
	$(GO) test ./internal/sheet -run '^$$' -fuzz FuzzReadXLSX -fuzztime 30s
	$(GO) test ./internal/sheet -run '^$$' -fuzz FuzzAddColumns -fuzztime 30s
	$(GO) test ./internal/providerfile -run '^$$' -fuzz FuzzParse -fuzztime 30s
	$(GO) test ./internal/schema -run '^$$' -fuzz FuzzParseShort -fuzztime 30s
	$(GO) test ./internal/schema -run '^$$' -fuzz FuzzValidate -fuzztime 30s

.PHONY: clean
clean: ## remove build outputs and local state
	rm -rf $(BIN) .aws-sam examples/.batchgen examples/*.result.xlsx
