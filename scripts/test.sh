#!/usr/bin/env bash
# The whole test suite (real local Spark, real Dagster), slow tests included. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
