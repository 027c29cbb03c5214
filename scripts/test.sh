#!/usr/bin/env bash
# The test command from the README: creates .venv if needed, installs, runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
exec .venv/bin/pytest -q "$@"
