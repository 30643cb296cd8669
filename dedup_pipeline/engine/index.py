"""The persisted key index, the "HashSet index" (SPEC R2, R4, R6, R7, N1).

One entry per unique row: the 128-bit digest (`_h1`, `_h2`), the load that wrote it
(`_load_hour`), and when configured the expiry value `_v`, the fingerprint hash `_fp` and the key
values themselves (`index.store_keys`).

Layout: ``{output}/index/slice=<n>/load_hour=<H>/part-*.parquet`` (and, once compacted,
``slice=<n>/compact=<first>_<last>/``: see `compaction`)
- with expiry, slice n holds the entries with floor(v / slice_span) = n (Apex's time buckets), so a
  load reads only slices at or after its expiry point X_H;
- without expiry, slice n is the hash bucket pmod(_h1, buckets).
Every directory is tagged with the load that wrote it; a load reads only directories of loads that
are committed and earlier than itself, so a rerun of H never sees its own or later entries.
A load writes its entries into ``index/_staging/load_hour=H`` and moves them in place before its
commit record; a retry first deletes whatever that load left (R10).

Retention (R7): slices wholly below X_{H - retention_lag} are deleted after load H. Reads filter on
v >= X_H anyway, so results never depend on it; the lag keeps reruns of recent hours possible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.digest import FP, H1, H2
from dedup_pipeline.engine.parse import SPARK_TYPES, V
from dedup_pipeline.engine.storage import Storage

INDEX = "index"
# Version of the entry layout, kept in every commit record. 2: 32-bit fingerprint. Loads refuse an
# index of an older version like a damaged one (R12): rebuild-index rewrites it from unique.
INDEX_FORMAT = 2
STAGING = "_staging"
SLICE = "slice"
LOAD_HOUR = "_load_hour"
RETENTION_STATE = "_retention.json"


@dataclass(frozen=True)
class IndexFile:
    """One index file as its load's commit record (or a compacted directory's manifest) lists it."""

    tag: str  # the (earliest) load whose entries it holds
    slice: int
    name: str
    size: int
    rows: int | None  # None in commit records written before rows were recorded
    dir: str = ""  # directory below the slice: "load_hour=<tag>" (default) or "compact=<a>_<b>"
    loads: tuple[str, ...] = ()  # every load it holds entries of (default: just `tag`)
    sha256: str | None = None  # content hash recorded when written; None in older records

    @property
    def rel(self) -> str:
        """Path below the index directory."""
        return f"{SLICE}={self.slice}/{self.dir or f'load_hour={self.tag}'}/{self.name}"

    @property
    def holds(self) -> tuple[str, ...]:
        return self.loads or (self.tag,)


def slice_number(name: str) -> int | None:
    """n of a ``slice=n`` directory name; None for anything else (a stray directory)."""
    if not name.startswith(f"{SLICE}="):
        return None
    try:
        return int(name.split("=", 1)[1])
    except ValueError:
        return None


class IndexRetentionError(RuntimeError):
    """A rerun needs index entries that retention already deleted; rebuild the index first."""


def entry_schema(ds: DatasetConfig) -> T.StructType:
    fields = [T.StructField(H1, T.LongType()), T.StructField(H2, T.LongType()),
              T.StructField(LOAD_HOUR, T.StringType())]
    if ds.expiry is not None:
        vtype = T.DoubleType() if ds.expiry_type == "double" else T.LongType()
        fields.append(T.StructField(V, vtype))
    if ds.fingerprint:
        fields.append(T.StructField(FP, T.IntegerType()))
    if ds.index.store_keys:
        fields += [T.StructField(k, SPARK_TYPES[ds.source.schema[k]]) for k in ds.key]
    return T.StructType(fields)


def match_columns(ds: DatasetConfig) -> list[str]:
    """Columns that identify a key: the digest, plus the key values with store_keys."""
    return [H1, H2, *(ds.key if ds.index.store_keys else ())]


def slice_of(ds: DatasetConfig) -> F.Column:
    if ds.expiry is None:
        return F.pmod(F.col(H1), F.lit(ds.index.buckets))
    return F.floor(F.col(V) / F.lit(ds.slice_span)).cast("long")


def min_slice(ds: DatasetConfig, x: float | None) -> int | None:
    """The lowest slice that can hold entries with v >= X_H."""
    if ds.expiry is None or x is None:
        return None
    return math.floor(x / ds.slice_span)


def live_files(ds: DatasetConfig, files: dict[str, IndexFile], readable: set[str],
               x: float | None) -> list[IndexFile]:
    """The index files a load may match: holding committed earlier loads, in slices >= slice(X_H).

    Taken from the commit records' and compacted directories' manifests (`rebuild.check_index`),
    so a load lists no directory and opens no footer to know what it will read.
    """
    lo = min_slice(ds, x)
    return [f for f in files.values()
            if any(t in readable for t in f.holds) and (lo is None or f.slice >= lo)]


def read_live(spark: SparkSession, ds: DatasetConfig, st: Storage, files: list[IndexFile],
              tag: str) -> DataFrame | None:
    """The entries of loads before `tag` in the given files (`live_files`); None if no files.

    Only a compacted file can also hold entries of `tag` or later loads (a rerun of an hour inside a
    compacted range), so only such files are read with ``_load_hour < tag``. Every other file
    holds one earlier load: filtering it would compare a string on every entry for nothing
    (measured: 0.7 s of a 3.2 s probe of 19.3M entries). Which entries are live (v >= X_H) is
    decided after the probe (`classify.candidates`), against X_H as data rather than a literal.
    """
    if not files:
        return None

    def read(part: list[IndexFile]) -> DataFrame:
        return spark.read.schema(entry_schema(ds)).parquet(*[st.spark_path(INDEX, f.rel) for f in part])

    earlier = [f for f in files if max(f.holds) < tag]
    mixed = [f for f in files if max(f.holds) >= tag]
    reads = ([read(earlier)] if earlier else []) + (
        [read(mixed).filter(F.col(LOAD_HOUR) < F.lit(tag))] if mixed else [])
    return reads[0] if len(reads) == 1 else reads[0].unionByName(reads[1])


def check_retention(st: Storage, ds: DatasetConfig, x: float | None) -> None:
    """Fail clearly if entries this load needs (v >= X_H) were already deleted by retention."""
    try:
        state = st.read_json(st.path(INDEX, RETENTION_STATE))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return  # unreadable: the slices it deleted show as missing files (index damage) instead
    kept_from = state.get("kept_from") if isinstance(state, dict) else None
    if not isinstance(kept_from, int | float):
        return
    if kept_from is not None and (x is None or x < kept_from):
        raise IndexRetentionError(
            f"dataset {ds.name!r}: this load needs index entries with expiry value >= {x}, but "
            f"retention deleted everything below {kept_from}. Rebuild the index from unique "
            "(dedup-pipeline rebuild-index) or raise index.retention_lag_hours."
        )


def clear_load(st: Storage, tag: str) -> None:
    """Remove every index file of load `tag` (staged or in place): the start of a (re)load."""
    st.remove(st.path(INDEX, STAGING, f"load_hour={tag}"))
    for sdir in st.list_dirs(st.path(INDEX)):
        if sdir.startswith(f"{SLICE}="):
            st.remove(st.path(INDEX, sdir, f"load_hour={tag}"))


def stage_entries(ds: DatasetConfig, st: Storage, unique_rows: DataFrame, tag: str,
                  files: int = 1) -> str:
    """Write the load's entries, one file per slice (per `files` task), into the staging dir.

    No shuffle: the cached unique rows are coalesced and Spark's partitioned writer sorts each task
    by slice. Nothing reads the entries in digest order, so they are not sorted by it.
    """
    cols = [F.col(f.name) for f in entry_schema(ds).fields if f.name != LOAD_HOUR]
    entries = unique_rows.select(*cols, F.lit(tag).alias(LOAD_HOUR), slice_of(ds).alias(SLICE))
    entries = entries.select(*[f.name for f in entry_schema(ds).fields], SLICE)
    staging = st.spark_path(INDEX, STAGING, f"load_hour={tag}")
    entries.coalesce(files).write.mode("overwrite").partitionBy(SLICE).parquet(staging)
    return st.path(INDEX, STAGING, f"load_hour={tag}")


def publish_entries(st: Storage, staged: str, tag: str) -> list[int]:
    """Move staged slices into ``index/slice=n/load_hour=tag``; returns the slices written."""
    written = []
    for sdir in st.list_dirs(staged):
        if not sdir.startswith(f"{SLICE}="):
            continue
        st.move(f"{staged}/{sdir}", st.path(INDEX, sdir, f"load_hour={tag}"))
        written.append(int(sdir.split("=", 1)[1]))
    st.remove(staged)
    return sorted(written)


def apply_retention(st: Storage, ds: DatasetConfig, floor_x: float | None) -> int:
    """Delete slices entirely below `floor_x` (= X of the hour retention_lag before); count them."""
    if ds.expiry is None or floor_x is None:
        return 0
    lo = min_slice(ds, floor_x)
    assert lo is not None
    deleted = 0
    for sdir in st.list_dirs(st.path(INDEX)):
        n = slice_number(sdir)
        if n is not None and n < lo:
            st.remove(st.path(INDEX, sdir))
            deleted += 1
    if deleted:
        kept_from = lo * ds.slice_span
        st.write_json_atomic(st.path(INDEX, RETENTION_STATE), {"kept_from": kept_from})
    return deleted
