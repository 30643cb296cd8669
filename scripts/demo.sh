#!/usr/bin/env bash
# Make the dg project ./demo with one DedupDataset, generate its sample hours and load them through
# Dagster on local Spark.
# The README's demo command: it installs what it needs first (setup.sh; design.md N4).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/dedup-pipeline demo "$@"
