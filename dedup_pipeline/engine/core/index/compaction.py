"""Compaction of index slices: many small per-load directories become one.

Every load writes its entries into ``index/slice=n/load_hour=H/``, so a slice read by many loads
collects one small directory per load (without expiry, every bucket does, forever). After a load
commits, a slice with at least `index.compact_after` per-load directories of committed loads has
them merged into ``index/slice=n/compact=<first>_<last>/`` with a ``_manifest.json`` naming the
loads and files it holds. Entries keep their `_load_hour`, so nothing about a read changes:

- a load H reads a compacted directory if it holds an earlier load, with ``_load_hour < H``
  when it also holds H or a later load (`store.read_live`), so a rerun still sees only earlier
  loads;
- a per-load directory whose load a compacted directory of the same slice holds is ignored by
  readers and by damage detection (a crash between the compacted directory's rename, which is
  atomic, and the deletion of the merged directories leaves such leftovers; the next compaction
  or rerun removes them), so an entry is never read twice;
- a rerun of H first removes H's entries from any compacted directory holding them
  (`remove_load`, an atomic replace of that directory), then writes H's entries afresh;
- damage detection checks compacted files against their manifest (`health.check_index`); a
  damaged compacted directory is deleted and all its loads rebuilt from unique.
So compaction never changes results; dedup_pipeline_tests/test_compaction.py compares every output
and the index entry set with and without it, including a rerun inside a compacted range.
"""

from __future__ import annotations

from collections.abc import Callable, Container

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core.columns import ENTRY_LOAD_HOUR
from dedup_pipeline.engine.core.index.layout import (
    INDEX,
    MANIFEST,
    WORK,
    Manifest,
    ManifestFile,
    compact_dir,
    covered,
    list_compacted,
    load_dir,
    load_tag,
    slice_dir,
    slice_number,
)
from dedup_pipeline.engine.core.index.store import entry_schema
from dedup_pipeline.engine.core.storage import ROWS_PER_FILE, Storage


def _write(spark: SparkSession, ds: DatasetConfig, st: Storage, n: int, name: str,
           sources: list[str], loads: list[str], drop: str | None = None) -> str:
    """Write the entries of `sources` (minus load `drop`) as compacted dir `name` in the work area."""
    work = st.path(WORK, slice_dir(n), name)
    st.remove(work)
    df = spark.read.schema(entry_schema(ds)).parquet(*sources)
    if drop is not None:
        df = df.filter(F.col(ENTRY_LOAD_HOUR) != F.lit(drop))
    (df.coalesce(1).write.mode("overwrite").option("maxRecordsPerFile", ROWS_PER_FILE)
     .parquet(st.spark_path(WORK, slice_dir(n), name)))
    files = [ManifestFile(name=p.rsplit("/", 1)[1], size=int(st.fs.info(p).get("size") or 0),
                          rows=st.parquet_rows(p), sha256=st.sha256(p))
             for p in st.list_files(work, ".parquet")]
    st.sync_tree(work)  # the data is on disk before the manifest that vouches for it
    manifest = Manifest(slice=n, loads=tuple(loads), files=tuple(files))
    st.write_text_atomic(f"{work}/{MANIFEST}", manifest.model_dump_json())
    return work


def compact(spark: SparkSession, ds: DatasetConfig, st: Storage, committed: Container[str],
            intact: Callable[[int, list[str]], bool] | None = None) -> int:
    """Merge the per-load directories of every slice that has `compact_after` of them; count.

    `intact(slice, loads)` checks the sources' content first: merging a damaged file would give
    its damage a fresh, matching hash. A slice that fails is left for the rebuild.
    """
    threshold = ds.index.compact_after
    if threshold <= 0:
        return 0
    done = covered(list_compacted(st))
    merged = 0
    for sdir in st.list_dirs(st.path(INDEX)):
        n = slice_number(sdir)
        if n is None:
            continue
        tags = [t for t in map(load_tag, st.list_dirs(st.path(INDEX, sdir))) if t is not None]
        leftovers = [t for t in tags if (n, t) in done]
        for t in leftovers:  # merged before a crash cut the clean-up short
            st.remove(st.path(INDEX, sdir, load_dir(t)))
        loads = sorted(t for t in tags if t in committed and (n, t) not in done)
        if len(loads) < threshold or (intact is not None and not intact(n, loads)):
            continue
        name = compact_dir(loads[0], loads[-1])
        work = _write(spark, ds, st, n, name,
                      [st.read_path(INDEX, sdir, load_dir(t)) for t in loads], loads)
        st.move(work, st.path(INDEX, sdir, name))  # atomic: from here the merged copy is read
        for t in loads:
            st.remove(st.path(INDEX, sdir, load_dir(t)))
        merged += 1
    st.remove(st.path(WORK))
    return merged


def remove_load(spark: SparkSession, ds: DatasetConfig, st: Storage, tag: str) -> int:
    """Take load `tag`'s entries out of every compacted directory holding them (before a rerun)."""
    rewritten = 0
    for c in list_compacted(st):
        if tag not in c.loads:
            continue
        target = st.path(INDEX, c.rel)
        rest = [t for t in c.loads if t != tag]
        if not rest:
            st.remove(target)
        else:
            sources = [st.read_path(INDEX, c.rel, f.name) for f in c.files]
            work = _write(spark, ds, st, c.slice, c.dir, sources, rest, drop=tag)
            st.replace_dir(work, target)
        rewritten += 1
    st.remove(st.path(WORK))
    return rewritten
