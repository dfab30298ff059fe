#!/usr/bin/env bash
# Makes sure a headless Chromium is installed for the browser tests
# (go test -tags browser ./internal/web) and prints its path. Installs
# Debian's `chromium` package when it is missing, and a small CJK font
# (fonts-wqy-microhei) so the Chinese page renders as text, not boxes, in
# the screenshots. CI runs as root like the development machine.
# Fails — never skips — when Chromium cannot be installed, so the browser
# tests can never silently not run.
set -euo pipefail

bin=${BATCHGEN_CHROMIUM:-/usr/bin/chromium}
font=/usr/share/fonts/truetype/wqy/wqy-microhei.ttc

missing=()
[ -x "$bin" ] || missing+=(chromium)
[ -e "$font" ] || missing+=(fonts-wqy-microhei)
if [ ${#missing[@]} -eq 0 ]; then
  echo "$bin"
  exit 0
fi

"$(dirname "$0")"/apt-install.sh ensure-chromium "${missing[@]}" || { echo "ensure-chromium: install Chromium and set BATCHGEN_CHROMIUM" >&2; exit 1; }

[ -x "$bin" ] || { echo "ensure-chromium: apt-get finished but $bin is still missing" >&2; exit 1; }
"$bin" --version >&2
echo "$bin"
