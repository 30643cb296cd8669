"""Correctness checks of one load, computed from the files it wrote, before its commit (design.md D4).

They re-read what was written instead of trusting the classification's own counts:
- conservation (R8): rows in the batch = rows in the four written partitions (Parquet footers);
- unique_keys: the written unique partition has no key twice, and none of its keys is in the live
  index of earlier loads (joined against the index entries the probe's scan found for the batch);
- index_agrees: the index files of the load hold exactly the digests of the written unique rows
  (row count and an order-independent XOR checksum of both 64-bit halves).
A failure raises `LoadCheckError` before the commit record is written, so the load commits nothing
and the Dagster layer reports the failed check (blocking: nothing downstream runs).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core.columns import H1, H2
from dedup_pipeline.engine.core.digest import digest_columns
from dedup_pipeline.engine.core.index.layout import INDEX, is_slice_dir, load_dir
from dedup_pipeline.engine.core.index.store import entry_schema, match_columns
from dedup_pipeline.engine.core.keys import key_text
from dedup_pipeline.engine.core.outputs import OUTPUTS, UNIQUE, columns, partition
from dedup_pipeline.engine.core.parse import SPARK_TYPES
from dedup_pipeline.engine.core.storage import Storage, glob_escape
from dedup_pipeline.errors import UserError

CONSERVATION, UNIQUE_KEYS, INDEX_AGREES = "conservation", "unique_keys", "index_agrees"


class LoadCheckError(UserError, RuntimeError):
    """A load's written files break a correctness rule; nothing was committed.

    `sample_keys`: up to 10 keys that break it (as `explain --key` texts), where the check can
    name keys (unique_keys, index_agrees), read from the written files before they are removed.
    """

    stage = "a blocking asset check"
    fix = ("the failing hour committed nothing; open the check's evaluation for its figures. This "
           "means a bug or corrupted files, not bad input: do not rerun blindly")

    def __init__(self, check: str, message: str, figures: dict[str, Any],
                 sample_keys: list[dict[str, str | None]] | None = None):
        super().__init__(message)
        self.check = check
        self.figures = figures
        self.sample_keys = sample_keys or []


@dataclass
class WrittenFigures:
    rows: dict[str, int] = field(default_factory=dict)
    unique_distinct_keys: int = 0
    unique_in_live_index: int = 0
    index_rows: int = 0
    checksum: dict[str, Any] = field(default_factory=dict)  # XOR of the unique rows' digests

    def as_metadata(self) -> dict[str, Any]:
        return {
            **{f"written_{k}": v for k, v in self.rows.items()},
            "unique_distinct_keys": self.unique_distinct_keys,
            "unique_in_live_index": self.unique_in_live_index,
            "index_rows": self.index_rows,
        }


def check_conservation(st: Storage, tag: str, rows_in: int, label: str,
                       files: dict[str, list[str]] | None = None) -> WrittenFigures:
    """`files`: per output, the files this load wrote (None: its whole partitions)."""
    fig = WrittenFigures(rows={o: sum(st.parquet_rows(f) for f in files[o]) if files is not None
                               else st.parquet_rows(st.path(*partition(o, tag))) for o in OUTPUTS})
    out = sum(fig.rows.values())
    if out != rows_in:
        detail = ", ".join(f"{k} {v}" for k, v in fig.rows.items())
        raise LoadCheckError(CONSERVATION, f"{label}: conservation broken: {rows_in} rows in, "
                             f"{out} rows written ({detail}); nothing was committed", {
                                 "rows_in": rows_in, "rows_out": out, **fig.rows})
    return fig


def check_unique_and_index(
    spark: SparkSession, ds: DatasetConfig, st: Storage, tag: str, fig: WrittenFigures,
    candidates: DataFrame | None, label: str, unique_files: list[str] | None = None,
) -> WrittenFigures:
    """Two independent reads of the written files, submitted together (latency dominates).

    `candidates` are the live index entries whose `_h1` occurs in the batch (the probe's own scan,
    cached). Every key of the written unique rows is a batch key, so it is in the live index iff it
    is among the candidates: the check joins against them instead of scanning the index again.
    """
    keys = match_columns(ds)
    # read with the schema the load wrote: inferring it is a Spark job of its own per read
    schema = T.StructType([T.StructField(c, SPARK_TYPES[t]) for c, t in columns(ds, UNIQUE)])
    if unique_files is None:
        uniq = spark.read.schema(schema).parquet(st.read_path(*partition(UNIQUE, tag)))
    elif unique_files:
        uniq = spark.read.schema(schema).parquet(*[glob_escape(st.to_uri(f))
                                                   for f in unique_files])
    else:  # no file: the files of an earlier version beside them are not this load's
        uniq = spark.createDataFrame([], schema)
    h1, h2 = digest_columns(ds.key, ds.source.schema)
    digests = uniq.select(h1.alias(H1), h2.alias(H2), *ds.key if ds.index.store_keys else [])
    # one row per distinct key with its multiplicity (one shuffle), then one global aggregate;
    # the XORs are over distinct keys, which equals over rows exactly when the check passes
    per_key = digests.groupBy(*keys).agg(F.count(F.lit(1)).alias("_n"))
    if candidates is not None:
        known = F.broadcast(candidates.select(*keys).distinct().withColumn("_known", F.lit(1)))
        per_key = per_key.join(known, on=keys, how="left")
    else:
        per_key = per_key.withColumn("_known", F.lit(None).cast("int"))
    entries = [st.read_path(INDEX, d, load_dir(tag))
               for d in st.list_dirs(st.path(INDEX))
               if is_slice_dir(d) and st.exists(st.path(INDEX, d, load_dir(tag)))]

    def unique_figures() -> Any:
        return per_key.agg(F.coalesce(F.sum("_n"), F.lit(0)).alias("n"),
                           F.count(F.lit(1)).alias("distinct"),
                           F.count("_known").alias("in_live"),
                           F.bit_xor(H1).alias("x1"), F.bit_xor(H2).alias("x2")).collect()[0]

    def index_figures() -> tuple[int, Any, Any]:
        if not entries:
            return 0, None, None
        i = (spark.read.schema(entry_schema(ds)).parquet(*entries)
             .agg(F.count(F.lit(1)).alias("n"), F.bit_xor(H1).alias("x1"),
                  F.bit_xor(H2).alias("x2")).collect()[0])
        return int(i["n"]), i["x1"], i["x2"]

    with ThreadPoolExecutor(max_workers=2) as pool:
        fu, fi = pool.submit(unique_figures), pool.submit(index_figures)
        u, (n, x1, x2) = fu.result(), fi.result()
    in_live = int(u["in_live"])
    fig.unique_distinct_keys = int(u["distinct"])
    fig.unique_in_live_index = in_live
    fig.index_rows = n
    fig.checksum = {"xor_h1": u["x1"], "xor_h2": u["x2"]}
    # on a failure, the keys that break the rule (read only then, before the files are removed)
    with_digests = uniq.select(*ds.key, h1.alias(H1), h2.alias(H2))
    if u["distinct"] != u["n"]:
        twice = with_digests.groupBy(*ds.key).count().filter(F.col("count") > 1)
        raise LoadCheckError(UNIQUE_KEYS, f"{label}: unique holds {u['n']} rows but only "
                             f"{u['distinct']} distinct keys; nothing was committed",
                             {"rows": u["n"], "distinct_keys": u["distinct"]},
                             _samples(ds, twice))
    if in_live:
        assert candidates is not None
        known = F.broadcast(candidates.select(*keys).distinct())
        raise LoadCheckError(UNIQUE_KEYS, f"{label}: {in_live} unique key(s) are already in the "
                             "live index of earlier loads; nothing was committed",
                             {"unique_in_live_index": in_live},
                             _samples(ds, with_digests.join(known, on=keys, how="left_semi")))
    if n != u["n"] or (x1, x2) != (u["x1"], u["x2"]):
        missing = with_digests
        if entries:
            indexed = spark.read.schema(entry_schema(ds)).parquet(*entries).select(H1, H2)
            missing = with_digests.join(indexed, on=[H1, H2], how="left_anti")
        raise LoadCheckError(INDEX_AGREES, f"{label}: the index files of this load ({n} entries) "
                             f"do not match its unique rows ({u['n']}); nothing was committed",
                             {"index_rows": n, "unique_rows": u["n"]}, _samples(ds, missing))
    return fig


def _same(c: Column) -> Column:
    return c


def _samples(ds: DatasetConfig, df: DataFrame) -> list[dict[str, str | None]]:
    """Up to 10 keys of `df` for a failed check; a failure to read them never hides the check."""
    schema = ds.source.schema
    canonical = {"timestamp": F.unix_micros, "date": F.unix_date}  # the values keys.key_text takes
    try:
        rows = (df.select(*[canonical.get(schema[k], _same)(F.col(k)).alias(k) for k in ds.key])
                .distinct().orderBy(*ds.key).limit(10).collect())
        return [{k: key_text(schema[k], r[k]) for k in ds.key} for r in rows]
    except Exception:  # noqa: BLE001 - the check's own failure is what the user must see
        return []
