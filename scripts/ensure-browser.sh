#!/usr/bin/env bash
# Makes sure the dashboard's browser tests have a Chromium: Debian's chromium package at
# /usr/bin/chromium (or the executable named by REDIS_LEASE_CHROMIUM). Playwright drives it;
# its own browser download is never used. The package is installed when it is missing and
# this runs as root; otherwise this says how to install it and exits 1 (under CI=true the
# browser tests fail without it, elsewhere they are skipped).
set -euo pipefail
browser="${REDIS_LEASE_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$browser" ]; then exit 0; fi
if [ -n "${REDIS_LEASE_CHROMIUM:-}" ]; then
  echo "REDIS_LEASE_CHROMIUM=$browser is not an executable: point it at a Chromium or unset it" >&2
  exit 1
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium (Debian package)..." >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  exit 0
fi
echo "chromium is not installed: apt-get install chromium (or run as root)" >&2
exit 1
