#!/usr/bin/env bash
# make bench: Go benchmarks of the hot paths, then a load run of the whole
# job against the mock OpenAI-compatible server, printed as ratios against
# baselines measured in this same run:
#
#   quota ratio   = wall time / (rows / quota rate)     target <= 1.10
#   speedup       = synchronous-loop time / batchgen time (same server, same rows)
#
# and last the AWS calls one 1,000-row job makes through the Lambda handlers on the emulator
# (moto, started here with infra/emulator/start.sh), counted by the awsops SDK middleware:
#
#   AWS calls per 1,000 rows                            budget <= 600 (model calls excluded)
#
# Tunables (environment): BENCH_ROWS (1500), BENCH_RPM (1200), BENCH_LATENCY (290ms),
# BENCH_BASELINE_ROWS (40), BENCH_TIME (Go -benchtime, 1s).
set -euo pipefail
cd "$(dirname "$0")/.."

rows=${BENCH_ROWS:-1500}
rpm=${BENCH_RPM:-1200}
latency=${BENCH_LATENCY:-290ms}
baseline_rows=${BENCH_BASELINE_ROWS:-40}
benchtime=${BENCH_TIME:-1s}
out=bench-results
mkdir -p "$out"
work=$(mktemp -d)
trap 'kill $mock_pid 2>/dev/null || true; rm -rf "$work"' EXIT

echo "=== Go benchmarks (-benchtime $benchtime)"
go test -run '^$' -bench . -benchmem -benchtime "$benchtime" ./internal/... | tee "$out/go-bench.txt" | grep -E '^(Benchmark|ok|PASS|FAIL)' || true

echo
echo "=== Load: $rows rows, --rpm $rpm, model latency $latency"
go build -o bin/batchgen ./cmd/batchgen
port_file=$work/mock.out
bin/batchgen mock-llm --addr 127.0.0.1:0 --latency "$latency" --quota "$rpm" --quota-window 60s >"$port_file" 2>&1 &
mock_pid=$!
for _ in $(seq 1 50); do grep -q listening "$port_file" 2>/dev/null && break; sleep 0.1; done
base_url=$(sed -n 's/.*listening on \(http:[^ ]*\/v1\).*/\1/p' "$port_file")
stats_url=${base_url%/v1}/stats
[ -n "$base_url" ] || { echo "mock-llm did not start:"; cat "$port_file"; exit 1; }

make_csv() { # rows file tag
  { echo "sku,name"; for i in $(seq 1 "$1"); do echo "SKU-$3-$i,product $i"; done; } >"$2"
}
now() { date +%s.%N; }
calc() { python3 -c "print($1)"; }
http() { python3 -c "import sys,urllib.request; r=urllib.request.Request(sys.argv[1], method=sys.argv[2]); print(urllib.request.urlopen(r).read().decode())" "$1" "${2:-GET}"; }

# Baseline: the synchronous loop the design replaces (one call at a time).
make_csv "$baseline_rows" "$work/baseline.csv" base
t0=$(now)
bin/batchgen run --in "$work/baseline.csv" --data "$work/data-base" --prompt '{{sku}} {{name}}' \
  --provider openai --base-url "$base_url" --concurrency 1 --quiet >/dev/null
t1=$(now)
per_row=$(calc "($t1 - $t0) / $baseline_rows")
http "${base_url%/v1}/reset" POST >/dev/null

make_csv "$rows" "$work/load.csv" load
t0=$(now)
bin/batchgen run --in "$work/load.csv" --data "$work/data-load" --prompt '{{sku}} {{name}}' \
  --provider openai --base-url "$base_url" --rpm "$rpm" --concurrency 32 --quiet | tee "$out/load-summary.txt"
t1=$(now)
stats=$(http "$stats_url")
limited=$(echo "$stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["rate_limited"])')

wall=$(calc "$t1 - $t0")
bound=$(calc "$rows / ($rpm / 60)")
sync=$(calc "$per_row * $rows")
{
  printf 'rows                 %d\n' "$rows"
  printf 'quota                %d requests/min\n' "$rpm"
  printf 'wall time            %.1f s\n' "$wall"
  printf 'quota bound          %.1f s  (rows / rate)\n' "$bound"
  printf 'quota ratio          %.3f  (target <= 1.10)\n' "$(calc "$wall / $bound")"
  printf 'synchronous baseline %.1f s  (%.0f ms/row measured on %d rows)\n' "$sync" "$(calc "$per_row * 1000")" "$baseline_rows"
  printf 'speedup vs baseline  %.1fx\n' "$(calc "$sync / $wall")"
  printf '429 responses        %s  (target 0)\n' "$limited"
} | tee "$out/load.txt"

echo
echo "=== AWS calls per 1,000 rows (Lambda handlers on the emulator, counted by internal/awsops)"
if [ -z "${AWS_ENDPOINT_URL:-}" ]; then
  eval "$(infra/emulator/start.sh)" || { echo "the AWS emulator did not start; see infra/emulator/start.sh"; exit 1; }
  export AWS_ENDPOINT_URL
fi
go test -count=1 -tags emulator -run '^TestAWSCallsPerThousandRows$' -v ./internal/lambdafn/ >"$out/aws-calls.log" 2>&1 \
  || { tail -n 40 "$out/aws-calls.log"; echo "the AWS call count test failed (full log: $out/aws-calls.log)"; exit 1; }
grep -E 'AWS calls (per 1,000 rows|by operation)' "$out/aws-calls.log" | sed 's/^ *e2e_test.go:[0-9]*: //' | tee "$out/aws-calls.txt"
