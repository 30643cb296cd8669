"""The systems the benchmark compares, each loading one landing hour (design.md N2).

(a) `pipeline`        this package's hourly load (`engine.load.run_load`), with the dataset's expiry;
(f) `pipeline_noexp`  the same without expiry (the index keeps every key forever);
(b) `naive`           what an engineer would write first: parse the batch, drop expired records,
                      keep the first record of each key in the batch, then LEFT ANTI JOIN it with the
                      full unique table on the key columns; write the four outputs;
(c) `recompute`       `dropDuplicates(key)` over everything loaded so far plus the batch, the whole
                      clean table rewritten every hour;
(d) `streaming`       Spark Structured Streaming: JSON file source, `withWatermark` (the expiry
                      period) + `dropDuplicatesWithinWatermark(key)`, RocksDB state store with
                      changelog checkpointing, one `trigger(availableNow=True)` run per hour;
(e) `floor`           a plain copy of the batch, landing JSON to Parquet.

The peers are written as a competent engineer would: the same Spark session and settings as (a),
the same parse for (b) (so the comparison is of the dedup, not of the JSON reader), joins on the key
columns only, the parsed batch cached where it is read twice.

History for (b) and (c) is the unique table (a) wrote for the hours before the measured one: the
cost of either at hour H depends only on that table, and the runner checks at every measured hour
that (b)'s unique rows equal (a)'s, so the two tables agree where it matters.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core.classify import batch_order
from dedup_pipeline.engine.core.columns import REASON, V
from dedup_pipeline.engine.core.expiry import Number, is_expired
from dedup_pipeline.engine.core.parse import (
    SPARK_TYPES,
    hour_dir,
    list_input_files,
    read_text_batch,
    type_and_reject,
)
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import to_tag

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
STREAMING_CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


@dataclass
class PeerResult:
    rows_in: int
    unique: int
    duplicates: int
    expired: int
    rejected: int

    @property
    def conserved(self) -> bool:
        return self.rows_in == self.unique + self.duplicates + self.expired + self.rejected


def _files(ds: DatasetConfig, hour: datetime) -> list[str]:
    return [f.path for f in list_input_files(ds, hour)]


def _write(df: DataFrame, path: str) -> None:
    df.coalesce(1).write.mode("overwrite").parquet(path)


def naive_load(spark: SparkSession, ds: DatasetConfig, hour: datetime, x: Number | None,
               history_root: str, out_root: str) -> PeerResult:
    """(b): anti-join of the batch's first records against the full unique table (hours < H)."""
    tag = to_tag(hour)
    batch = type_and_reject(read_text_batch(spark, ds, _files(ds, hour)), ds).cache()
    rows_in = batch.count()
    valid = batch.filter(F.col(REASON).isNull())
    expired = valid.filter(is_expired(F.col(V), x)) if ds.expiry else valid.limit(0)
    live = valid.filter(~is_expired(F.col(V), x)) if ds.expiry else valid
    key = list(ds.key)
    ranked = live.withColumn("_rn", F.row_number().over(
        Window.partitionBy(*key).orderBy(*batch_order(ds))))
    first = ranked.filter(F.col("_rn") == 1)
    history = (spark.read.parquet(history_root).filter(F.col("load_hour") < tag).select(*key))
    # one pass over the history (the anti-join); the first records it kept are cached, so the
    # duplicates (the other first records, and every later record) need no second pass
    unique = first.join(history, on=key, how="left_anti").cache()
    duplicates = ranked.filter(F.col("_rn") > 1).unionByName(
        first.join(F.broadcast(unique.select(*key)), on=key, how="left_anti"))
    src = [*ds.source.schema, "_source_file"]
    outs = {"unique": unique.select(*src), "duplicates": duplicates.select(*src),
            "expired": expired.select(*src),
            "rejected": batch.filter(F.col(REASON).isNotNull()).select(
                "_source_file", REASON, "_raw")}
    st = Storage(out_root)
    for name, df in outs.items():
        _write(df, st.path(name, f"load_hour={tag}"))
    batch.unpersist()
    unique.unpersist()
    counts = {n: st.parquet_rows(st.path(n, f"load_hour={tag}")) for n in outs}
    return PeerResult(rows_in, counts["unique"], counts["duplicates"], counts["expired"],
                      counts["rejected"])


