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

import math
import time
import uuid
from collections.abc import Callable, Collection
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import checks, commits, hooks
from dedup_pipeline.engine.core.batch import Batch, Persisted, check_landing_root, read_batch
from dedup_pipeline.engine.core.classify import candidates, classify
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import CommitRecord, OutputFileEntry
from dedup_pipeline.engine.core.expiry import Number, expiry_point, expiry_point_frame, latest_point
from dedup_pipeline.engine.core.hooks import Progress
from dedup_pipeline.engine.core.index import compaction, layout, store
from dedup_pipeline.engine.core.index.health import (
    IndexDamage,
    IndexDamagedError,
    check_index,
    damaged_message,
    index_file_manifest,
    index_read_failure,
    record_damage,
)
from dedup_pipeline.engine.core.index.layout import IndexFile
from dedup_pipeline.engine.core.index.live import (
    EarlierLoads,
    check_retention,
    live_files,
)
from dedup_pipeline.engine.core.index.rebuild import ensure_healthy, ensure_intact
from dedup_pipeline.engine.core.outputs import (
    CONFLICT,
    DUPLICATES,
    EXPIRED,
    KIND,
    OUT,
    OUTPUTS,
    REJECTED,
    UNIQUE,
    partition,
    select_output,
    write_options,
)
from dedup_pipeline.engine.core.storage import ROWS_PER_FILE, Storage, place_files
from dedup_pipeline.errors import UserError
from dedup_pipeline.hours import HOUR, HourSet, format_hour, parse_hour, to_tag

TMP = "_tmp"


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
    previous_latest: tuple[Number | None] | None = None  # a 1-tuple when given


@dataclass(frozen=True)
class Committed:
    """What an after-commit step sees: the hour, its record, the committed hours (H included),
    the index files the records listed when the load checked them (healthy), and the batch's
    classification (still cached: every row with its output in `_out`)."""

    hour: HourContext
    record: CommitRecord
    committed: HourSet
    index_files: dict[str, IndexFile]
    classified: DataFrame


Check = Callable[[HourContext], Admission | None]
Step = Callable[[Committed], dict[str, Any] | None]


@dataclass(frozen=True)
class Wings:
    """The side capabilities a load calls: checks before it, steps after its commit (in order).
    A step's dict holds record fields it changed (e.g. `index_slices_deleted`)."""

    before_load: tuple[tuple[str, Check], ...] = ()
    after_commit: tuple[tuple[str, Step], ...] = ()


def beside_tables(ds: DatasetConfig) -> bool:
    """Outputs that are Delta tables: a load's files are moved in beside the files a table
    version may still list (its commit swaps them), not swapped in as a partition directory."""
    return ds.output_format == "delta"


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


def _forget_outputs(st: Storage, tag: str, files: dict[str, list[str]] | None = None) -> None:
    """Remove everything an uncommitted attempt of `tag` wrote (after a failed check): its
    partitions, or with Delta tables only its own `files` (earlier versions' stay published)."""
    for name in OUTPUTS:
        if files is None:
            st.remove(st.path(*partition(name, tag)))
        else:
            for f in files.get(name, []):
                st.remove(f)
            part = st.path(*partition(name, tag))
            if not st.list_names(part):  # no earlier version's files: no partition either
                st.remove(part)
    store.clear_load(st, tag)


@dataclass(frozen=True)
class Prepared:
    """Hour H ready to classify: loadable (R11), earlier attempts gone, its batch parsed."""

    hour: datetime
    tag: str
    st: Storage
    committed: HourSet  # committed loads, H excluded
    health: IndexDamage  # the index files the commit records list (healthy)
    log: CommitLog  # this load's own record changes go through it (it keeps the summary true)
    prev_latest: Number | None  # L_{H-1}
    batch: Batch
    context: HourContext
    admissions: tuple[Admission, ...]  # the wings' checks' (their record fields, their work)

    @property
    def key(self) -> str:
        return format_hour(self.hour)


