"""One hourly load, end to end and crash-safe (design.md L1-L3, R8-R11).

`run_load` is its phases, each a function with a typed result:
 1. `prepare`: order check (every hour since `start` before H has a commit record, R11); the index
    is healthy; no hour after H is committed unless this run reloads it too (R10: a reload of H
    alone would leave later hours stale); H is forgotten (its commit record, its staged and
    published index files, also inside compacted directories, its temp outputs); the batch is
    parsed once (cached) and rows in and the batch's max expiry value are taken in one pass;
 2. `classify_batch`: L_H, X_H; only the live index slices of committed loads before H are read;
    the batch is classified (cached), all counts in one pass;
 3. `write`: each output partition is written to a temp dir and swapped in atomically (with Delta
    tables: its files are moved in beside the files a table version may still list); the index
    entries are staged;
 4. `verify_written`: conservation on the written footers, then the staged entries are moved in
    place, then unique keys and index agreement on the written files (design.md D4);
 5. `commit`: the commit record is written (atomic rename) - only now is H loaded; then
    `publish`: one Delta commit per output table (engine/lake.py; rolled forward by the next load
    if a crash cuts it short);
 6. `housekeep`: retention deletes index slices below X_{H - lag}; compaction merges slices'
    per-load directories (neither changes any later result); the record is rewritten with their
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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import checks, commits, contract, daypack, hooks, keydigest, lake
from dedup_pipeline.engine.classify import candidates, classify
from dedup_pipeline.engine.columns import FP, H1, H2, KIND, OUT, REASON, V
from dedup_pipeline.engine.commit_log import CommitLog
from dedup_pipeline.engine.commits import CommitRecord, DigestFileEntry, OutputFileEntry
from dedup_pipeline.engine.digest import digest_columns, fingerprint_column
from dedup_pipeline.engine.expiry import Number, expiry_point, expiry_point_frame, latest_point
from dedup_pipeline.engine.hooks import Progress
from dedup_pipeline.engine.index import compaction, layout, store
from dedup_pipeline.engine.index.health import (
    IndexDamage,
    IndexDamagedError,
    check_index,
    content_damage,
    damaged_message,
    index_file_manifest,
    index_read_failure,
    record_damage,
)
from dedup_pipeline.engine.index.layout import IndexFile
from dedup_pipeline.engine.index.live import (
    EarlierLoads,
    apply_retention,
    check_retention,
    live_files,
)
from dedup_pipeline.engine.landing import with_content_hashes
from dedup_pipeline.engine.lock import Lock
from dedup_pipeline.engine.outputs import (
    CONFLICT,
    DUPLICATES,
    EXPIRED,
    OUTPUTS,
    REJECTED,
    UNIQUE,
    partition,
    select_output,
    write_options,
)
from dedup_pipeline.engine.parse import (
    BatchPlan,
    InputFile,
    check_landing_root,
    failed_file,
    list_input_files,
    plan_batch,
    read_text_batch,
    type_and_reject,
)
from dedup_pipeline.engine.rebuild import ensure_healthy, ensure_intact
from dedup_pipeline.engine.storage import ROWS_PER_FILE, Storage
from dedup_pipeline.hours import HOUR, HourSet, format_hour, parse_hour, to_tag

# How the batch, its candidates and its classification are cached. PySpark's MEMORY_AND_DISK keeps
# the column batches serialized; the deserialized level (what DataFrame.cache() uses) was measured
# no faster (interleaved in one warm process, 1e5-row hours: median 9.78 s vs 8.81 s).
CACHE = StorageLevel.MEMORY_AND_DISK
TMP = "_tmp"


class Persisted:
    """Every DataFrame a load persists, released on leaving the `with` whatever happened (a
    failed check, an I/O error, an interrupt), so a long-lived session never keeps a dead load's
    batch in executor memory."""

    def __init__(self) -> None:
        self.frames: list[DataFrame] = []

    def persist(self, df: DataFrame) -> DataFrame:
        df = df.persist(CACHE)
        self.frames.append(df)
        return df

    def drop(self, df: DataFrame) -> None:
        df.unpersist()
        self.frames.remove(df)

    def __enter__(self) -> Persisted:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        frames, self.frames = self.frames, []
        for df in frames:
            try:
                df.unpersist()
            except Exception:
                if exc is None:
                    raise
                # the load's own error is the one to report (a lost session cannot release)


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


def prepare_batch(spark: SparkSession, ds: DatasetConfig,
                  plan: BatchPlan | list[str]) -> DataFrame:
    """Parse, type, reject, digest: everything a load needs from the landing files."""
    df = type_and_reject(read_text_batch(spark, ds, plan), ds)
    h1, h2 = digest_columns(ds.key, ds.source.schema)
    ok = F.col(REASON).isNull()
    # the original text is kept only where an output needs it (rejected rows): half the cache
    cols = {"_raw": F.when(~ok, F.col("_raw")), H1: F.when(ok, h1), H2: F.when(ok, h2)}
    if ds.fingerprint:
        cols[FP] = F.when(ok, fingerprint_column(ds.fingerprint, ds.source.schema))
    return df.withColumns(cols)  # one call: each withColumn re-analyses the whole plan


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
    st.remove(st.path(*keydigest.parts(tag)))
    store.clear_load(st, tag)


@dataclass(frozen=True)
class Batch:
    """The hour's landing files, parsed once and cached."""

    inputs: list[InputFile]
    frame: DataFrame  # cached
    rows_in: int
    vmax: Any  # the max expiry value of its valid rows (None without expiry)
    hashed: Future[list[InputFile]] | None = None  # `inputs` with content hashes, for the record

    def recorded_inputs(self) -> tuple[InputFile, ...]:
        """The inputs as the commit record keeps them: with their content hashes."""
        return tuple(self.hashed.result() if self.hashed is not None else self.inputs)


