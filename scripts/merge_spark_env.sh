#!/usr/bin/env bash
# The environment of the benchmark's peer (h), Spark + Delta Lake insert-only MERGE
# (benchmarks/peers.py): no delta-spark release supports the pyspark the product installs (4.3;
# delta-spark 4.4's PyPI package declares pyspark<=4.2), so (h) runs in a venv of its own with
# the newest pyspark delta-spark supports, 4.2.0, plus delta-spark's jars from Maven Central
# (io.delta:delta-spark_4.2_2.13 and io.delta:delta-storage, 4.4.0). The product is installed into
# it from this checkout (editable), so (h) parses and orders with the product's own code.
# Cached under $DEDUP_SPARK_JARS_CACHE (default ~/.cache/dedup_pipeline/spark-jars), in a directory
# named for those versions and this checkout's pyproject.toml: a second run does nothing.
# The first build takes 3-5 minutes (pyspark 4.2.0 is a ~450 MB source distribution).
# Prints the directory (venv/ and jars/ inside it). `--cached`: print it only if already built
# (exit 1 otherwise), never build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYSPARK=4.2.0
DELTA=4.4.0
digest=$(sha256sum pyproject.toml | cut -c1-12)
cache="${DEDUP_SPARK_JARS_CACHE:-$HOME/.cache/dedup_pipeline/spark-jars}/delta-$DELTA-spark-$PYSPARK-py-$digest"
if [ -f "$cache/.complete" ]; then
  echo "$cache"
  exit 0
fi
[ "${1:-}" != "--cached" ] || exit 1
command -v mvn >/dev/null 2>&1 || {
  echo "merge_spark_env: Maven (mvn) is needed to fetch delta-spark's jars (apt-get install maven)" >&2
  exit 1
}
echo "merge_spark_env: building pyspark $PYSPARK + delta-spark $DELTA into $cache (3-5 min the first time)" >&2
tmp="$cache.tmp-$$"
rm -rf "$tmp"
mkdir -p "$tmp/jars"
trap 'rm -rf "$tmp"' EXIT
for a in "io.delta:delta-spark_4.2_2.13:$DELTA" "io.delta:delta-storage:$DELTA"; do
  mvn -B -q dependency:copy -Dartifact="$a" -DoutputDirectory="$tmp/jars" >&2
done
rm -rf "$cache/venv" "$cache/jars"
python3.11 -m venv "$cache/venv"
"$cache/venv/bin/python" -m pip install -q --upgrade pip >&2
"$cache/venv/bin/python" -m pip install -q "pyspark==$PYSPARK" "delta-spark==$DELTA" -e . >&2
mv "$tmp/jars" "$cache/jars"
touch "$cache/.complete"
echo "merge_spark_env: $(ls "$cache"/jars/*.jar | wc -l) jars, venv $(du -sh "$cache/venv" | cut -f1)" >&2
echo "$cache"
