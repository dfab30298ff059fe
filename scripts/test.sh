#!/usr/bin/env bash
# The whole test suite, as `make test` and CI run it. Installs what it needs
# (the Python virtualenv with moto and cfn-lint) through the project's own
# scripts, starts the AWS emulator, and fails — never skips — when a part
# cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== %s\n' "$*"; }

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go') 2>/dev/null || true)
if [ -n "$unformatted" ]; then echo "gofmt needed:"; echo "$unformatted"; exit 1; fi

step "go vet"
go vet ./...
go vet -tags emulator ./...
go vet -tags chaos ./...

step "staticcheck (pinned in go.mod as a tool)"
go tool staticcheck ./...
go tool staticcheck -tags emulator ./...
go tool staticcheck -tags chaos ./...

step "unit and embedded integration tests (-race)"
go test -race -count=1 -timeout 20m ./...

step "chaos: SIGKILL loop (make test-chaos)"
go test -race -count=1 -tags chaos -run 'TestChaos|TestDiskFull' ./cmd/batchgen

step "fuzz smoke (a fixed number of executions per target)"
# Counts, not durations: with a duration, go1.26's fuzz coordinator can report its own
# -fuzztime deadline as a failure ("context deadline exceeded", no crasher) when a worker
# is mid-run at the deadline on a loaded machine (golang/go#75804, fixed in go1.27).
# A count has no deadline to race. Each count is roughly 10 s of work on a quiet 2-core machine.
go test ./internal/prompt -run '^$' -fuzz '^FuzzRender$' -fuzztime 300000x
go test ./internal/sheet -run '^$' -fuzz '^FuzzReadCSV$' -fuzztime 3000x -fuzzminimizetime 20x
go test ./internal/sheet -run '^$' -fuzz '^FuzzReadXLSX$' -fuzztime 5000x -fuzzminimizetime 20x

{
  step "AWS emulator (moto server) tests"
  # An assignment, not eval "$(...)": a failed start must stop the run.
  emulator_env=$(infra/emulator/start.sh)
  eval "$emulator_env"
  trap 'infra/emulator/stop.sh >/dev/null 2>&1 || true' EXIT
  export AWS_ENDPOINT_URL
  [ -n "${AWS_ENDPOINT_URL:-}" ] || { echo "emulator did not report AWS_ENDPOINT_URL"; exit 1; }
  # The packages with emulator tests, one at a time: they share one
  # emulator and two cores.
  emulator_pkgs=$(git grep -l '^//go:build emulator' -- '*_test.go' | xargs -n1 dirname | sort -u | sed 's|^|./|')
  go test -race -count=1 -timeout 30m -p 1 -tags emulator $emulator_pkgs

  step "template lint (cfn-lint, cfn-lint on the SAM translation, sam validate --lint)"
  infra/lint.sh
}

step "Lambda artifacts (make build): static linux/arm64 bootstrap per function"
make --no-print-directory sizes
for f in splitter generator exporter api sweeper; do
  info=$(go version -m "bin/$f/bootstrap")
  for want in "GOOS=linux" "GOARCH=arm64" "CGO_ENABLED=0" "-tags=lambda.norpc"; do
    grep -q -- "$want" <<<"$info" || { echo "bin/$f/bootstrap: built without $want"; exit 1; }
  done
done
echo "5 bootstrap binaries for linux/arm64"

echo
echo "all tests passed"
