#!/usr/bin/env bash
# Makes sure the tests can have a real Redis: REDIS_URL, a Redis on 127.0.0.1:6379,
# or an installed redis-server for the suite to start (installed from Debian's
# packages when missing and running as root).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${REDIS_URL:-}" ]; then exit 0; fi
if command -v redis-server >/dev/null 2>&1; then exit 0; fi
if .venv/bin/python -c "import redis,sys; sys.exit(0 if redis.Redis(socket_connect_timeout=1).ping() else 1)" 2>/dev/null; then
  echo "note: redis-server is not installed; tests that start a private server need it" >&2
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing redis-server (Debian package)..." >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  exit 0
fi
echo "no Redis: set REDIS_URL, run Redis on 127.0.0.1:6379, or install redis-server" >&2
exit 1
