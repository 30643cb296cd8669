"""Benchmarks of dedup_pipeline against its peers (`python -m benchmarks`, `./scripts/bench.sh`)."""
