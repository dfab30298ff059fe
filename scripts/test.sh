#!/usr/bin/env bash
# The whole test suite, as `make test` and CI run it. Installs what it needs
# (the Python virtualenv with moto and cfn-lint) through the project's own
# scripts, starts the AWS emulator, and fails — never skips — when a part
# cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== %s  (%ds)\n' "$*" "$SECONDS"; }

# A -race binary sleeps atexit_sleep_ms (1 s by default) before it exits, for goroutines still
# running to show a race; a race found while it ran still fails it (exit 66). Over some fifty
# -race test binaries that second added up, on the two cores, to half a minute of sleep.
export GORACE="${GORACE:+$GORACE }atexit_sleep_ms=0"

# Stages that do not compete for the CPU with the Go stages run beside them, each with its
# output in a log under $logs that is printed when it is waited for:
#   - the Python virtualenvs (moto, cfn-lint, SAM CLI; checkov) install at once, while the Go
#     stages run: pip mostly waits on the network and the disk;
#   - the browser tests and the office checks run while the chaos loop runs: the browser
#     tests mostly wait on Chromium and on each test's batchgen serve, the loop on its mock
#     model; both are waited for before the emulator stage;
#   - the fuzz smoke starts with the chaos loop and the template lint and the Lambda builds
#     with the emulator tests, all three at a lower priority (nice): they have no deadline, so
#     they take what CPU the stages in front leave (the emulator stage's second half waits on
#     moto with a third of the two cores idle) instead of slowing them, and
#     they are waited for at the end.
# The emulator tests themselves stay in the foreground, alone with moto, because their
# deadlines (a job finishing on a slow model) must not depend on a busy machine.
# nice 10, not 19: a fuzz worker that sees no CPU for 10 s takes its input for a hang
# (go's internal/fuzz), and at 19 the two foreground stages can starve it that long.
background_niceness=10
logs=$(mktemp -d)
bg_pids=()
cleanup() {
  # Each background stage is its own process group (set -m below): stop it whole.
  for pid in "${bg_pids[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
  infra/emulator/stop.sh >/dev/null 2>&1 || true
  BATCHGEN_EMULATOR_DIR=$PWD/.emulator-2 infra/emulator/stop.sh >/dev/null 2>&1 || true
  rm -rf "$logs"
}
trap cleanup EXIT
# background [--nice] NAME CMD...: runs CMD with its output in $logs/NAME.log; with --nice at
# a lower priority (background_niceness).
background() {
  local niceness=0
  if [ "$1" = --nice ]; then
    niceness=$background_niceness
    shift
  fi
  local name=$1
  shift
  set -m
  # renice, not nice: CMD may be a shell function.
  (renice -n "$niceness" -p "$BASHPID" >/dev/null && "$@") >"$logs/$name.log" 2>&1 &
  set +m
  bg_pids+=("$!")
  eval "bg_$name=$!"
}
# await NAME: waits for a background stage, prints its output and fails the run if it failed.
await() {
  local name=$1 pid rc=0
  pid=$(eval "echo \$bg_$name")
  wait "$pid" || rc=$?
  step "$name (ran in the background)"
  cat "$logs/$name.log"
  if [ "$rc" -ne 0 ]; then
    echo "$name failed (exit $rc)"
    exit "$rc"
  fi
}

install_venvs() {
  # shellcheck source=../infra/venv.sh
  . infra/venv.sh
  batchgen_venv
  batchgen_venv checkov
}
background venvs install_venvs

# cmd/batchgen's tests run batchgen as a process, a -race build of it; three stages run them
# (unit, chaos, emulator) and each built it again in its TestMain: one build instead, while
# the checks below run.
export BATCHGEN_TEST_BINARY=$logs/batchgen-race
background testbinary go build -race -o "$BATCHGEN_TEST_BINARY" ./cmd/batchgen

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go') 2>/dev/null || true)
if [ -n "$unformatted" ]; then echo "gofmt needed:"; echo "$unformatted"; exit 1; fi

# One pass over every file: the test tags only add files (no file is built for the absence of
# one), so the build with all of them holds every file of the builds with fewer, and the unit
# stage below still compiles the untagged build. One pass each instead of five: 382 s against
# 470 s for vet and staticcheck with an empty build cache on the two cores.
all_tags=emulator,chaos,browser,office
if git grep -nE '^//go:build .*!(emulator|chaos|browser|office)' -- '*.go'; then
  echo "a file is built without a test tag: vet and staticcheck would miss it in the one pass below"
  exit 1
fi
step "go vet"
go vet -tags "$all_tags" ./...

