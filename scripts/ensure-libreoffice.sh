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

"$(dirname "$0")"/apt-install.sh ensure-libreoffice libreoffice-calc-nogui || { echo "ensure-libreoffice: install LibreOffice and set BATCHGEN_SOFFICE" >&2; exit 1; }

[ -x "$bin" ] || { echo "ensure-libreoffice: apt-get finished but $bin is still missing" >&2; exit 1; }
echo "$bin"
