#!/usr/bin/env bash
# Generate a sample landing zone in ./demo and load it hour by hour through Dagster on local Spark.
# The README's demo command: it installs what it needs first (setup.sh; design.md N4).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/dedup-pipeline demo "$@"
