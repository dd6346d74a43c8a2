#!/usr/bin/env bash
# Builds the documentation site into site/ with mkdocs (mkdocs.yml): warnings are errors.
# Installs redis-lease with its extra 'docs' into .venv first (made when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[docs]'
# Material's notice about mkdocs 2.0 is printed, not logged: it is no warning under --strict.
NO_MKDOCS_2_WARNING=1 exec .venv/bin/mkdocs build --strict "$@"