# Hashes the hour's landing files while Spark parses them (the driver waits on Spark meanwhile).
_HASHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dedup-input-hash")


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
    contract: contract.Verdict  # the contract H loads under (a new version is recorded at commit)

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
    digest: tuple[DigestFileEntry, ...] | None = None  # the key digest's files


@dataclass(frozen=True)
class Verified:
    """The written files pass the blocking checks; the index entries are in place."""

    figures: checks.WrittenFigures
    slices: list[int]


def prepare(spark: SparkSession, ds: DatasetConfig, partition_key: str, cache: Persisted,
            say: Progress, run_tags: AbstractSet[str] = frozenset()) -> Prepared:
    """Check that H may load (R11, a healthy index, no later loaded hour left out of the run:
    `run_tags` are the run's hours), forget any earlier attempt, parse it."""
    hour = parse_hour(partition_key)
    tag = to_tag(hour)
    check_landing_root(ds)
    st = Storage(ds.output)
    log = CommitLog(st)
    first = check_index(st, ds, log=log)  # O(live): the log's summary, not every record
    # the tables first catch up with the records (a publish a crash cut short)
    lake.repair_pending(st, ds, say)
    assert first.state is not None
    committed = first.state.committed
    # the dataset contract, before anything is written: a breaking config change stops here
    verdict = contract.check(st, ds, partition_key, committed)
    commits.check_order(ds, hour, committed)
    _say_contract(log, ds, tag, partition_key, verdict, committed, say)
    healthy = ensure_healthy(spark, ds, st, say, rerun=tag, damage=first)
    log.follow(healthy.state)
    commits.check_later_hours(ds, hour, committed, run_tags | {tag}, set(first.bad_records))
    # a rerun's hour is marked with its record: its tables keep serving that record's files
    # until the new publish, also if this attempt crashes (L1b)
    if tag in committed:
        try:
            old = log.read(tag)
        except commits.CommitRecordError:
            old = None
        if old is not None:
            lake.mark_rerun(st, ds, old)
        else:
            lake.mark_pending(st, ds, tag)
    health = _forget_attempt(spark, ds, st, tag, healthy, log, say)
    lake.drop_unpublished(st, ds, tag)
    # the records this check read, for the next check; not H's, whose record is written later
    log.save_summary(drop={tag})
    assert health.state is not None
    committed = health.state.committed.copy()
    committed.discard(tag)
    prev = log.read(to_tag(hour - HOUR)) if hour > parse_hour(ds.start) else None
    return Prepared(hour, tag, st, committed, health, log, _previous_latest(st, ds, prev),
                    _parse(spark, ds, hour, partition_key, cache, say), verdict)


