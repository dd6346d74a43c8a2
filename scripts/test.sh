#!/usr/bin/env bash
# Sets up .venv and runs the whole test suite against a real Redis (and fakeredis).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/ensure-redis.sh
# libfaketime for the clock-skew fault tests: required under CI=true, else they skip
scripts/ensure-faketime.sh || [ "${CI:-}" != "true" ]
exec .venv/bin/python -m pytest "$@"
