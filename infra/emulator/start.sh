#!/usr/bin/env bash
# Starts the local AWS emulator (moto server) on a free loopback port, or reuses the one already
# running, and prints the one line tests need on stdout:
#
#   AWS_ENDPOINT_URL=http://127.0.0.1:PORT
#
# so `eval "$(infra/emulator/start.sh)"; export AWS_ENDPOINT_URL` works. The line is also written
# to $STATE/env. Everything else goes to stderr. Exits non-zero, with the server log tail, when the
# emulator cannot start. Stop it with infra/emulator/stop.sh.
#
#   BATCHGEN_EMULATOR_DIR  state directory: pid, env, moto.log (default: <repo>/.emulator)
#   EMULATOR_PORT          port to use instead of a free one
#   EMULATOR_START_TIMEOUT seconds to wait for the server to answer (default: 60)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../venv.sh
. "$root/infra/venv.sh"
state=${BATCHGEN_EMULATOR_DIR:-$root/.emulator}
pidfile=$state/pid
envfile=$state/env
log=$state/moto.log

say() { echo "emulator: $*" >&2; }
started=""  # pid of the server this run launched and still owns
launched="" # set once this run has launched a server, so its log is worth showing
die() {
  say "$*"
  if [ -n "$launched" ] && [ -s "$log" ]; then
    say "last lines of $log:"
    tail -n 40 "$log" >&2
  fi
  # Never leave a half-started server behind: the next start could not tell it from a good one.
  if [ -n "$started" ]; then
    kill "$started" 2>/dev/null || true
    rm -f "$pidfile" "$envfile"
  fi
  exit 1
}

is_moto() { [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q moto_server; }

# answers URL: the server is up when its admin API returns its config.
answers() { curl -fsS --max-time 2 -o /dev/null "$1/moto-api/config" 2>/dev/null; }

# configure URL: Step Functions executions only run the definition when asked to; the tests
# exercise the export state machine's catch path, so turn it on. (moto's GET config does not
# echo this setting back; the samstack tests that execute the state machine prove it took.)
configure() {
  curl -fsS --max-time 5 -o /dev/null -X POST -H 'Content-Type: application/json' \
    -d '{"stepfunctions": {"execute_state_machine": true}}' "$1/moto-api/config" ||
    die "POST $1/moto-api/config failed"
}

free_port() {
  "$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# port_free PORT: nothing listens there. Checked before starting because another server on the
# port would answer the readiness probe in place of ours.
port_free() {
  "$VENV/bin/python" -c 'import socket, sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null
}

announce() {
  echo "AWS_ENDPOINT_URL=$1" >"$envfile"
  say "moto server at $1 (pid $(cat "$pidfile"), log $log)"
  echo "AWS_ENDPOINT_URL=$1"
}

batchgen_venv || die "cannot install the emulator into $VENV"
mkdir -p "$state"

# Reuse a running server: starting twice must not leak a second one.
if [ -f "$pidfile" ]; then
  pid=$(cat "$pidfile")
  url=$(sed -n 's/^AWS_ENDPOINT_URL=//p' "$envfile" 2>/dev/null || true)
  if kill -0 "$pid" 2>/dev/null && is_moto "$pid" && [ -n "$url" ] && answers "$url"; then
    configure "$url"
    announce "$url"
    exit 0
  fi
  say "stale state in $state (pid $pid not serving); starting afresh"
  if kill -0 "$pid" 2>/dev/null && is_moto "$pid"; then kill "$pid" 2>/dev/null || true; fi
  rm -f "$pidfile" "$envfile"
fi

deadline_s=${EMULATOR_START_TIMEOUT:-60}
for try in 1 2 3; do
  port=${EMULATOR_PORT:-$(free_port)}
  url=http://127.0.0.1:$port
  port_free "$port" || die "port $port on 127.0.0.1 is already in use"
  # setsid: the server outlives this script and is not hit by the caller's Ctrl-C.
  # moto_server_serialized.py is moto's server with DynamoDB requests
  # serialized, so conditional writes are atomic as on AWS (see the file).
  setsid "$VENV/bin/python" "$root/infra/emulator/moto_server_serialized.py" -H 127.0.0.1 -p "$port" >"$log" 2>&1 </dev/null &
  pid=$!
  started=$pid
  launched=1
  echo "$pid" >"$pidfile"
  deadline=$((SECONDS + deadline_s))
  while ! answers "$url"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      break
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      die "moto server did not answer at $url within ${deadline_s}s"
    fi
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    configure "$url"
    announce "$url"
    exit 0
  fi
  started=""
  rm -f "$pidfile"
  # The free port may have been taken between choosing and binding it; a fixed port will not get better.
  if [ -n "${EMULATOR_PORT:-}" ]; then break; fi
  say "moto server exited at start (try $try); retrying on another port"
done
die "moto server exited at start"
