"""The phases of one hourly load (design.md L1-L3, R8-R11): the core, without side features.

`engine/load.py` calls them in order, with the wings (the contract, the Delta tables, the key
digest, retention, compaction) between them where they act:
 1. `open_hour`: the landing root, the index's health from the commit log's summary;
 2. `admit`: the hour may load (R11: every hour since `start` before H is committed; R10: no
    hour after H is committed unless this run reloads it too); the index is healthy;
 3. `forget_and_read`: H is forgotten (its commit record first, its index files, also inside
    compacted directories, its temp outputs); L_{H-1}; the batch is parsed once (cached), rows in
    and the batch's max expiry value taken in one pass (`batch.read_batch`);
 4. `decide.classify_batch`: L_H, X_H; only the live index slices of committed loads before H
    are read; the batch is classified (cached), all counts in one pass;
 5. `write.write` / `write.verify_written`: the outputs and the staged index entries, then the
    blocking checks on what was written (design.md D4), the entries moved in place;
 6. `record` / `commit`: the record built once what it vouches for is on disk, then written
    (atomic rename): only now is H loaded; `finish` rewrites it with the after-commit figures.
A crash anywhere before `commit` leaves H "not loaded"; a rerun redoes 1-6 and, being
deterministic and reading only entries of loads before H, produces the same rows and the same
index (R10).
"""

from __future__ import annotations

import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import commits, index, write
from dedup_pipeline.engine.core.batch import Batch, Persisted, check_landing_root, read_batch
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import CommitRecord
from dedup_pipeline.engine.core.decide import Classified
from dedup_pipeline.engine.core.hooks import Progress
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.core.write import Verified, Written
from dedup_pipeline.hours import HOUR, HourSet, format_hour, now_stamp, parse_hour, to_tag


class Clock:
    """Stage timings of one load: each `lap` is the time since the previous one."""

    def __init__(self) -> None:
        self.t0 = self.last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self.last, 3)
        self.last = now

    def with_total(self) -> dict[str, float]:
        return {**self.seconds, "total": round(time.perf_counter() - self.t0, 3)}


@dataclass(frozen=True)
class Opened:
    """Hour H as the load finds it: the committed hours and the index files the records list."""

    hour: datetime
    tag: str
    partition_key: str
    st: Storage
    log: CommitLog  # this load's own record changes go through it (it keeps the summary true)
    first: index.IndexDamage  # the index as the log's summary has it (O(live))

    @property
    def committed(self) -> HourSet:
        """The committed hours as the load found them (H included if loaded)."""
        assert self.first.state is not None
        return self.first.state.committed


def open_hour(ds: DatasetConfig, partition_key: str) -> Opened:
    """The landing root exists; the index's health from the log's summary, not every record."""
    hour = parse_hour(partition_key)
    check_landing_root(ds)
    st = Storage(ds.output)
    log = CommitLog(st)
    return Opened(hour, to_tag(hour), partition_key, st, log, index.check_index(st, ds, log=log))


def admit(spark: SparkSession, ds: DatasetConfig, o: Opened, say: Progress,
          run_tags: AbstractSet[str] = frozenset()) -> index.IndexDamage:
    """H may load: every hour since `start` before it is committed (R11); the index is healthy
    (damage first: a record the index does not hold is the cause to name, not a later hour); no
    committed hour after H is left out of the run (R10: `run_tags` are the run's hours)."""
    commits.check_order(ds, o.hour, o.committed)
    healthy = index.ensure_healthy(spark, ds, o.st, say, rerun=o.tag, damage=o.first)
    o.log.follow(healthy.state)
    commits.check_later_hours(ds, o.hour, o.committed, run_tags | {o.tag},
                              set(o.first.bad_records))
    return healthy


@dataclass(frozen=True)
class Prepared:
    """Hour H ready to classify: loadable (R11), earlier attempts gone, its batch parsed."""

    hour: datetime
    tag: str
    st: Storage
    committed: HourSet  # committed loads, H excluded
    health: index.IndexDamage  # the index files the commit records list (healthy)
    log: CommitLog
    prev_latest: float | None  # L_{H-1}
    batch: Batch

    @property
    def key(self) -> str:
        return format_hour(self.hour)