def _previous_latest(st: Storage, ds: DatasetConfig, prev: CommitRecord | None) -> Number | None:
    """L_{H-1}: the previous record's, unless a migration since its load re-derived it under the
    terms in force (another expiry column or basis: its number is of another column)."""
    if prev is None:
        return None
    mig = contract.migrated_since(contract.read_history(st, prev.load_hour), prev.contract_version)
    if mig is None or mig.migration is None or mig.migration.latest_points is None:
        return prev.latest_point
    return mig.migration.latest_points.get(prev.load_hour)


def _say_contract(log: CommitLog, ds: DatasetConfig, tag: str, partition_key: str,
                  verdict: contract.Verdict, committed: HourSet, say: Progress) -> None:
    """Log a contract version about to be recorded, and a rerun under another version than the
    hour's first load (the rerun uses the contract in force now)."""
    line = contract.describe_new(verdict)
    if line:
        say(f"{ds.name} {partition_key}: {line}")
    if tag in committed:
        try:
            old = log.read(tag)
        except commits.CommitRecordError:
            old = None  # the rerun repairs it
        was = old.contract_version if old is not None else None
        if old is not None and was != verdict.version:
            said = f"contract v{was}" if was is not None else "no recorded contract"
            say(f"{ds.name} {partition_key}: rerun of an hour loaded under {said}; it is "
                f"reloaded under contract v{verdict.version}, the one in force now")


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


def _parse(spark: SparkSession, ds: DatasetConfig, hour: datetime, partition_key: str,
           cache: Persisted, say: Progress) -> Batch:
    """Parse once: one job caches the batch and yields rows in and its max expiry value."""
    inputs = list_input_files(ds, hour)
    hashed = _HASHER.submit(with_content_hashes, inputs)
    plan = plan_batch(ds, inputs)
    vmax = F.max(F.when(F.col(REASON).isNull(), F.col(V))) if ds.expiry else F.lit(None)
    while True:  # a file Spark fails to read is set aside as unreadable and the batch re-read
        frame = cache.persist(prepare_batch(spark, ds, plan))
        try:
            first = frame.agg(F.count(F.lit(1)).alias("n"), vmax.alias("vmax")).collect()[0]
            return Batch(inputs, frame, int(first["n"]), first["vmax"], hashed)
        except Exception as e:  # noqa: BLE001 - only a read failure naming a file is absorbed
            cache.drop(frame)
            bad = failed_file(e, plan)
            if bad is None:
                raise
            say(f"{ds.name} {partition_key}: {bad.path} is unreadable ({bad.error}); rejected")
            plan = plan.without(bad)


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

    delta = lake.enabled(ds)

    def write_output(name: str) -> str:
        tmp = f"{run_tmp}/{name}"
        out_df = hooks.frame(select_output(c.frame, ds, name), name,
                           select_output(c.frame, ds, DUPLICATES) if name == UNIQUE else None)
        (out_df.coalesce(n_files).write.mode("overwrite")
         .option("maxRecordsPerFile", ROWS_PER_FILE)
         .options(**write_options(ds, name, p.batch.rows_in))
         .parquet(st.to_uri(tmp)))
        return tmp

    def write_digest() -> str:  # the key digest of the typed outputs (engine/keydigest.py)
        tmp = f"{run_tmp}/{keydigest.DIGEST}"
        keydigest.write_digest(st, c.frame.filter(F.col(OUT) != REJECTED), tmp)
        return tmp

    entries = hooks.frame(c.frame.filter(F.col(OUT) == UNIQUE), "index")
    with ThreadPoolExecutor(max_workers=len(OUTPUTS) + 2) as pool:
        written = {name: pool.submit(write_output, name) for name in OUTPUTS}
        staging = pool.submit(store.stage_entries, ds, st, entries, tag, n_files)
        digesting = pool.submit(write_digest) if keydigest.ENABLED else None
        for name in OUTPUTS:
            target = st.path(*partition(name, tag))
            if delta:  # beside the files a table may still list: its commit swaps them
                out_files[name] = lake.place_files(st, written[name].result(), target)
            else:
                st.replace_dir(written[name].result(), target)
                out_files[name] = st.list_files(target, ".parquet")
            hooks.at(f"after_output:{name}")
        digest = None
        if digesting is not None:
            st.replace_dir(digesting.result(), st.path(*keydigest.parts(tag)))
            digest = keydigest.entries(st, tag)
        elif st.exists(st.path(*keydigest.parts(tag))):  # an earlier attempt's: not this load's
            st.remove(st.path(*keydigest.parts(tag)))
        staged = staging.result()
    st.remove(run_tmp)
    hooks.at("after_outputs")
    return Written(out_files, staged, digest)


