#!/usr/bin/env bash
# ruff (lint and format) and mypy --strict on the package.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy --strict redis_lease
