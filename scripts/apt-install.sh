#!/usr/bin/env bash
# apt-install.sh WHO PACKAGE...: installs Debian packages for a test stage
# (scripts/ensure-chromium.sh, scripts/ensure-libreoffice.sh), as root or
# through sudo, one install at a time across stages (apt takes one lock),
# with the package index refreshed first: an outdated index is the usual
# reason an install fails on a fresh machine. WHO names the caller in
# messages. Fails when it cannot install.
set -euo pipefail
who=$1
shift
if [ "$(id -u)" -eq 0 ]; then
  sudo=
elif command -v sudo >/dev/null; then
  sudo=sudo
else
  echo "$who: $* missing and we are neither root nor have sudo to apt-get install it" >&2
  exit 1
fi
command -v apt-get >/dev/null || { echo "$who: $* missing and there is no apt-get" >&2; exit 1; }
echo "$who: installing $* (Debian packages)" >&2
export DEBIAN_FRONTEND=noninteractive
exec 9>/tmp/batchgen-apt.lock
flock 9
$sudo apt-get update -qq >&2
$sudo apt-get install -y -qq --no-install-recommends "$@" >&2
