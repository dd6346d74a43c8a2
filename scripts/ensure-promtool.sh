#!/usr/bin/env bash
# Makes sure the alert-rule tests can run promtool: on PATH, or in the project's cache
# (.cache/promtool/usr/bin/promtool, git-ignored). When it is missing and this runs as
# root with apt, it downloads Debian's prometheus package (nothing is installed, no
# service set up) and extracts only promtool, a static binary, into that cache;
# otherwise it says how and exits 1 (under CI=true the promtool tests fail without it,
# elsewhere they are skipped).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="$root/.cache/promtool"
tool="$cache/usr/bin/promtool"
if command -v promtool >/dev/null 2>&1 || [ -x "$tool" ]; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then
  echo "fetching promtool (from Debian's prometheus package) into $cache..." >&2
  work="$(mktemp -d)"
  chmod 755 "$work" # apt downloads as its own user
  trap 'rm -rf "$work"' EXIT
  apt-get update -qq
  (cd "$work" && apt-get download -qq prometheus >/dev/null)
  dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
  mkdir -p "$cache/usr/bin"
  install -m 755 "$work/root/usr/bin/promtool" "$tool.new"
  mv "$tool.new" "$tool"
  "$tool" --version >/dev/null
  exit 0
fi
echo "promtool is missing: run scripts/ensure-promtool.sh as root (it extracts promtool from" \
  "Debian's prometheus package into .cache/promtool), or put promtool on PATH" >&2
exit 1
