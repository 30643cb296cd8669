#!/usr/bin/env bash
# Create .venv in the repo and install the package with its dev tools (idempotent: reinstalls only
# when pyproject.toml changed). Needs Python 3.11+ and Java 17+ on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for c in python3.13 python3.12 python3.11 python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      PY="$c"; break
    fi
  done
fi
[ -n "$PY" ] || { echo "setup: need Python 3.11+ (set PYTHON=/path/to/python3.11)" >&2; exit 1; }

if ! command -v java >/dev/null 2>&1; then
  echo "setup: Java 17+ is required by PySpark 4 (e.g. apt-get install openjdk-17-jre-headless)" >&2
  exit 1
fi
jv=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
if [ -n "$jv" ] && [ "$jv" -lt 17 ]; then
  echo "setup: Java $jv found, PySpark 4 needs Java 17+" >&2; exit 1
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PY"
  "$PY" -m venv .venv
fi
stamp=.venv/.dedup-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing dedup_pipeline and its dependencies into .venv (first time: a few minutes)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[dev]"
  echo "$want" > "$stamp"
fi
# Spark's S3 connector (hadoop-aws, the AWS SDK v2 modules, spark-hadoop-cloud) from Maven Central,
# matched to the installed pyspark and cached (a second run finds the cache and does nothing)
./scripts/fetch_jars.sh .venv/bin/python >/dev/null
