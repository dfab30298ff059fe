#!/usr/bin/env bash
# Creates or refreshes the project's Python virtualenvs from their requirements files. Source it
# to get $VENV; run it to just install. Re-running is cheap: the install is skipped while the
# requirements file is unchanged since the last successful install.
#
#   batchgen_venv           infra/requirements.txt (moto, cfn-lint, SAM CLI) into $BATCHGEN_VENV
#   batchgen_venv checkov   infra/requirements-checkov.txt into $BATCHGEN_CHECKOV_VENV: checkov
#                           pins boto3 to a version aws-sam-cli cannot use, so it gets its own
#
#   BATCHGEN_VENV          virtualenv directory (default: <repo>/.venv)
#   BATCHGEN_CHECKOV_VENV  checkov's virtualenv (default: $BATCHGEN_VENV-checkov)
#   PYTHON                 interpreter used to create them (default: python3)

batchgen_venv() {
  local root req stamp want lock log
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  VENV=${BATCHGEN_VENV:-$root/.venv}
  req=$root/infra/requirements.txt
  if [ "${1:-}" = checkov ]; then
    VENV=${BATCHGEN_CHECKOV_VENV:-$VENV-checkov}
    req=$root/infra/requirements-checkov.txt
  fi
  stamp=$VENV/.requirements.sha256
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  mkdir -p "$VENV"
  # Two scripts may install at once (make test runs lint and emulator); the second one waits.
  lock=$VENV/.install.lock
  exec 9>"$lock"
  flock 9
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    exec 9>&-
    return 0
  fi
  log=$VENV/.install.log
  echo "venv: installing ${req#"$root"/} into $VENV (first run takes a minute)" >&2
  if ! { "${PYTHON:-python3}" -m venv "$VENV" &&
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$req"; } >"$log" 2>&1; then
    echo "venv: install failed; last lines of $log:" >&2
    tail -n 30 "$log" >&2
    exec 9>&-
    return 1
  fi
  echo "$want" >"$stamp"
  exec 9>&-
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  batchgen_venv "$@"
  echo "$VENV"
fi
