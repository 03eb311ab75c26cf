#!/usr/bin/env bash
# Install stare with its test dependencies into .venv and run the test suite.
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
exec .venv/bin/python -m pytest "$@"
