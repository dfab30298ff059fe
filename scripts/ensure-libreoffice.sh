#!/usr/bin/env bash
# Makes sure LibreOffice (headless, for --convert-to) is installed for the office
# round-trip test (go test -tags office ./internal/sheet) and prints the path of
# soffice. Installs Debian's `libreoffice-calc-nogui` when it is missing (about
# 20 s on the development machine). CI runs as root like the development machine.
# Fails — never skips — when it cannot be installed.
set -euo pipefail

bin=${BATCHGEN_SOFFICE:-/usr/bin/soffice}
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  sudo=
elif command -v sudo >/dev/null; then
  sudo=sudo
else
  echo "ensure-libreoffice: LibreOffice missing and we are neither root nor have sudo to apt-get install it" >&2
  exit 1
fi
command -v apt-get >/dev/null || { echo "ensure-libreoffice: LibreOffice missing and there is no apt-get; install it and set BATCHGEN_SOFFICE" >&2; exit 1; }

echo "ensure-libreoffice: installing libreoffice-calc-nogui (Debian packages)" >&2
export DEBIAN_FRONTEND=noninteractive
# The browser stage may be installing Chromium at the same time: apt takes one at a time.
exec 9>/tmp/batchgen-apt.lock
flock 9
$sudo apt-get update -qq >&2
$sudo apt-get install -y -qq --no-install-recommends libreoffice-calc-nogui >&2
exec 9>&-

[ -x "$bin" ] || { echo "ensure-libreoffice: apt-get finished but $bin is still missing" >&2; exit 1; }
echo "$bin"
