"""One hourly load, end to end and crash-safe (design.md L1-L3, R8-R11): the core.

`run_load` is its phases, each a function with a typed result. The wings reach it through two
seams (`Wings`): `before_load` checks, run once the hour's order is checked and before anything is
forgotten or written (each may refuse the hour, and may return an `Admission`: fields for the
commit record and work to do just before it, e.g. a new contract version); and `after_commit`
steps, run in order once H is committed (each timed under its name in the record's `seconds`).
 1. `prepare`: the hour may load (R11: every hour since `start` before H is committed; R10: no
    hour after H is committed unless this run reloads it too); the wings' checks; the index is
    healthy; H is forgotten (its commit record, its index files, also inside compacted
    directories, its temp outputs); the batch is parsed once (cached), rows in and the batch's max
    expiry value taken in one pass;
 2. `classify_batch`: L_H, X_H; only the live index slices of committed loads before H are read;
    the batch is classified (cached), all counts in one pass;
 3. `write`: each output partition is written to a temp dir and swapped in atomically (with Delta
    tables: its files are moved in beside the files a table version may still list); the index
    entries are staged;
 4. `verify_written`: conservation on the written footers, then the staged entries are moved in
    place, then unique keys and index agreement on the written files (design.md D4);
 5. `commit`: the admissions' work, then the commit record (atomic rename): only now is H loaded;
 6. the `after_commit` steps (publish, retention, compaction), then the record again with their
    figures.
A crash anywhere before 5 leaves H "not loaded"; a rerun redoes 1-5 and, being deterministic and
reading only entries of loads before H, produces the same rows and the same index (R10).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import commits, decide, hooks, index, write
from dedup_pipeline.engine.core.batch import Batch, Persisted, check_landing_root, read_batch
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import CommitRecord
from dedup_pipeline.engine.core.decide import Classified
from dedup_pipeline.engine.core.hooks import Progress
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.core.write import Verified, Written
from dedup_pipeline.hours import HOUR, HourSet, format_hour, parse_hour, to_tag


@dataclass(frozen=True)
class HourContext:
    """What a wing sees of the hour being loaded."""

    spark: SparkSession
    ds: DatasetConfig
    st: Storage
    log: CommitLog
    hour: datetime
    tag: str
    partition_key: str
    committed: HourSet  # the committed hours as the load found them (H included if loaded)
    say: Progress


@dataclass(frozen=True)
class Admission:
    """What a before-load check hands back: fields it adds to the commit record, work to do once
    the written files passed the checks and just before the record (given the written files per
    output; it may refuse, and then nothing is committed), and L_{H-1} when the check knows it
    better than the previous record (a migration re-derived it)."""

    record: dict[str, Any] = field(default_factory=dict)
    before_record: Callable[[dict[str, list[str]]], None] | None = None
    on_admitted: Callable[[], None] | None = None  # once the core's own checks passed too
    previous_latest: Callable[[], tuple[float | None] | None] | None = None  # (L,) when it knows


@dataclass(frozen=True)
class Committed:
    """What an after-commit step sees: the hour, its record, the committed hours (H included),
    the index files the records listed when the load checked them (healthy), and the batch's
    classification (still cached: every row with its output in `_out`)."""

    hour: HourContext
    record: CommitRecord
    committed: HourSet
    health: index.IndexDamage
    classified: DataFrame


Check = Callable[[HourContext], Admission | None]
Step = Callable[[Committed], dict[str, Any] | None]


@dataclass(frozen=True)
class Wings:
    """The side capabilities a load calls: checks before it, steps after its commit (in order).
    A step's dict holds record fields it changed (e.g. `index_slices_deleted`)."""

    before_load: tuple[tuple[str, Check], ...] = ()
    after_commit: tuple[tuple[str, Step], ...] = ()


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
class Prepared:
    """Hour H ready to classify: loadable (R11), earlier attempts gone, its batch parsed."""

    hour: datetime
    tag: str
    st: Storage
    committed: HourSet  # committed loads, H excluded
    health: index.IndexDamage  # the index files the commit records list (healthy)
    log: CommitLog  # this load's own record changes go through it (it keeps the summary true)
    prev_latest: float | None  # L_{H-1}
    batch: Batch
    context: HourContext
    admissions: tuple[Admission, ...]  # the wings' checks' (their record fields, their work)

    @property
    def key(self) -> str:
        return format_hour(self.hour)


