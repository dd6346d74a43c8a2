#!/usr/bin/env bash
# Makes sure the tests can have a real Redis. The suite uses REDIS_LEASE_TEST_URL, else
# REDIS_URL, else a Redis on 127.0.0.1:6379, else a redis-server it starts itself; tests
# that kill, restart or reconfigure a server always start a private redis-server. So the
# redis-server binary is needed in every case: it is installed from Debian's packages
# when it is missing and this runs as root.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing redis-server (Debian package)..." >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  # The package may start a service on 6379; the suite would then use it, which is fine.
  exit 0
fi
echo "redis-server is not installed: apt-get install redis-server (or run as root)" >&2
exit 1
