"""Each rule a load applies in Spark and explain applies in plain Python has one home and two
forms, tested equal here (design.md R3, R6, "The index"): the R3 order (`classify.batch_order` /
`order_key`, both from `order_criteria`), the expiry value (`expiry.expiry_value` / `value_of`),
liveness (`expiry.is_live` / `live_value`) and an entry's slice (`store.slice_of` /
`entry_slice`). Random rows with ties and nulls; Spark's answer is the expectation."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dedup_pipeline.engine.core.classify import batch_order, order_key
from dedup_pipeline.engine.core.columns import BLOCK, H1, ROW, SOURCE_FILE, V
from dedup_pipeline.engine.core.expiry import expiry_value, is_live, live_value, value_of
from dedup_pipeline.engine.core.index.store import entry_slice, slice_of
from dedup_pipeline_tests.conftest import dataset_config, source_raw

SCHEMA = {"event_id": "string", "n": "long", "event_time": "timestamp", "day": "date",
          "kind": "string", "score": "double"}
CATEGORIES = ["low", "mid", "high"]


def _ds(tmp: Path, expiry: dict | None, order_by: str | None = "n"):
    extra = {"order_by": order_by} if order_by else {}
    if expiry is not None:
        extra["expiry"] = expiry
    return dataset_config(tmp, source=source_raw(schema=SCHEMA), **extra)


@pytest.mark.fast
@pytest.mark.parametrize("order_by", ["n", None])
def test_r3_order_in_python_is_sparks(spark: SparkSession, tmp_path: Path, order_by) -> None:
    ds = _ds(tmp_path, {"column": "score", "period": 10}, order_by)
    rng = random.Random(3)
    rows = [{"event_id": "k", "n": rng.choice([None, 1, 2, 3]), V: rng.choice([1.5, 2.0, -1.0]),
             SOURCE_FILE: rng.choice(["file:/a/part-0", "file:/a/part-1"]),
             BLOCK: rng.choice([0, 1 << 20]), ROW: i, "id": i} for i in range(300)]
    df = spark.createDataFrame(rows, "event_id string, n long, _v double, _source_file string, "
                                     "_blk long, _rid long, id long")
    spark_order = [r["id"] for r in df.orderBy(*batch_order(ds)).collect()]
    assert [r["id"] for r in sorted(rows, key=lambda r: order_key(ds, r))] == spark_order


@pytest.mark.fast
@pytest.mark.parametrize(("expiry", "column", "values"), [
    ({"column": "event_time", "period": "1h"}, "event_time", ["2026-11-01 00:00:00.000001", None]),
    ({"column": "day", "period": "2d"}, "day", ["2026-11-01", "1969-12-31", None]),
    ({"column": "n", "period": 5}, "n", ["7", "-3", None]),
    ({"column": "score", "period": 0.5}, "score", ["2.25", "-0.5", None]),
    ({"column": "kind", "period": 1, "categories": CATEGORIES}, "kind",
     ["low", "high", "other", None]),
])
def test_expiry_value_and_liveness_in_python_are_sparks(spark: SparkSession, tmp_path: Path,
                                                        expiry, column, values) -> None:
    ds = _ds(tmp_path, expiry)
    typ = SCHEMA[column]
    df = spark.createDataFrame([(v,) for v in values], f"{column} string").select(
        F.col(column).cast(typ).alias(column))
    got = df.select(F.col(column), expiry_value(ds).alias("v")).collect()
    canonical = {"timestamp": F.unix_micros, "date": F.unix_date}
    as_python = df.select(canonical[typ](F.col(column)).alias(column)
                          if typ in canonical else F.col(column)).collect()
    for spark_row, py_row in zip(got, as_python, strict=True):
        v = value_of(ds, py_row[column])
        assert v == spark_row["v"], (column, py_row[column])
        for x in (None, -1, 0, v):
            live = spark.range(1).select(is_live(F.lit(v), x).alias("l")).first()["l"]
            assert live_value(v, x) == bool(live), (v, x)


@pytest.mark.fast
@pytest.mark.parametrize("expiry", [None, {"column": "event_time", "period": "2h"}])
def test_an_entrys_slice_in_python_is_sparks(spark: SparkSession, tmp_path: Path, expiry) -> None:
    ds = _ds(tmp_path, expiry)
    rng = random.Random(5)
    rows = [(rng.randint(-(2**63), 2**63 - 1), rng.choice([None, rng.randint(-10**12, 10**16)]))
            for _ in range(200)]
    df = spark.createDataFrame(rows, f"{H1} long, {V} long")
    for r in df.select(H1, V, slice_of(ds).alias("s")).collect():
        assert entry_slice(ds, r[H1], r[V]) == r["s"], (r[H1], r[V])