def prepare(spark: SparkSession, ds: DatasetConfig, partition_key: str, cache: Persisted,
            say: Progress, wings: Wings, clock: Clock,
            run_tags: AbstractSet[str] = frozenset()) -> Prepared:
    """Check that H may load (R11; no later loaded hour left out of the run, R10: `run_tags` are
    the run's hours; the wings' checks, each timed as `before_<name>`; a healthy index),
    forget any earlier attempt, parse it."""
    hour = parse_hour(partition_key)
    tag = to_tag(hour)
    check_landing_root(ds)
    st = Storage(ds.output)
    log = CommitLog(st)
    first = index.check_index(st, ds, log=log)  # O(live): the log's summary, not every record
    assert first.state is not None
    committed = first.state.committed
    ctx = HourContext(spark, ds, st, log, hour, tag, partition_key, committed, say)
    clock.lap("index_health")
    admitted = []
    for name, check in wings.before_load:
        if (a := check(ctx)) is not None:
            admitted.append(a)
        clock.lap(f"before_{name}")
    admissions = tuple(admitted)
    commits.check_order(ds, hour, committed)
    # damage first: a record the index does not hold is the cause to name, not a later hour
    healthy = index.ensure_healthy(spark, ds, st, say, rerun=tag, damage=first)
    log.follow(healthy.state)
    commits.check_later_hours(ds, hour, committed, run_tags | {tag}, set(first.bad_records))
    for a in admissions:
        if a.on_admitted is not None:
            a.on_admitted()
    health = index.forget_attempt(spark, ds, st, tag, healthy, log, say)
    # the records this check read, for the next check; not H's, whose record is written later
    log.save_summary(drop={tag})
    assert health.state is not None
    committed = health.state.committed.copy()
    committed.discard(tag)
    given = [g for a in admissions if a.previous_latest is not None
             and (g := a.previous_latest()) is not None]
    if given:
        prev_latest = given[0][0]
    else:
        prev = log.read(to_tag(hour - HOUR)) if hour > parse_hour(ds.start) else None
        prev_latest = prev.latest_point if prev is not None else None
    return Prepared(hour, tag, st, committed, health, log, prev_latest,
                    read_batch(spark, ds, hour, partition_key, cache, say), ctx, admissions)


def commit(ds: DatasetConfig, p: Prepared, c: Classified, w: Written, v: Verified,
           clock: Clock) -> CommitRecord:
    """The admissions' work (e.g. a new contract version, the tables' preconditions), then the
    commit record, after what it vouches for is on disk (local file systems)."""
    st, tag = p.st, p.tag
    listed = write.on_disk(ds, st, tag, w, v)
    fields: dict[str, Any] = {}
    for a in p.admissions:
        fields.update(a.record)
    record = CommitRecord(
        dataset=ds.name,
        partition_key=p.key,
        load_hour=tag,
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
        committed_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        index_checksum=v.figures.checksum,
        inputs=p.batch.recorded_inputs(),
        index_files=listed.index_files,
        index_format=listed.index_format,
        output_files=listed.output_files,
        **fields,
    )
    try:  # an hour is never committed that a wing refuses (e.g. a table's schema)
        for a in p.admissions:
            if a.before_record is not None:
                a.before_record(w.out_files)
    except Exception:  # (a crash leaves them to the next attempt, which forgets them first)
        write.forget_outputs(st, tag, w.out_files if write.beside_tables(ds) else None)
        raise
    record = p.log.write(record, new=True)
    return record


