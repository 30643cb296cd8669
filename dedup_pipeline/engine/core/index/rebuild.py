"""Rebuild the key index from the unique output (design.md R12, K3).

The index is derived data: every entry is a function of one unique row (digest of its key, its
expiry value, its fingerprint) and the load hour of its partition. So a rebuild reads only unique
(never the raw batches), recomputes the entries of every committed load in one Spark job, writes
them in the usual layout to a staging directory and swaps the whole index in. Entries equal the
ones the loads wrote, so every later load gives exactly the results it would have given had the
index never been lost.

A load checks the index first (`ensure_healthy`, `ensure_intact`): on damage it fails with the
rebuild hint or, with `on_damaged_index: rebuild`, has the damaged loads rebuilt here. What counts
as damage is `index.health`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.columns import ENTRY_LOAD_HOUR, FP, H1, H2, LOAD_HOUR_PARTITION, V
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import IndexFileEntry
from dedup_pipeline.engine.core.digest import digest_columns, fingerprint_column
from dedup_pipeline.engine.core.expiry import expiry_value
from dedup_pipeline.engine.core.formats import run_command
from dedup_pipeline.engine.core.index import compaction, layout, store
from dedup_pipeline.engine.core.index.health import (
    IndexDamage,
    IndexDamagedError,
    check_index,
    content_damage,
    damaged_message,
    index_file_manifest,
    prune_marker,
    record_damage,
)
from dedup_pipeline.engine.core.index.layout import IndexFile
from dedup_pipeline.engine.core.outputs import UNIQUE, partition
from dedup_pipeline.engine.core.storage import TMP, Storage
from dedup_pipeline.hours import format_tag


@dataclass
class RebuildResult:
    loads: int
    entries: int
    seconds: float


def _staged_files(st: Storage, staging: str, tag: str) -> tuple[list[int], list[IndexFileEntry]]:
    slices = sorted(n for s in st.list_dirs(staging) if (n := layout.slice_number(s)) is not None
                    and st.exists(f"{staging}/{s}/{layout.load_dir(tag)}"))
    return slices, index_file_manifest(st, tag, slices, root=staging)


def unique_sources(st: Storage, targets: list[str]) -> dict[str, list[str]]:
    """The unique files to rebuild each load's entries from: the ones its commit record lists
    (with Delta tables the table serves those once it has caught up with the record).

    A rebuild from a damaged unique partition would make the damage look healthy (a removed file's
    keys gone from the index, so later loads would take them for new; a copied file's keys twice),
    so it refuses instead, naming the hour and the fix. Files nobody listed are not read. An hour
    whose record is damaged (only its rerun restores it) is read as its partition directory is.
    """
    out: dict[str, list[str]] = {}
    log = CommitLog(st)
    for tag in targets:
        part = st.path(*partition(UNIQUE, tag))
        rec = log.read_intact(tag)
        problem = None
        listed = rec.output_files.get(UNIQUE, ()) if rec is not None else None
        if not st.exists(part):
            problem = f"its unique partition {part} is missing"
        elif listed is not None:
            missing = [f.name for f in listed if not st.exists(f"{part}/{f.name}")]
            if missing:
                problem = f"{part}/{missing[0]}, listed in its commit record, is missing"
            out[tag] = [st.read_path(*partition(UNIQUE, tag), f.name) for f in listed]
        else:
            out[tag] = [st.read_path(*partition(UNIQUE, tag))]
        if problem:
            raise IndexDamagedError(
                f"cannot rebuild the index entries of hour {format_tag(tag)}: {problem}, so its keys "
                f"are not all there to rebuild from. Rerun that hour "
                f"({run_command(format_tag(tag), format_tag(tag))}); if it was never loaded "
                f"(a copied commit record), delete {commits.commit_path(st, tag)}")
        if not out[tag]:
            del out[tag]  # an hour with no unique rows
    return out


def rebuild_index(spark: SparkSession, ds: DatasetConfig,
                  tags: list[str] | None = None) -> RebuildResult:
    """Recompute index entries from unique: of the given loads, or of every committed load.

    Reads only the unique output. The caller holds the dataset lock. A full rebuild swaps the whole
    index directory in; a partial one replaces the entries of each given load. The config must
    keep the dataset's contract (entries under another key would match nothing): the caller
    checks it first (a load, the recovery job, or a migration that records the new contract).
    """
    t0 = time.perf_counter()
    st = Storage(ds.output)
    log = CommitLog(st)
    log.drop_summary()  # records are rewritten in place below: a crash must not leave it stale
    committed = sorted(log.committed())
    if tags is not None:  # a damaged compacted directory goes, and every load it held is rebuilt
        bad = set(check_index(st, ds).bad_compacted)
        for c in compaction.list_compacted(st):
            if c.rel not in bad and set(c.loads) & set(tags) and content_damage(st, c.index_files()):
                bad.add(c.rel)  # remove_load would copy its other loads' damaged entries
            if c.rel in bad:
                tags = [*tags, *c.loads]
                st.remove(st.path(layout.INDEX, c.rel))
    targets = committed if tags is None else sorted(set(tags) & set(committed))
    staging_name = layout.REBUILD_STAGING
    staging = st.path(staging_name)
    st.remove(staging)
    entries = 0
    sources = unique_sources(st, targets)
    present = sorted(sources)
    if present:
        # mergeSchema: hours loaded under an evolved contract have more columns (a key of a
        # migrated contract may name one)
        uniq = (spark.read.option("basePath", st.spark_path(UNIQUE)).option("mergeSchema", "true")
                .parquet(*[p for t in present for p in sources[t]]))
        h1, h2 = digest_columns(ds.key, ds.source.schema)
        df = uniq.withColumn(H1, h1).withColumn(H2, h2)
        if ds.expiry is not None:
            df = df.withColumn(V, expiry_value(ds))
        if ds.fingerprint:
            df = df.withColumn(FP, fingerprint_column(ds.fingerprint, ds.source.schema))
        df = df.withColumn(ENTRY_LOAD_HOUR, F.col(LOAD_HOUR_PARTITION))  # unique's partition column
        cols = [f.name for f in store.entry_schema(ds).fields]
        df = df.select(*cols, store.slice_of(ds).alias(layout.SLICE),
                       F.col(LOAD_HOUR_PARTITION).alias(layout.LOAD))
        (df.repartition(layout.SLICE, layout.LOAD).sortWithinPartitions(H1)
         .write.mode("overwrite").partitionBy(layout.SLICE, layout.LOAD)
         .parquet(st.spark_path(staging_name)))
        entries = spark.read.parquet(st.read_path(staging_name)).count()
    st.makedirs(staging)
    for tag in targets:
        slices, files = _staged_files(st, staging, tag)
        if tags is not None:  # partial: replace this load's entries in place
            store.clear_load(st, tag)
            compaction.remove_load(spark, ds, st, tag)
            for n in slices:
                st.move(f"{staging}/{layout.load_rel(n, tag)}",
                        st.path(layout.INDEX, layout.load_rel(n, tag)))
        # a damaged record: only a rerun of that hour restores it; its files stay unlisted
        rec = log.read_intact(tag)
        if rec is not None:
            log.write(rec.with_(
                index_files=tuple(files),
                index_format=layout.INDEX_FORMAT, index_slices_written=tuple(slices)))
    if tags is None:
        st.replace_dir(staging, st.path(layout.INDEX))
    else:
        st.remove(staging)
    after = check_index(st, ds, log=log)  # every record read again (no summary): the new one
    prune_marker(st, after.files)
    log.follow(after.state)
    log.save_summary()
    return RebuildResult(len(targets), entries, round(time.perf_counter() - t0, 3))


# -- what a load does about damage: fail, or rebuild the damaged loads first -----------------
def ensure_healthy(spark: SparkSession, ds: DatasetConfig, st: Storage,
                   say: object = None, rerun: str | None = None,
                   damage: IndexDamage | None = None) -> IndexDamage:
    """Fail (or rebuild, with `on_damaged_index: rebuild`) when the index is damaged.

    `rerun`: the load about to be (re)done. Only damaged commit records of earlier hours stop it
    (their entries and expiry point are what it reads); its own record is what the rerun repairs,
    and a later hour's does not affect it, so that hour's own rerun stays reachable (otherwise a
    damaged record of hour 09 with 05-08 not loaded blocks every load, and its fix "rerun 09" is
    refused by the load order rule).
    """
    if damage is None:  # else the caller's check, just made
        damage = check_index(st, ds)
    records = {t: m for t, m in damage.bad_records.items() if rerun is None or t < rerun}
    if records:
        first = sorted(records)[0]
        more = f" ({len(records) - 1} more damaged record(s))" if len(records) > 1 else ""
        raise IndexDamagedError(f"dataset {ds.name!r}: {records[first]}{more}")
    if damage.index_ok:
        return damage
    if ds.on_damaged_index == "rebuild":
        if callable(say):
            say(f"{ds.name}: {damage.summary()}; rebuilding the index from unique")
        rebuild_index(spark, ds, damage.damaged_loads)  # the load checked the contract
        return check_index(st, ds)  # the rebuilt files: what the load will read
    raise IndexDamagedError(damaged_message(ds, damage.summary()))


def ensure_intact(spark: SparkSession, ds: DatasetConfig, st: Storage, files: list[IndexFile],
                  say: Callable[[str], None] | None = None, rerun: str | None = None) -> bool:
    """Hash the files a load is about to probe; on damage record it, then fail or rebuild.

    Returns True if damaged loads were rebuilt (the caller must take the new file list).
    """
    found = content_damage(st, files)
    if not found:
        return False
    record_damage(st, found)
    ensure_healthy(spark, ds, st, say, rerun)  # raises, or rebuilds the damaged loads
    return True


def forget_attempt(spark: SparkSession, ds: DatasetConfig, st: Storage, tag: str,
                   health: IndexDamage, log: CommitLog, say: Callable[[str], None]) -> IndexDamage:
    """Delete what any earlier attempt of `tag` left: its commit record first (from then on the
    hour is not loaded), its index files (also inside compacted directories), its temp outputs.
    Returns the index manifest as it now is."""
    log.forget(tag)
    store.clear_load(st, tag)
    # a compacted file holding this hour is rewritten from its own bytes: check them first
    if ensure_intact(spark, ds, st, [f for f in health.files.values() if f.loads and tag in f.holds],
                     say, rerun=tag):
        health = check_index(st, ds)
        log.follow(health.state)
    if compaction.remove_load(spark, ds, st, tag):
        health = check_index(st, ds)  # compacted files were rewritten: read the new manifest
        log.follow(health.state)
    for leftover in st.list_dirs(st.path(TMP)):
        if leftover.startswith(tag):
            st.remove(st.path(TMP, leftover))
    st.purge_trash()
    return health
