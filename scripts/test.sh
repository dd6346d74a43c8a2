#!/usr/bin/env bash
# Sets up .venv and runs the whole test suite against a real Redis (and fakeredis).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/ensure-redis.sh
# libfaketime for the clock-skew fault tests: required under CI=true, else they skip
scripts/ensure-faketime.sh || [ "${CI:-}" != "true" ]
# promtool for the alert-rule tests: required under CI=true, else they skip
scripts/ensure-promtool.sh || [ "${CI:-}" != "true" ]
# Chromium for the dashboard's browser tests: required under CI=true, else they skip
scripts/ensure-browser.sh || [ "${CI:-}" != "true" ]
exec .venv/bin/python -m pytest "$@"
