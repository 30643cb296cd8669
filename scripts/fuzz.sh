#!/usr/bin/env bash
# Fuzz the landing parsers for as long as asked (docs/design.md R9, "Total parsing").
#   ./scripts/fuzz.sh --minutes 30 [--format jsonl|csv|parquet] [--examples 50]
# Runs dedup_pipeline_tests/test_fuzz_landing.py round after round, each with a fresh random seed,
# until the time is up or an example fails. A failure prints Hypothesis's shrunk reproduction
# (the falsifying files, and a @reproduce_failure line) and keeps the hour's landing files in
# ./fuzz-failures/. CI runs the same tests with a fixed seed and 12 examples per format.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=10 fmt="" examples=50
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --format) fmt="$2"; shift 2 ;;
    --examples) examples="$2"; shift 2 ;;
    *) echo "fuzz: unknown argument $1 (--minutes N, --format jsonl|csv|parquet, --examples N)" >&2; exit 2 ;;
  esac
done
case "$fmt" in
  "") select=() ;;
  jsonl) select=(-k json) ;;
  csv|parquet) select=(-k "$fmt") ;;
  *) echo "fuzz: --format is jsonl, csv or parquet" >&2; exit 2 ;;
esac
./scripts/setup.sh
mkdir -p fuzz-failures
end=$(( $(date +%s) + minutes * 60 ))
round=0
while [ "$(date +%s)" -lt "$end" ]; do
  round=$((round + 1))
  echo "fuzz: round $round ($examples examples per format, random seed)"
  DEDUP_FUZZ_RANDOM=1 DEDUP_FUZZ_EXAMPLES="$examples" DEDUP_FUZZ_KEEP="$PWD/fuzz-failures" \
    .venv/bin/python -m pytest -q -p no:cacheprovider -p no:xdist -x \
    dedup_pipeline_tests/test_fuzz_landing.py "${select[@]}" || {
      echo "fuzz: a failing example; its landing files are in fuzz-failures/" >&2; exit 1; }
done
echo "fuzz: $round round(s), no failure in $minutes minute(s)"
