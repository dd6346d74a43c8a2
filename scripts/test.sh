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
# Tests spend most of their time waiting (TTLs, heartbeats, process starts), so more
# pytest-xdist workers than cores pay; each worker has its own Redis (tests/conftest.py).
# Arguments given later win: scripts/test.sh -n 0 runs in one process.
exec .venv/bin/python -m pytest -n "${TEST_WORKERS:-4}" --dist worksteal "$@"
