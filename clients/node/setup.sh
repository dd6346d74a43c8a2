#!/usr/bin/env bash
# Installs the Node client's dependencies (ioredis, from package-lock.json) into
# clients/node/node_modules when they are missing. Needs Node.js 18+ and npm.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "clients/node: node and npm are needed: apt-get install nodejs npm (Node.js 18 or newer)" >&2
  exit 1
fi
if [ ! -d node_modules/ioredis ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