def after_commit(p: Prepared, c: Classified, record: CommitRecord, wings: Wings,
                 clock: Clock) -> CommitRecord:
    """The wings' steps once H is committed (publish, retention, compaction: none changes a later
    result), then the record again with their figures and timings.

    The record is rewritten atomically once they are done, so it holds every figure the load
    reports. A crash in between leaves the commit-time record: valid, with the steps' figures at
    0 / absent, and H loaded; the next load's steps do the work.
    """
    done = p.committed.copy()
    done.add(p.tag)
    after = Committed(p.context, record, done, p.health, c.frame)
    changed: dict[str, Any] = {}
    for name, step in wings.after_commit:
        changed.update(step(after) or {})
        clock.lap(name)
    final = record.with_(**changed, seconds=clock.with_total())
    final = p.log.write(final)
    # H's final record joins the summary; its mtime only if no one else changed records meanwhile
    p.log.save_summary(drop={p.tag}, add=final)
    return final


def run_load(spark: SparkSession, ds: DatasetConfig, partition_key: str, wings: Wings,
             progress: Progress | None = None, *, run_hours: Collection[str] = ()) -> CommitRecord:
    """Load one hour. The caller holds the dataset lock (engine/load.py's `load_hours`).

    `run_hours`: the partition keys of the whole run. A committed hour after this one that is not
    among them refuses the load (`LaterHoursLoadedError`): reloading an hour leaves every later
    loaded hour stale unless they are reloaded after it, in the same run.

    A failed read of an index file is index damage like any other: a Hadoop ChecksumException
    (a damaged file with a stale ``.crc``) or a file gone since the load listed it (the index
    deleted under a running load). It is recorded, and the load fails with the rebuild hint or,
    with `on_damaged_index: rebuild`, is redone after the rebuild (nothing of the failed attempt
    was committed).
    """
    tags = {to_tag(parse_hour(k)) for k in run_hours}
    try:
        return _run_load(spark, ds, partition_key, wings, progress, tags)
    except Exception as e:  # noqa: BLE001 - only a failed read of an index file is handled
        bad = index.index_read_failure(e)
        if bad is None:
            raise
        st = Storage(ds.output)
        if bad.kind == "checksum":  # a missing file shows in every check's listing already
            f = index.check_index(st, ds).files.get(bad.rel)
            index.record_damage(st, {bad.rel: (f.sha256 or "") if f else ""})
        if ds.on_damaged_index != "rebuild":
            raise index.IndexDamagedError(index.damaged_message(ds, bad.describe())) from None
    return _run_load(spark, ds, partition_key, wings, progress, tags)


def _run_load(spark: SparkSession, ds: DatasetConfig, partition_key: str, wings: Wings,
              progress: Progress | None, run_tags: AbstractSet[str]) -> CommitRecord:
    """The phases in order; stage timings as the record's `seconds` names them."""
    say = progress or (lambda _msg: None)
    clock = Clock()
    with Persisted() as cache:  # released however the phases end
        p = prepare(spark, ds, partition_key, cache, say, wings, clock, run_tags)
        clock.lap("parse")
        c = decide.classify_batch(spark, ds, p, cache, say)
        clock.lap("classify")
        say(f"{ds.name} {partition_key}: {p.batch.rows_in} rows in, classified; writing outputs")
        w = write.write(ds, p, c)
        clock.lap("write_outputs")
        v = write.verify_written(spark, ds, p, c, w, clock.lap)
        hooks.at("before_commit")
        clock.lap("checks")
        record = commit(ds, p, c, w, v, clock)
        clock.lap("commit")
        result = after_commit(p, c, record, wings, clock)  # steps may read the cached batch
    say(
        f"{ds.name} {partition_key}: in={result.rows_in} unique={result.unique} "
        f"duplicates={result.duplicates} expired={result.expired} rejected={result.rejected} "
        f"({result.seconds['total']:.1f}s)"
    )
    return result
