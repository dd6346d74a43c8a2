#!/usr/bin/env bash
# Installs the Node client's dependencies (ioredis, from package-lock.json) into
# clients/node/node_modules when they are missing or differ from the lock file.
# Needs Node.js 18+ and npm.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "clients/node: node and npm are needed: apt-get install nodejs npm (Node.js 18 or newer)" >&2
  exit 1
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 18 ]; then
  echo "clients/node: Node.js 18 or newer is needed, found $(node --version): upgrade Node.js" >&2
  exit 1
fi
# npm ci records the installed tree in node_modules/.package-lock.json: reinstall when the
# lock file changed since (or nothing is installed).
if [ ! -d node_modules/ioredis ] || [ package-lock.json -nt node_modules/.package-lock.json ] \
  || ! node -e '
    const fs = require("fs");
    const want = JSON.parse(fs.readFileSync("package-lock.json")).packages;
    const have = JSON.parse(fs.readFileSync("node_modules/.package-lock.json")).packages;
    for (const [path, entry] of Object.entries(want)) {
      if (path && (!have[path] || have[path].version !== entry.version)) process.exit(1);
    }' 2>/dev/null; then
  npm ci --no-audit --no-fund --loglevel=error
fi