def verify_written(spark: SparkSession, ds: DatasetConfig, p: Prepared, c: Classified,
                   w: Written, clock: Clock) -> Verified:
    """The blocking checks on what was written (read back, not trusted from the counts); the
    staged index entries move in place once conservation holds (timed as `write_index`). On a
    failed check everything this attempt wrote is removed: nothing is committed."""
    st, tag = p.st, p.tag
    label = f"dataset {ds.name!r} hour {p.key}"
    files = w.out_files if lake.enabled(ds) else None  # beside older versions' files
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
    """Write the commit record, after what it vouches for is on disk (local file systems)."""
    st, tag = p.st, p.tag
    for name in OUTPUTS:
        if lake.enabled(ds):
            for f in w.out_files[name]:
                st.sync_tree(f)
        else:
            st.sync_tree(st.path(*partition(name, tag)))
    if w.digest is not None:
        st.sync_tree(st.path(*keydigest.parts(tag)))
    for n in v.slices:
        st.sync_tree(st.path(layout.INDEX, layout.load_rel(n, tag)))
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
        index_slices_deleted=0,  # housekeeping's, after the commit
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
        contract_version=p.contract.version,
        key_digest=w.digest,
        publish_token=lake.new_token() if lake.enabled(ds) else None,
    )
    # the publish's preconditions, before the record: an hour is never committed unpublishable
    try:
        lake.check_publishable(st, ds, w.out_files, tag)
    except lake.PublishRefusedError:
        _forget_outputs(st, tag, w.out_files if lake.enabled(ds) else None)
        raise
    contract.record(st, p.contract)  # a new version first: the record names it
    hooks.at("after_contract")
    lake.mark_pending(st, ds, tag)  # the tables lag the record until `publish`
    p.log.write(record)
    return record


def publish(ds: DatasetConfig, p: Prepared, record: CommitRecord) -> None:
    """After the record: each output table gets one Delta commit for H (engine/lake.py). A crash
    before all four leaves H marked; the next load or `verify --repair` rolls it forward."""
    if lake.enabled(ds):
        hooks.at("before_publish")
        lake.publish_load(p.st, ds, record)


def housekeep(spark: SparkSession, ds: DatasetConfig, p: Prepared, record: CommitRecord,
              clock: Clock) -> CommitRecord:
    """Retention and compaction, after the commit, then the record again with their figures.

    They run after the commit by design: H is loaded before anything it does not need is
    touched, and neither changes a later result. Their figures (slices deleted, their timings,
    the load's total) reach the record by rewriting it atomically once they are done, so the
    record holds every figure the load reports. A crash in between leaves the commit-time record:
    valid, with the housekeeping figures at 0 / absent, and H loaded; the next load's
    housekeeping does the work.
    """
    st = p.st
    deleted = 0
    if ds.expiry is not None:  # never changes results: reads filter on v >= X_H anyway
        floor_rec = p.log.read(to_tag(p.hour - ds.index.retention_lag_hours * HOUR))
        if floor_rec is not None and contract.migrated_since(
                contract.read_history(st, p.tag), floor_rec.contract_version) is not None:
            floor_rec = None  # its X_H is of the terms before a migration: nothing is deleted
        if floor_rec is not None:
            # never below this load's own X_H: a lengthened period (an evolvable contract change)
            # must find its window in the index; with one period all along X_{H-lag} <= X_H
            floor = floor_rec.expiry_point
            if floor is not None and record.expiry_point is not None:
                floor = min(floor, record.expiry_point)
            deleted = apply_retention(st, ds, floor)
    clock.lap("retention")

    def intact(n: int, loads: list[str]) -> bool:
        found = content_damage(st, [f for f in p.health.files.values()
                                    if f.slice == n and set(f.holds) & set(loads)])
        if found:
            record_damage(st, found)
        return not found

    done = p.committed.copy()
    done.add(p.tag)
    compaction.compact(spark, ds, st, done, intact)
    clock.lap("compact")
    daypack.after_commit(st, p.tag, done)  # a complete day's digests and rejected lines, packed
    clock.lap("day_pack")
    final = record.with_(index_slices_deleted=deleted, seconds=clock.with_total())
    p.log.write(final)
    # H's final record joins the summary; its mtime only if no one else changed records meanwhile
    p.log.save_summary(drop={p.tag}, add=final)
    return final


