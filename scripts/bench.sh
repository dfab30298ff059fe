#!/usr/bin/env bash
# make bench / make bench-quick: builds batchgen and the bench driver
# (cmd/batchgen-bench) and prints the one benchmark table: every figure a
# ratio against a bound or a same-run baseline, with its target and met or
# MISSED; the same goes to bench-results/bench-<time>.json (and latest.json)
# for `make bench-compare OLD=... NEW=...`. Arguments go to the driver:
#
#   scripts/bench.sh                 every figure (about seventeen minutes on 2 cores)
#   scripts/bench.sh --quick         the reduced set, about three minutes
#   scripts/bench.sh --only quota    one group (see batchgen-bench --help)
#
# The AWS-calls figure uses $AWS_ENDPOINT_URL, or starts the emulator
# (infra/emulator/start.sh). The Go micro-benchmarks of the hot paths are
# `make bench-go`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin
go build -o bin/batchgen ./cmd/batchgen
go build -o bin/batchgen-bench ./cmd/batchgen-bench
exec bin/batchgen-bench "$@"
