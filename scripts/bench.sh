#!/usr/bin/env bash
# The benchmark (benchmarks/run.py): this pipeline vs naive anti-join, recompute, Structured
# Streaming and a plain copy, side by side in one run. `--quick` for a minute on tiny data.
# The full run takes about an hour on 2 cores and ~15 GB in benchmarks/work/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m benchmarks "$@"
