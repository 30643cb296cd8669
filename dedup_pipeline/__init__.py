"""dedup_pipeline: deduplicate hourly at-least-once batches into a clean Parquet lake table on
PySpark, orchestrated by Dagster. The engine (`dedup_pipeline.engine`) has no Dagster import; the
Dagster layer lives in `dedup_pipeline.orchestration`."""

__version__ = "0.1.0"