def forget_and_read(spark: SparkSession, ds: DatasetConfig, o: Opened,
                    healthy: index.IndexDamage, cache: Persisted, say: Progress,
                    migrated_latest: tuple[float | None] | None = None) -> Prepared:
    """Forget any earlier attempt of H (its commit record first: from then on H is not loaded;
    its index files, also inside compacted directories; its temp outputs), take L_{H-1} (the
    previous record's, or `migrated_latest` when a migration re-derived it), parse the batch."""
    health = index.forget_attempt(spark, ds, o.st, o.tag, healthy, o.log, say)
    # the records this check read, for the next check; not H's, whose record is written later
    o.log.save_summary(drop={o.tag})
    assert health.state is not None
    committed = health.state.committed.copy()
    committed.discard(o.tag)
    if migrated_latest is not None:
        prev_latest = migrated_latest[0]
    else:
        prev = o.log.read(to_tag(o.hour - HOUR)) if o.hour > parse_hour(ds.start) else None
        prev_latest = prev.latest_point if prev is not None else None
    return Prepared(o.hour, o.tag, o.st, committed, health, o.log, prev_latest,
                    read_batch(spark, ds, o.hour, o.partition_key, cache, say))


def record(ds: DatasetConfig, p: Prepared, c: Classified, w: Written, v: Verified, clock: Clock,
           fields: dict[str, Any]) -> CommitRecord:
    """H's commit record, once what it vouches for is on disk (local file systems) and listed;
    not written yet. `fields`: what the wings add (contract version, publish token)."""
    listed = write.on_disk(ds, p.st, p.tag, w, v)
    return CommitRecord(
        dataset=ds.name,
        partition_key=p.key,
        load_hour=p.tag,
        rows_in=p.batch.rows_in,
        **c.counts,
        conflicts=c.conflicts,
        latest_point=c.latest,
        expiry_point=c.x,
        files_in=len(p.batch.inputs),
        index_rows_written=c.counts["unique"],  # one index entry per unique row
        index_rows_read=c.index_rows_read,
        index_bytes_read=c.index_bytes_read,
        index_files_read=len(c.live),
        index_slices_written=tuple(v.slices),
        index_slices_deleted=0,  # retention's, after the commit
        files_written=listed.files_written,
        seconds=clock.with_total(),
        check_figures=v.figures.as_metadata(),
        committed_at=now_stamp(),
        index_checksum=v.figures.checksum,
        inputs=p.batch.recorded_inputs(),
        index_files=listed.index_files,
        index_format=listed.index_format,
        output_files=listed.output_files,
        **fields,
    )


def forget_written(ds: DatasetConfig, p: Prepared, w: Written) -> None:
    """What this attempt wrote goes (a wing refused the hour before its record)."""
    write.forget_outputs(p.st, p.tag, w.out_files if write.beside_tables(ds) else None)


def commit(p: Prepared, rec: CommitRecord) -> CommitRecord:
    """The commit record, written atomically: only now is H loaded."""
    return p.log.write(rec, new=True)


def finish(p: Prepared, rec: CommitRecord, changed: dict[str, Any], clock: Clock) -> CommitRecord:
    """The record again with the after-commit steps' figures and timings, atomically. A crash
    before this leaves the commit-time record: valid, with the steps' figures at 0 / absent, and
    H loaded; the next load's steps do the work."""
    final = p.log.write(rec.with_(**changed, seconds=clock.with_total()))
    # H's final record joins the summary; its mtime only if no one else changed records meanwhile
    p.log.save_summary(drop={p.tag}, add=final)
    return final


def retry_after_index_read_failure(ds: DatasetConfig, e: Exception) -> None:
    """A failed read of an index file is index damage like any other: a Hadoop
    ChecksumException (a damaged file with a stale ``.crc``) or a file gone since the load listed
    it (the index deleted under a running load). It is recorded, and the load fails with the
    rebuild hint or, with `on_damaged_index: rebuild`, returns so the caller redoes the load
    after the rebuild (nothing of the failed attempt was committed). Any other error is raised."""
    bad = index.index_read_failure(e)
    if bad is None:
        raise e
    st = Storage(ds.output)
    if bad.kind == "checksum":  # a missing file shows in every check's listing already
        f = index.check_index(st, ds).files.get(bad.rel)
        index.record_damage(st, {bad.rel: (f.sha256 or "") if f else ""})
    if ds.on_damaged_index != "rebuild":
        raise index.IndexDamagedError(index.damaged_message(ds, bad.describe())) from None
