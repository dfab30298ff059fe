#!/usr/bin/env bash
# Stops the moto server started by infra/emulator/start.sh. Succeeds when none is running.
#
#   BATCHGEN_EMULATOR_DIR  state directory (default: <repo>/.emulator)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
state=${BATCHGEN_EMULATOR_DIR:-$root/.emulator}
pidfile=$state/pid

say() { echo "emulator: $*" >&2; }
is_moto() { [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q moto_server; }

if [ ! -f "$pidfile" ]; then
  say "not running"
  rm -f "$state/env"
  exit 0
fi
pid=$(cat "$pidfile")
# Only signal the pid if it is still our server: after a reboot the number may belong to anything.
if kill -0 "$pid" 2>/dev/null && is_moto "$pid"; then
  kill -TERM "$pid"
  deadline=$((SECONDS + 10))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    say "pid $pid ignored TERM; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  say "stopped pid $pid"
else
  say "pid $pid is not running"
fi
rm -f "$pidfile" "$state/env"