def run_load(
    spark: SparkSession,
    ds: DatasetConfig,
    partition_key: str,
    progress: Progress | None = None,
    *,
    run_hours: Collection[str] = (),
) -> CommitRecord:
    """Load one hour. The caller holds the dataset lock (see `load_hours`).

    `run_hours`: the partition keys of the whole run. A committed hour after this one that is not
    among them refuses the load (`LaterHoursLoadedError`): reloading an hour leaves every later
    loaded hour stale unless they are reloaded after it, in the same run.

    A failed read of an index file is index damage like any other: a Hadoop ChecksumException
    (a file written before content hashes were recorded, damaged with a stale ``.crc``) or a file
    gone since the load listed it (the index deleted under a running load). It is recorded, and
    the load fails with the rebuild hint or, with `on_damaged_index: rebuild`, is redone after the
    rebuild (nothing of the failed attempt was committed).
    """
    tags = {to_tag(parse_hour(k)) for k in run_hours}
    try:
        return _run_load(spark, ds, partition_key, progress, tags)
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
    return _run_load(spark, ds, partition_key, progress, tags)


def _run_load(spark: SparkSession, ds: DatasetConfig, partition_key: str,
              progress: Progress | None, run_tags: AbstractSet[str]) -> CommitRecord:
    """The phases in order; stage timings as the record's `seconds` names them."""
    say = progress or (lambda _msg: None)
    clock = Clock()
    with Persisted() as cache:  # released however the phases end
        p = prepare(spark, ds, partition_key, cache, say, run_tags)
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
    publish(ds, p, record)
    clock.lap("publish")
    result = housekeep(spark, ds, p, record, clock)
    say(
        f"{ds.name} {partition_key}: in={result.rows_in} unique={result.unique} "
        f"duplicates={result.duplicates} expired={result.expired} rejected={result.rejected} "
        f"({result.seconds['total']:.1f}s)"
    )
    return result


def load_hours(
    spark: SparkSession,
    ds: DatasetConfig,
    partition_keys: list[str],
    progress: Progress | None = None,
    owner: str = "dedup_pipeline",
    *,
    remote: str | None = None,
    on_hour: Callable[[CommitRecord], None] | None = None,
) -> list[CommitRecord]:
    """Load hours in ascending order under the dataset lock, in this one Spark session (R11).

    The one lock-plus-hour loop: the Dagster asset runs it too. `on_hour` sees each committed
    hour as soon as it is committed, so a caller still knows which hours a failing run did commit;
    `remote` names the Spark Connect server in use, so losing it is one SparkServerError line.
    """
    from dedup_pipeline.engine.session import connect_errors

    keys = sorted(partition_keys, key=parse_hour)
    results = []
    # Lock.__exit__ never lets a failing release (the same full or read-only disk) replace the
    # load's own error
    with Lock(Storage(ds.output), owner), connect_errors(remote, spark):
        for key in keys:
            result = run_load(spark, ds, key, progress, run_hours=keys)
            results.append(result)
            if on_hour is not None:
                on_hour(result)
    return results
