#!/usr/bin/env bash
# The whole test suite (real local Spark, real Dagster), slow tests included: what CI runs, and the
# README's test command, which installs what it needs first (setup.sh; design.md N4).
#   ./scripts/test.sh --fast   the fast tier only (pytest marker `fast`), in under 2 minutes: every
#                              test that starts no Spark and no service (marked by conftest.py) plus
#                              every rule R1-R12 on small data and a Dagster materialization; the map
#                              of which test covers which rule is in dedup_pipeline_tests/conftest.py.
#   TEST_WORKERS=1 ./scripts/test.sh   one process (default 2: the files spread over two pytest-xdist
#                                      workers, each file whole on one worker, since the service
#                                      tests share a webserver, daemon or server per file).
# Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
marker=()
if [ "${1:-}" = "--fast" ]; then
  shift
  marker=(-m fast)
fi
./scripts/setup.sh
.venv/bin/ruff check .
workers=(-n "${TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
if [ "${TEST_WORKERS:-2}" = "1" ]; then
  workers=(-p no:xdist)
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "${workers[@]}" "${marker[@]}" "$@"