@dataclass(frozen=True)
class Classified:
    """The batch split into the four outputs (cached), and what the index probe read."""

    latest: Number | None
    x: Number | None
    live: list[IndexFile]
    index_rows_read: int
    index_bytes_read: int
    candidates: DataFrame | None  # cached: the unique_keys check reads it again
    frame: DataFrame  # cached: every batch row with `_out` set
    counts: dict[str, int]  # per output
    conflicts: int


@dataclass(frozen=True)
class Written:
    """Each output partition swapped in, and the index entries staged (not yet in place)."""

    out_files: dict[str, list[str]]  # per output: the Parquet files its partition holds
    staged: str


@dataclass(frozen=True)
class Verified:
    """The written files pass the blocking checks; the index entries are in place."""

    figures: checks.WrittenFigures
    slices: list[int]


def prepare(spark: SparkSession, ds: DatasetConfig, partition_key: str, cache: Persisted,
            say: Progress, wings: Wings, run_tags: AbstractSet[str] = frozenset()) -> Prepared:
    """Check that H may load (R11; no later loaded hour left out of the run, R10: `run_tags` are
    the run's hours; the wings' checks; a healthy index), forget any earlier attempt, parse it."""
    hour = parse_hour(partition_key)
    tag = to_tag(hour)
    check_landing_root(ds)
    st = Storage(ds.output)
    log = CommitLog(st)
    first = check_index(st, ds, log=log)  # O(live): the log's summary, not every record
    assert first.state is not None
    committed = first.state.committed
    commits.check_order(ds, hour, committed)
    commits.check_later_hours(ds, hour, committed, run_tags | {tag}, set(first.bad_records))
    ctx = HourContext(spark, ds, st, log, hour, tag, partition_key, committed, say)
    admissions = tuple(a for _name, check in wings.before_load if (a := check(ctx)) is not None)
    healthy = ensure_healthy(spark, ds, st, say, rerun=tag, damage=first)
    log.follow(healthy.state)
    health = _forget_attempt(spark, ds, st, tag, healthy, log, say)
    # the records this check read, for the next check; not H's, whose record is written later
    log.save_summary(drop={tag})
    assert health.state is not None
    committed = health.state.committed.copy()
    committed.discard(tag)
    given = [a.previous_latest for a in admissions if a.previous_latest is not None]
    if given:
        prev_latest = given[0][0]
    else:
        prev = log.read(to_tag(hour - HOUR)) if hour > parse_hour(ds.start) else None
        prev_latest = prev.latest_point if prev is not None else None
    return Prepared(hour, tag, st, committed, health, log, prev_latest,
                    read_batch(spark, ds, hour, partition_key, cache, say), ctx, admissions)


def _forget_attempt(spark: SparkSession, ds: DatasetConfig, st: Storage, tag: str,
                    health: IndexDamage, log: CommitLog, say: Progress) -> IndexDamage:
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


def classify_batch(spark: SparkSession, ds: DatasetConfig, p: Prepared, cache: Persisted,
                   say: Progress) -> Classified:
    """Expiry points, the live index (from the commit records' manifests), the candidates the
    batch can hit (cached: classify and the unique_keys check both use them), classification."""
    st = p.st
    latest = latest_point(ds, p.hour, p.prev_latest, p.batch.vmax)
    x = expiry_point(ds, latest)
    check_retention(st, ds, x)
    readable = EarlierLoads(p.committed, p.tag)
    live = live_files(ds, p.health.files, readable, x)
    # content: exactly the files the probe will read are hashed (one pass over what Spark reads)
    if ensure_intact(spark, ds, st, live, say, rerun=p.tag):
        fresh = check_index(st, ds)
        p.log.follow(fresh.state)
        live = live_files(ds, fresh.files, readable, x)
    idx_rows = sum(f.rows if f.rows is not None else st.parquet_rows(st.path(layout.INDEX, f.rel))
                   for f in live)
    xs = expiry_point_frame(spark, ds, x)
    cands = candidates(p.batch.frame, store.read_live(spark, ds, st, live, p.tag), ds, xs)
    if cands is not None:
        cands = cache.persist(cands)
    # only what the writers and the index need is cached (the row origin has done its job)
    frame = cache.persist(classify(p.batch.frame, cands, ds, p.tag, xs).drop("_blk", "_rid"))
    # one job builds the cache the five writes read (concurrent writes on an unbuilt cache would
    # each start building it) and counts every output on the way
    agg = frame.agg(*[F.count_if(F.col(OUT) == o).alias(o) for o in OUTPUTS],
                    F.count_if(F.col(KIND) == CONFLICT).alias("conflicts")).collect()[0]
    return Classified(latest, x, live, idx_rows, sum(f.size for f in live), cands, frame,
                      {o: int(agg[o]) for o in OUTPUTS}, int(agg["conflicts"]))


