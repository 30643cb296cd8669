#!/usr/bin/env bash
# The benchmark (benchmarks/run.py): this pipeline vs naive anti-join, recompute, Structured
# Streaming and a plain copy, side by side in one run. `--quick`: every part once on tiny data, a few minutes.
# The full run (--backfill-hours 24) takes 1-1.75 h on 2 cores and ~15 GB in benchmarks/work/;
# --long (T2 at 720 h) ~45 min and ~15 GB more in benchmarks/work/long/.
# --s3: the S3 point (benchmarks/s3.py, SeaweedFS on 127.0.0.1): S3 vs local disk, requests per load.
# --peers: the lake-native peers (benchmarks/peers.py): (h) Spark + Delta MERGE and (i) DuckDB +
#   delta-rs MERGE against this pipeline every hour to 171 h (~40 min; (h)'s venv, built once by
#   scripts/merge_spark_env.sh, 3-5 min).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m benchmarks "$@"
