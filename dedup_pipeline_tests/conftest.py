"""Shared fixtures: one real local Spark session per test session, datasets in tmp dirs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from dedup_pipeline.config import DatasetConfig, parse_config
from dedup_pipeline.engine.session import SparkSettings, get_session

TEST_SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "2g",
    "spark.sql.adaptive.coalescePartitions.initialPartitionNum": "4",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)  # type: ignore[attr-defined]
    session = get_session(SparkSettings(master="local[2]", conf=TEST_SPARK_CONF))
    session.sparkContext.setLogLevel("ERROR")
    yield session


def dataset_config(tmp: Path, **overrides: Any) -> DatasetConfig:
    """A small clicks-like dataset rooted in `tmp`; keyword arguments replace top-level fields."""
    raw: dict[str, Any] = {
        "name": "clicks",
        "start": "2026-11-01-00:00",
        "source": {
            "path": "landing",
            "format": "jsonl",
            "schema": {"event_id": "string", "user_id": "string", "event_time": "timestamp",
                       "url": "string"},
        },
        "key": ["event_id"],
        "output": "warehouse",
    }
    raw.update(overrides)
    return parse_config({"datasets": [raw]}, "test", tmp).datasets[0]


def write_hour(ds: DatasetConfig, hour: str, rows: list[Any], name: str = "part-0.jsonl",
               header: str | None = None) -> Path:
    """Write one landing file for partition key `hour` ('2026-11-01-03:00').

    Rows are dicts (JSON-encoded), or raw strings written as they are (malformed lines, CSV rows).
    """
    d = Path(ds.source.path) / f"date={hour[:10]}" / f"hour={hour[11:13]}"
    d.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    if header is not None:
        lines = [header, *lines]
    p = d / name
    p.write_text("".join(f"{line}\n" for line in lines))
    return p


def read_output(spark: SparkSession, ds: DatasetConfig, output: str,
                hour: str | None = None) -> list[dict[str, Any]]:
    """Rows of one output (optionally one load hour) as dicts."""
    base = Path(ds.output) / output
    if hour is not None:
        base = base / f"load_hour={hour[:13]}"
    if not base.exists():
        return []
    return [r.asDict() for r in spark.read.parquet(str(base)).collect()]