step "staticcheck (pinned in go.mod as a tool)"
go tool staticcheck -tags "$all_tags" ./...

await testbinary

step "unit and embedded integration tests (-race)"
# -p 4, four test binaries at once on the two cores: several packages mostly wait (cmd/batchgen
# on its subprocesses and mock models, sqlitequeue on visibility timeouts), and with two at a
# time the cores idled behind them (measured: 138-140 s against 149-173 s).
go test -race -count=1 -p 4 -timeout 20m ./...

# The web page in headless Chromium (chromedp) against batchgen serve, beside chaos and fuzz.
browser_tests() {
  # Installs Debian's chromium when it is missing; fails, never skips, when it cannot.
  local chromium
  chromium=$(scripts/ensure-chromium.sh)
  BATCHGEN_CHROMIUM=$chromium go test -count=1 -timeout 10m -tags browser -run '^TestBrowser' ./internal/web
}
background browser browser_tests

# Other spreadsheet programs read the round-tripped public workbooks: openpyxl (from the
# virtualenv) and LibreOffice (installed when missing), beside chaos and fuzz as well.
office_tests() {
  local soffice
  soffice=$(scripts/ensure-libreoffice.sh)
  # shellcheck source=../infra/venv.sh
  . infra/venv.sh
  batchgen_venv
  BATCHGEN_SOFFICE=$soffice BATCHGEN_PYTHON=$VENV/bin/python go test -count=1 -timeout 10m -tags office -run '^TestOffice' ./internal/sheet
}
background office office_tests

# The fuzz smoke starts beside the chaos loop, at a lower priority, and goes on through the
# emulator stage: it takes the CPU the stages in front leave.
# Counts, not durations: with a duration, go1.26's fuzz coordinator can report its own
# -fuzztime deadline as a failure ("context deadline exceeded", no crasher) when a worker
# is mid-run at the deadline on a loaded machine (golang/go#75804, fixed in go1.27).
# A count has no deadline to race. Each count is roughly 5 s of work on a quiet 2-core machine:
# a smoke pass that every change gets; `make fuzz` fuzzes each target for 30 s.
fuzz_smoke() {
  go test ./internal/prompt -run '^$' -fuzz '^FuzzRender$' -fuzztime 150000x
  go test ./internal/sheet -run '^$' -fuzz '^FuzzReadCSV$' -fuzztime 1500x -fuzzminimizetime 20x
  go test ./internal/sheet -run '^$' -fuzz '^FuzzReadXLSX$' -fuzztime 2500x -fuzzminimizetime 20x
  go test ./internal/sheet -run '^$' -fuzz '^FuzzAddColumns$' -fuzztime 5000x -fuzzminimizetime 20x
  go test ./internal/providerfile -run '^$' -fuzz '^FuzzParse$' -fuzztime 10000x -fuzzminimizetime 20x
  go test ./internal/schema -run '^$' -fuzz '^FuzzParseShort$' -fuzztime 20000x -fuzzminimizetime 20x
  go test ./internal/schema -run '^$' -fuzz '^FuzzValidate$' -fuzztime 30000x -fuzzminimizetime 20x
}
background --nice fuzz fuzz_smoke

step "chaos: SIGKILL loop (make test-chaos)"
go test -race -count=1 -tags chaos -run 'TestChaos|TestDiskFull' ./cmd/batchgen

await browser
await office
await venvs

step "AWS emulator (moto server) tests"
# Two moto servers, two lanes. A server is single-threaded where it matters (its DynamoDB
# requests are serialized, infra/emulator/moto_server_serialized.py), so the emulator tests wait
# on moto's one core; a second server on the second core halves the stage (measured: 141 s
# against 230 s for the same packages one at a time). Each lane keeps its own server, so a
# test's deadlines depend on one moto alone, as before.
# An assignment, not eval "$(...)": a failed start must stop the run.
emulator_env=$(infra/emulator/start.sh)
eval "$emulator_env"
export AWS_ENDPOINT_URL
[ -n "${AWS_ENDPOINT_URL:-}" ] || { echo "emulator did not report AWS_ENDPOINT_URL"; exit 1; }
second_emulator_dir=$PWD/.emulator-2
second_endpoint=$(BATCHGEN_EMULATOR_DIR=$second_emulator_dir infra/emulator/start.sh | sed -n 's/^AWS_ENDPOINT_URL=//p')
[ -n "$second_endpoint" ] || { echo "the second emulator did not report AWS_ENDPOINT_URL"; exit 1; }
cleanup_second_emulator() { BATCHGEN_EMULATOR_DIR=$second_emulator_dir infra/emulator/stop.sh >/dev/null 2>&1 || true; }

