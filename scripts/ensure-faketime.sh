#!/usr/bin/env bash
# Makes sure the fault tests can skew a worker's clock: libfaketime (Debian package
# faketime). It is installed from Debian's packages when it is missing and this runs
# as root; otherwise this says how to install it and exits 1 (under CI=true the
# clock-skew test fails without it, elsewhere it is skipped).
set -euo pipefail
for lib in /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1; do
  if [ -e "$lib" ]; then exit 0; fi
done
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing faketime (Debian package)..." >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends faketime >/dev/null
  exit 0
fi
echo "libfaketime is not installed: apt-get install faketime (or run as root)" >&2
exit 1
