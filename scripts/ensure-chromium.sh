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

if [ "$(id -u)" -eq 0 ]; then
  sudo=
elif command -v sudo >/dev/null; then
  sudo=sudo
else
  echo "ensure-chromium: ${missing[*]} missing and we are neither root nor have sudo to apt-get install it" >&2
  exit 1
fi
command -v apt-get >/dev/null || { echo "ensure-chromium: ${missing[*]} missing and there is no apt-get; install Chromium and set BATCHGEN_CHROMIUM" >&2; exit 1; }

echo "ensure-chromium: installing ${missing[*]} (Debian packages)" >&2
export DEBIAN_FRONTEND=noninteractive
# The office stage may be installing LibreOffice at the same time: apt takes one at a time.
exec 9>/tmp/batchgen-apt.lock
flock 9
# An outdated package index is the usual reason an install fails on a
# fresh machine, so refresh it first.
$sudo apt-get update -qq >&2
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
exec 9>&-

[ -x "$bin" ] || { echo "ensure-chromium: apt-get finished but $bin is still missing" >&2; exit 1; }
"$bin" --version >&2
echo "$bin"