def write(ds: DatasetConfig, p: Prepared, c: Classified) -> Written:
    """The outputs and the staged index entries, written concurrently from the cached
    classification (on small batches a load is mostly per-job latency). Each output partition is
    then swapped in atomically."""
    st, tag = p.st, p.tag
    run_tmp = st.path(TMP, f"{tag}-{uuid.uuid4().hex[:12]}")
    n_files = max(1, math.ceil(p.batch.rows_in / ROWS_PER_FILE))
    out_files: dict[str, list[str]] = {}

    delta = beside_tables(ds)

    def write_output(name: str) -> str:
        tmp = f"{run_tmp}/{name}"
        out_df = hooks.frame(select_output(c.frame, ds, name), name,
                           select_output(c.frame, ds, DUPLICATES) if name == UNIQUE else None)
        (out_df.coalesce(n_files).write.mode("overwrite")
         .option("maxRecordsPerFile", ROWS_PER_FILE)
         .options(**write_options(ds, name, p.batch.rows_in))
         .parquet(st.to_uri(tmp)))
        return tmp

    entries = hooks.frame(c.frame.filter(F.col(OUT) == UNIQUE), "index")
    with ThreadPoolExecutor(max_workers=len(OUTPUTS) + 1) as pool:
        written = {name: pool.submit(write_output, name) for name in OUTPUTS}
        staging = pool.submit(store.stage_entries, ds, st, entries, tag, n_files)
        for name in OUTPUTS:
            target = st.path(*partition(name, tag))
            if delta:  # beside the files a table may still list: its commit swaps them
                out_files[name] = place_files(st, written[name].result(), target)
            else:
                st.replace_dir(written[name].result(), target)
                out_files[name] = st.list_files(target, ".parquet")
            hooks.at(f"after_output:{name}")
        staged = staging.result()
    st.remove(run_tmp)
    hooks.at("after_outputs")
    return Written(out_files, staged)


def verify_written(spark: SparkSession, ds: DatasetConfig, p: Prepared, c: Classified,
                   w: Written, clock: Clock) -> Verified:
    """The blocking checks on what was written (read back, not trusted from the counts); the
    staged index entries move in place once conservation holds (timed as `write_index`). On a
    failed check everything this attempt wrote is removed: nothing is committed."""
    st, tag = p.st, p.tag
    label = f"dataset {ds.name!r} hour {p.key}"
    files = w.out_files if beside_tables(ds) else None  # beside older versions' files
    try:
        figures = checks.check_conservation(st, tag, p.batch.rows_in, label, files)
        hooks.at("after_index_staged")
        slices = store.publish_entries(st, w.staged, tag)
        clock.lap("write_index")
        checks.check_unique_and_index(spark, ds, st, tag, figures, c.candidates, label,
                                      files[UNIQUE] if files is not None else None)
    except checks.LoadCheckError:
        _forget_outputs(st, tag, files)
        raise
    return Verified(figures, slices)


