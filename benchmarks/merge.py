"""The lake-native peers (design.md N2): what a team that already keeps Delta tables writes first,
Delta's documented recipe for de-duplicating writes, an insert-only MERGE
(`MERGE INTO t USING batch ON keys [AND t.<time> >= X] WHEN NOT MATCHED THEN INSERT *`):

(h) `merge_spark`   Spark + Delta Lake (delta-spark 4.4.0 on pyspark 4.2.0, a venv of its own:
                    no delta-spark release supports pyspark 4.3; scripts/merge_spark_env.sh). The
                    product's parse and R3 order (`type_and_reject`, `batch_order`), the first
                    record of each key in the batch, then `DeltaTable.merge`.
(i) `merge_duckdb`  single-node DuckDB + delta-rs, no Spark: DuckDB reads the hour's JSON lines
                    (every column as text, `WITH ORDINALITY` for the line's position, TRY_CAST to
                    the declared types), keeps the first record of each key in R3's order, and
                    delta-rs `merge().when_not_matched_insert_all()` writes it.

Both keep the expiry rule (R6, event basis) the way the recipe bounds a MERGE: the running latest
point L_H = max(L_{H-1}, max v of the hour's valid records), X_H = L_H - period; records with
v < X_H are dropped from the batch and the MERGE matches only target rows with v >= X_H (a target
predicate, so an expired key may be inserted again, as R6 says). They keep only `unique`: no
duplicates/expired/rejected outputs, no index, no conservation checks, no crash-safe commit over
four tables. The runner (benchmarks/peers.py) checks each measured hour's inserted rows against
(a)'s unique rows for the hour.

Only what the benchmark's data needs is supported: JSON lines, a timestamp expiry column, event
basis (asserted).
"""

from __future__ import annotations

import shutil
from datetime import datetime
from typing import Any

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.hours import to_tag


def _check_supported(ds: DatasetConfig) -> None:
    assert ds.source.format == "jsonl", "the MERGE peers read JSON lines"
    assert ds.expiry is not None and ds.expiry_type == "timestamp", "needs a timestamp expiry"
    assert ds.expiry.basis == "event", "needs the event basis"


class MergeSpark:
    """(h): Spark + Delta Lake insert-only MERGE into `<root>/unique`."""

    def __init__(self, spark: Any, ds: DatasetConfig, root: str):
        _check_supported(ds)
        self.spark, self.ds, self.table = spark, ds, f"{root}/unique"
        shutil.rmtree(self.table, ignore_errors=True)
        self.latest: int | None = None  # L_{H-1}

    def step(self, hour: datetime, files: list[str]) -> dict[str, Any]:
        from delta.tables import DeltaTable
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        from dedup_pipeline.engine.core.classify import batch_order
        from dedup_pipeline.engine.core.columns import REASON, V
        from dedup_pipeline.engine.core.expiry import expiry_point, latest_point
        from dedup_pipeline.engine.core.parse import read_text_batch, type_and_reject

        ds, spark = self.ds, self.spark
        assert ds.expiry is not None
        valid = (type_and_reject(read_text_batch(spark, ds, files), ds)
                 .filter(F.col(REASON).isNull()).cache())
        batch_max = valid.agg(F.max(V)).first()[0]
        self.latest = latest_point(ds, hour, self.latest, batch_max)  # type: ignore[assignment]
        x = expiry_point(ds, self.latest)
        live = valid if x is None else valid.filter(F.col(V) >= F.lit(x))
        key = list(ds.key)
        first = (live.withColumn("_rn", F.row_number().over(
            Window.partitionBy(*key).orderBy(*batch_order(ds))))
            .filter(F.col("_rn") == 1)
            .select(*ds.source.schema, "_source_file")
            .withColumn("load_hour", F.lit(to_tag(hour))))
        if not DeltaTable.isDeltaTable(spark, self.table):
            first.write.format("delta").save(self.table)
        else:
            on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in key)
            if x is not None:  # the recipe's bound: only live target rows can match (R6)
                on += f" AND t.`{ds.expiry.column}` >= timestamp_micros({int(x)})"
            (DeltaTable.forPath(spark, self.table).alias("t")
             .merge(first.alias("s"), on).whenNotMatchedInsertAll().execute())
        valid.unpersist()
        return {"expiry_point": x}