def recompute_load(spark: SparkSession, ds: DatasetConfig, hour: datetime, history_root: str,
                   out_dir: str) -> int:
    """(c): dropDuplicates(key) over the clean table so far plus the batch; rewrite all of it.

    Returns the rows of the rewritten table.
    """
    tag = to_tag(hour)
    batch = type_and_reject(read_text_batch(spark, ds, _files(ds, hour)), ds)
    cols = [*ds.source.schema, "_source_file"]
    fresh = (batch.filter(F.col(REASON).isNull()).select(*cols)
             .withColumn("load_hour", F.lit(tag)))
    history = spark.read.parquet(history_root).filter(F.col("load_hour") < tag).select(
        *cols, "load_hour")
    table = history.unionByName(fresh).dropDuplicates(list(ds.key))
    shutil.rmtree(out_dir, ignore_errors=True)
    table.write.mode("overwrite").partitionBy("load_hour").parquet(out_dir)
    return Storage(out_dir).parquet_rows(out_dir)


def floor_copy(spark: SparkSession, ds: DatasetConfig, hour: datetime, out_dir: str) -> int:
    """(e): the batch, landing JSON to Parquet with the declared types, nothing else."""
    schema = T.StructType([T.StructField(c, SPARK_TYPES[t]) for c, t in ds.source.schema.items()])
    df = spark.read.schema(schema).json(_files(ds, hour))
    df.write.mode("overwrite").parquet(out_dir)
    return Storage(out_dir).parquet_rows(out_dir)


class StreamingPeer:
    """(d): one Structured Streaming query, restarted with `availableNow` once per hour.

    Each hour's landing files are hard-linked into the query's input directory just before its
    trigger (no copy), so the file source sees one new hour per run, as it would in production.
    """

    def __init__(self, spark: SparkSession, ds: DatasetConfig, root: Path):
        assert ds.expiry is not None and ds.expiry_type == "timestamp", "needs a timestamp expiry"
        self.spark, self.ds = spark, ds
        self.inbox, self.out, self.ckpt = root / "in", root / "out", root / "checkpoint"
        for p in (self.inbox, self.out, self.ckpt):
            shutil.rmtree(p, ignore_errors=True)
        self.inbox.mkdir(parents=True)
        for k, v in STREAMING_CONF.items():
            spark.conf.set(k, v)  # read when the query first starts, then kept in its checkpoint
        self.watermark = f"{int(ds.expiry_period // 1_000_000)} seconds"

    def feed(self, hour: datetime) -> int:
        """Link hour H's files into the inbox; returns how many."""
        src = Path(hour_dir(self.ds, hour))
        n = 0
        for f in sorted(src.glob("part-*")):
            os.link(f, self.inbox / f"{to_tag(hour)}-{f.name}")
            n += 1
        return n

    def run(self) -> None:
        ds = self.ds
        schema = T.StructType(
            [T.StructField(c, SPARK_TYPES[t]) for c, t in ds.source.schema.items()])
        stream = (self.spark.readStream.schema(schema).option("mode", "PERMISSIVE")
                  .json(str(self.inbox)))
        col = ds.expiry.column  # type: ignore[union-attr]
        present = F.col(col).isNotNull()
        for k in ds.key:
            present = present & F.col(k).isNotNull()
        deduped = (stream.filter(present)
                   .withWatermark(col, self.watermark)
                   .dropDuplicatesWithinWatermark(list(ds.key)))
        query = (deduped.writeStream.format("parquet").option("path", str(self.out))
                 .option("checkpointLocation", str(self.ckpt)).outputMode("append")
                 .trigger(availableNow=True).start())
        query.awaitTermination()

    def close(self) -> None:
        for k in STREAMING_CONF:
            self.spark.conf.unset(k)