def commit(ds: DatasetConfig, p: Prepared, c: Classified, w: Written, v: Verified,
           clock: Clock) -> CommitRecord:
    """The admissions' work (e.g. a new contract version, the tables' preconditions), then the
    commit record, after what it vouches for is on disk (local file systems)."""
    st, tag = p.st, p.tag
    beside = beside_tables(ds)
    for name in OUTPUTS:
        if beside:
            for f in w.out_files[name]:
                st.sync_tree(f)
        else:
            st.sync_tree(st.path(*partition(name, tag)))
    for n in v.slices:
        st.sync_tree(st.path(layout.INDEX, layout.load_rel(n, tag)))
    fields: dict[str, Any] = {}
    for a in p.admissions:
        fields.update(a.record)
    record = CommitRecord(
        dataset=ds.name,
        partition_key=p.key,
        load_hour=tag,
        rows_in=p.batch.rows_in,
        unique=c.counts[UNIQUE],
        duplicates=c.counts[DUPLICATES],
        expired=c.counts[EXPIRED],
        rejected=c.counts[REJECTED],
        conflicts=c.conflicts,
        latest_point=c.latest,
        expiry_point=c.x,
        files_in=len(p.batch.inputs),
        index_rows_written=c.counts[UNIQUE],
        index_rows_read=c.index_rows_read,
        index_bytes_read=c.index_bytes_read,
        index_files_read=len(c.live),
        index_slices_written=tuple(v.slices),
        index_slices_deleted=0,  # retention's, after the commit
        files_written=sum(len(f) for f in w.out_files.values()) + len(v.slices),
        seconds=clock.with_total(),
        check_figures=v.figures.as_metadata(),
        committed_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        index_checksum=v.figures.checksum,
        inputs=p.batch.recorded_inputs(),
        index_files=tuple(index_file_manifest(st, tag, v.slices)),
        index_format=layout.INDEX_FORMAT,
        output_files={name: tuple(OutputFileEntry(name=p_.rsplit("/", 1)[1],
                                                  size=int(st.fs.info(p_)["size"]))
                                  for p_ in files) for name, files in w.out_files.items()},
        **fields,
    )
    try:  # an hour is never committed that a wing refuses (e.g. a table's schema)
        for a in p.admissions:
            if a.before_record is not None:
                a.before_record(w.out_files)
    except UserError:
        _forget_outputs(st, tag, w.out_files if beside else None)
        raise
    p.log.write(record)
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
    after = Committed(p.context, record, done, p.health.files, c.frame)
    changed: dict[str, Any] = {}
    for name, step in wings.after_commit:
        changed.update(step(after) or {})
        clock.lap(name)
    final = record.with_(**changed, seconds=clock.with_total())
    p.log.write(final)
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
        bad = index_read_failure(e)
        if bad is None:
            raise
        st = Storage(ds.output)
        if bad.kind == "checksum":  # a missing file shows in every check's listing already
            f = check_index(st, ds).files.get(bad.rel)
            record_damage(st, {bad.rel: (f.sha256 or "") if f else ""})
        if ds.on_damaged_index != "rebuild":
            raise IndexDamagedError(damaged_message(ds, bad.describe())) from None
    return _run_load(spark, ds, partition_key, wings, progress, tags)


def _run_load(spark: SparkSession, ds: DatasetConfig, partition_key: str, wings: Wings,
              progress: Progress | None, run_tags: AbstractSet[str]) -> CommitRecord:
    """The phases in order; stage timings as the record's `seconds` names them."""
    say = progress or (lambda _msg: None)
    clock = Clock()
    with Persisted() as cache:  # released however the phases end
        p = prepare(spark, ds, partition_key, cache, say, wings, run_tags)
        clock.lap("parse")
        c = classify_batch(spark, ds, p, cache, say)
        clock.lap("classify")
        say(f"{ds.name} {partition_key}: {p.batch.rows_in} rows in, classified; writing outputs")
        w = write(ds, p, c)
        clock.lap("write_outputs")
        v = verify_written(spark, ds, p, c, w, clock)
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