class MergeDuckdb:
    """(i): DuckDB reads and de-duplicates the hour; delta-rs MERGEs it into `<root>/unique`."""

    def __init__(self, ds: DatasetConfig, root: str):
        import duckdb

        _check_supported(ds)
        self.ds, self.table = ds, f"{root}/unique"
        shutil.rmtree(self.table, ignore_errors=True)
        self.con = duckdb.connect()
        self.con.execute("SET TimeZone = 'UTC'")
        self.latest: int | None = None  # L_{H-1}, in microseconds

    def _batch_sql(self, files: list[str]) -> str:
        ds = self.ds
        assert ds.expiry is not None
        duck = {"string": "VARCHAR", "long": "BIGINT", "double": "DOUBLE",
                "timestamp": "TIMESTAMPTZ", "date": "DATE", "boolean": "BOOLEAN"}
        text = ", ".join(f"'{c}': 'VARCHAR'" for c in ds.source.schema)
        paths = ", ".join(f"'{p.removeprefix('file:')}'" for p in files)
        typed = ", ".join(
            f"TRY_CAST(NULLIF(TRIM(\"{c}\"), '') AS {duck[t]}) AS \"{c}\"" if t != "string"
            else f'"{c}"' for c, t in ds.source.schema.items())
        # a value given but not of its type rejects the line (the product's bad_value); a
        # malformed line is skipped by the reader (ignore_errors); a null key rejects it
        bad = " OR ".join(
            f"(NULLIF(TRIM(\"{c}\"), '') IS NOT NULL AND TRY_CAST(TRIM(\"{c}\") AS {duck[t]}) IS NULL)"
            for c, t in ds.source.schema.items() if t != "string") or "false"
        null_key = " OR ".join(f'"{k}" IS NULL' for k in ds.key)
        return f"""
            WITH raw AS (
                SELECT *, filename AS _source_file FROM read_json([{paths}],
                    columns = {{{text}}}, format = 'newline_delimited', ignore_errors = true,
                    filename = true) WITH ORDINALITY AS r),
            typed AS (SELECT {typed}, _source_file, ordinality AS _pos FROM raw WHERE NOT ({bad}))
            SELECT *, epoch_us("{ds.expiry.column}") AS _v FROM typed
            WHERE NOT ({null_key}) AND "{ds.expiry.column}" IS NOT NULL"""

    def step(self, hour: datetime, files: list[str]) -> dict[str, Any]:
        from deltalake import DeltaTable, write_deltalake

        from dedup_pipeline.engine.core.expiry import expiry_point, latest_point

        ds, con = self.ds, self.con
        assert ds.expiry is not None
        con.execute(f"CREATE OR REPLACE TEMP TABLE valid AS {self._batch_sql(files)}")
        batch_max = con.execute("SELECT max(_v) FROM valid").fetchone()[0]  # type: ignore[index]
        self.latest = latest_point(ds, hour, self.latest, batch_max)  # type: ignore[assignment]
        x = expiry_point(ds, self.latest)
        order = ([f'"{ds.order_by}" ASC NULLS LAST'] if ds.order_by else []) + [
            "_v", "_source_file", "_pos"]  # R3: order_by, expiry value, file, position
        key = ", ".join(f'"{k}"' for k in ds.key)
        cols = ", ".join(f'"{c}"' for c in ds.source.schema)
        first = con.execute(f"""
            SELECT {cols}, _source_file, '{to_tag(hour)}' AS load_hour FROM valid
            WHERE {'true' if x is None else f'_v >= {int(x)}'}
            QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY {', '.join(order)}) = 1
            """).to_arrow_table()
        try:
            dt = DeltaTable(self.table)
        except Exception:  # noqa: BLE001 - no table yet: the first hour creates it
            write_deltalake(self.table, first)
            return {"expiry_point": x}
        on = " AND ".join(f"t.{k} = s.{k}" for k in ds.key)
        if x is not None:  # the recipe's bound: only live target rows can match (R6)
            on += f" AND t.{ds.expiry.column} >= to_timestamp_micros({int(x)}, 'UTC')"
        (dt.merge(first, predicate=on, source_alias="s", target_alias="t")
         .when_not_matched_insert_all().execute())
        return {"expiry_point": x}
