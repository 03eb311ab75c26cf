#!/usr/bin/env bash
# The habits the tests do not time: lint, format, types, layers. Run by scripts/test.sh (so by CI) and by
# pre-commit (.pre-commit-config.yaml). PY: the Python whose ruff / mypy / lint-imports to use.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(dirname "${PY:-.venv/bin/python}")
"$BIN/ruff" check .
"$BIN/ruff" format --check .
"$BIN/mypy"            # [tool.mypy] files: the core and the algorithm, strict
"$BIN/lint-imports"    # [tool.importlinter] on the source tree