lambda_artifacts() {
  make --no-print-directory sizes
  for f in splitter generator exporter api sweeper events; do
    info=$(go version -m "bin/$f/bootstrap")
    for want in "GOOS=linux" "GOARCH=arm64" "CGO_ENABLED=0" "-tags=lambda.norpc"; do
      grep -q -- "$want" <<<"$info" || { echo "bin/$f/bootstrap: built without $want"; exit 1; }
    done
  done
  echo "6 bootstrap binaries for linux/arm64"
}
background --nice lint infra/lint.sh
background --nice artifacts lambda_artifacts

# The packages with emulator tests, each lane taking the next from one list, the package with
# the most emulator test code first (the whole stack's, internal/lambdafn), so the lanes end
# together. Only the tests of the emulator-tagged files run here: the rest of each package
# compiles the same without the tag and passed in the unit stage (cmd/batchgen's alone took
# 90 s again).
# The SQS queue adapter's tests are the exception: they send no DynamoDB request (the one
# thing moto serializes) and mostly wait on visibility timeouts, so they run beside the lanes,
# against the first server, in a queue of their own. Last in a lane, they were the stage's
# last 17 s with the cores idle.
beside_lanes="internal/queue/sqsqueue"
emulator_files=$(git grep -l '^//go:build emulator' -- '*_test.go')
emulator_queue=$logs/emulator-queue
for dir in $(xargs -n1 dirname <<<"$emulator_files" | sort -u | grep -vxF "$beside_lanes"); do
  # shellcheck disable=SC2046 # paths from git ls-files have no spaces
  echo "$(cat $(awk -v d="$dir" '{ f = $0; sub("/[^/]*$", "", f) } f == d' <<<"$emulator_files") | wc -c) $dir"
done | sort -rn | cut -d' ' -f2 >"$emulator_queue"
beside_queue=$logs/emulator-queue-beside
echo "$beside_lanes" >"$beside_queue"
# next_package QUEUE prints the next package of QUEUE and takes it off, under a lock.
next_package() {
  flock "$1" sh -c 'd=$(head -n 1 "$1"); [ -n "$d" ] || exit 1; sed -i 1d "$1"; echo "$d"' _ "$1"
}
# emulator_lane NAME ENDPOINT QUEUE: runs packages from QUEUE against the emulator at ENDPOINT.
emulator_lane() {
  local name=$1 endpoint=$2 queue=$3 dir files tests
  while dir=$(next_package "$queue"); do
    files=$(awk -v d="$dir" '{ f = $0; sub("/[^/]*$", "", f) } f == d' <<<"$emulator_files")
    # shellcheck disable=SC2086 # $files is a list of paths without spaces (git ls-files names)
    tests=$(sed -n -E 's/^func (Test[A-Za-z0-9_]+)\(.*/\1/p' $files | paste -sd'|')
    if [ -z "$tests" ]; then
      echo "$dir: its emulator-tagged files declare no Test function"
      echo "$dir" >>"$logs/emulator-failed"
      continue
    fi
    echo "--- $dir (lane $name)"
    # Not -parallel 4, although lambdafn alone ran 91 s -> 79 s with it: four whole-stack tests
    # at once on one moto stretched a task's rows apart past the economy lane's 2-s gather, and
    # TestEconomyOnTheStack saw three provider batches where it wants one.
    AWS_ENDPOINT_URL=$endpoint go test -race -count=1 -timeout 30m -tags emulator -run "^($tests)\$" "./$dir" ||
      echo "$dir" >>"$logs/emulator-failed"
  done >"$logs/emulator-lane-$name.log" 2>&1
}
emulator_lane beside "$AWS_ENDPOINT_URL" "$beside_queue" &
beside=$!
emulator_lane 1 "$AWS_ENDPOINT_URL" "$emulator_queue" &
lane1=$!
emulator_lane 2 "$second_endpoint" "$emulator_queue" &
lane2=$!
wait "$beside" "$lane1" "$lane2" || true
cat "$logs/emulator-lane-beside.log" "$logs/emulator-lane-1.log" "$logs/emulator-lane-2.log"
cleanup_second_emulator
if [ -s "$logs/emulator-failed" ]; then
  echo "emulator tests failed in: $(paste -sd' ' "$logs/emulator-failed")"
  exit 1
fi

# Named as the stages were before: template lint (cfn-lint, cfn-lint on the SAM translation,
# sam validate --lint, checkov) and the Lambda artifacts (make build: a static linux/arm64
# bootstrap per function).
await lint
await artifacts
await fuzz

step "done"
echo
echo "all tests passed"
