"""One hourly load, end to end and crash-safe (SPEC L1-L3, R8-R11).

Sequence for load H (the caller holds the dataset lock):
 1. order check: every hour since `start` before H has a commit record (R11);
 2. forget H: delete its commit record, its staged and published index files (also inside
    compacted directories), its temp outputs;
 3. parse the batch once (cached), take rows in and the batch's max expiry value in one pass;
 4. L_H, X_H; read only the live index slices of committed loads before H; classify (cached);
    all counts in one pass;
 5. each output partition is written to a temp dir and swapped in atomically;
 6. index entries are staged, then moved in place;
 7. the commit record is written (atomic rename) - only now is H loaded;
 8. retention deletes index slices below X_{H - lag}; compaction merges slices' per-load
    directories (neither changes any later result).
A crash anywhere before 7 leaves H "not loaded"; a rerun redoes 2-7 and, being deterministic and
reading only entries of loads before H, produces the same rows and the same index (R10).
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import checks, commits
from dedup_pipeline.engine.classify import (
    CONFLICT,
    DUPLICATES,
    EXPIRED,
    EXPIRY_POINT,
    FIRST,
    KIND,
    OUT,
    OUTPUTS,
    REJECTED,
    UNIQUE,
    candidates,
    classify,
)
from dedup_pipeline.engine.digest import FP, H1, H2, digest_columns, fingerprint_column
from dedup_pipeline.engine.expiry import Number, expiry_point, expiry_point_frame, latest_point
from dedup_pipeline.engine.index import compaction, layout, store
from dedup_pipeline.engine.index.health import (
    IndexDamagedError,
    check_index,
    checksum_failure,
    content_damage,
    damaged_message,
    index_file_manifest,
    record_damage,
)
from dedup_pipeline.engine.index.live import apply_retention, check_retention, live_files
from dedup_pipeline.engine.parse import (
    REASON,
    SPARK_TYPES,
    BatchPlan,
    V,
    check_landing_root,
    failed_file,
    list_input_files,
    plan_batch,
    read_text_batch,
    type_and_reject,
)
from dedup_pipeline.engine.rebuild import ensure_healthy, ensure_intact
from dedup_pipeline.engine.storage import ROWS_PER_FILE, Storage
from dedup_pipeline.hours import HOUR, parse_key, to_key, to_tag

# How the batch, its candidates and its classification are cached. PySpark's MEMORY_AND_DISK keeps
# the column batches serialized; the deserialized level (what DataFrame.cache() uses) was measured
# no faster (interleaved in one warm process, 1e5-row hours: median 9.78 s vs 8.81 s).
CACHE = StorageLevel.MEMORY_AND_DISK
TMP = "_tmp"
FAULT_ENV = "DEDUP_FAULT"  # fault injection for the crash tests: kill the process at a named point

Progress = Callable[[str], None]


@dataclass
class LoadResult:
    """What one load did; every figure is also in the commit record."""

    dataset: str
    partition_key: str
    load_hour: str
    rows_in: int
    unique: int
    duplicates: int
    expired: int
    rejected: int
    conflicts: int
    latest_point: Number | None
    expiry_point: Number | None
    files_in: int
    index_rows_written: int
    index_rows_read: int
    index_bytes_read: int
    index_files_read: int
    index_slices_written: list[int]
    index_slices_deleted: int
    files_written: int
    seconds: dict[str, float] = field(default_factory=dict)
    check_figures: dict[str, Any] = field(default_factory=dict)

    @property
    def duplicate_rate(self) -> float:
        valid = self.unique + self.duplicates
        return self.duplicates / valid if valid else 0.0

    def as_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> LoadResult:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in rec.items() if k in names})


def _fault(point: str) -> None:
    if os.environ.get(FAULT_ENV) == point:
        os._exit(137)


def _sabotage(df: DataFrame, what: str) -> DataFrame:
    """Fault injection for the check tests: lose one row, or swap one for a copy of another."""
    fault = os.environ.get(FAULT_ENV, "")
    if fault not in (f"lose_row:{what}", f"dup_row:{what}"):
        return df
    n = df.count()
    if fault == f"lose_row:{what}" and n > 0:
        return df.limit(n - 1)
    if fault == f"dup_row:{what}" and n > 1:
        return df.limit(n - 1).unionByName(df.limit(1))
    return df


def _unpersist(frames: list[DataFrame]) -> None:
    for df in frames:
        df.unpersist()


def _source_columns(ds: DatasetConfig) -> list[str]:
    return list(ds.source.schema)


def output_columns(ds: DatasetConfig, name: str) -> list[str]:
    src = _source_columns(ds)
    return {
        UNIQUE: [*src, "_source_file"],
        DUPLICATES: [*src, "_source_file", KIND, FIRST],
        EXPIRED: [*src, "_source_file", EXPIRY_POINT],
        REJECTED: ["_source_file", REASON, "_raw"],
    }[name]


def _expiry_point_type(ds: DatasetConfig) -> T.DataType:
    kind = ds.expiry_type
    if kind is None or kind == "category":
        return T.StringType()
    return SPARK_TYPES[kind]


def _select_output(df: DataFrame, ds: DatasetConfig, name: str) -> DataFrame:
    cols = []
    for c in output_columns(ds, name):
        if c in df.columns:
            col = F.col(c)
            if c == EXPIRY_POINT:
                col = col.cast(_expiry_point_type(ds))
            cols.append(col.alias(c))
        else:  # e.g. `_expiry_point` before anything could expire
            cols.append(F.lit(None).cast(_expiry_point_type(ds)).alias(c))
    return df.filter(F.col(OUT) == name).select(*cols)


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


def _forget_outputs(st: Storage, tag: str) -> None:
    """Remove everything an uncommitted attempt of `tag` wrote (after a failed check)."""
    for name in OUTPUTS:
        st.remove(st.path(name, f"load_hour={tag}"))
    store.clear_load(st, tag)


def run_load(
    spark: SparkSession,
    ds: DatasetConfig,
    partition_key: str,
    progress: Progress | None = None,
) -> LoadResult:
    """Load one hour. The caller holds the dataset lock (see `load_hours`).

    A Hadoop ChecksumException on an index file (a file written before content hashes were
    recorded, damaged with a stale ``.crc``) is index damage like any other: it is recorded, and the
    load fails with the rebuild hint or, with `on_damaged_index: rebuild`, is redone after the
    rebuild (nothing of the failed attempt was committed).
    """
    try:
        return _run_load(spark, ds, partition_key, progress)
    except Exception as e:  # noqa: BLE001 - only a checksum failure on an index file is handled
        rel = checksum_failure(e)
        if rel is None:
            raise
        st = Storage(ds.output)
        f = check_index(st, ds).files.get(rel)
        record_damage(st, {rel: (f.sha256 or "") if f else ""})
        if ds.on_damaged_index != "rebuild":
            raise IndexDamagedError(damaged_message(
                ds, f"index/{rel} fails its checksum when read")) from None
    return _run_load(spark, ds, partition_key, progress)


def _run_load(
    spark: SparkSession,
    ds: DatasetConfig,
    partition_key: str,
    progress: Progress | None = None,
) -> LoadResult:
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(stage: str, since: float) -> float:
        now = time.perf_counter()
        timings[stage] = round(now - since, 3)
        return now

    hour = parse_key(partition_key)
    tag = to_tag(hour)
    check_landing_root(ds)
    st = Storage(ds.output)
    committed = commits.committed_tags(st)
    commits.check_order(ds, hour, committed)
    health = ensure_healthy(spark, ds, st, say, rerun=tag)

    # 2. forget any earlier attempt of this hour
    commits.invalidate(st, tag)
    committed.discard(tag)
    store.clear_load(st, tag)
    # a compacted file holding this hour is rewritten from its own bytes: check them first
    if ensure_intact(spark, ds, st, [f for f in health.files.values() if f.loads and tag in f.holds],
                     say, rerun=tag):
        health = check_index(st, ds)
    if compaction.remove_load(spark, ds, st, tag):
        health = check_index(st, ds)  # compacted files were rewritten: read the new manifest
    for leftover in st.list_dirs(st.path(TMP)):
        if leftover.startswith(tag):
            st.remove(st.path(TMP, leftover))
    st.purge_trash()

    prev = commits.read_commit(st, to_tag(hour - HOUR)) if hour > parse_key(ds.start) else None
    prev_latest = prev.get("latest_point") if prev else None

    # 3. parse once: one job caches the batch and yields rows in and its max expiry value
    inputs = list_input_files(ds, hour)
    plan = plan_batch(ds, inputs)
    vmax = F.max(F.when(F.col(REASON).isNull(), F.col(V))) if ds.expiry else F.lit(None)
    while True:  # a file Spark fails to read is set aside as unreadable and the batch re-read
        batch = prepare_batch(spark, ds, plan).persist(CACHE)
        try:
            first = batch.agg(F.count(F.lit(1)).alias("n"), vmax.alias("vmax")).collect()[0]
            break
        except Exception as e:  # noqa: BLE001 - only a read failure naming a file is absorbed
            batch.unpersist()
            bad = failed_file(e, plan)
            if bad is None:
                raise
            say(f"{ds.name} {partition_key}: {bad.path} is unreadable ({bad.error}); rejected")
            plan = plan.without(bad)
    cached = [batch]
    rows_in = int(first["n"])
    t = lap("parse", t0)

    # 4. expiry points, the live index (from the commit records' manifests), the candidates the
    # batch can hit (cached: classify and the unique_keys check both use them), classification
    latest = latest_point(ds, hour, prev_latest, first["vmax"])
    x = expiry_point(ds, latest)
    check_retention(st, ds, x)
    readable = {c for c in committed if c < tag}
    live = live_files(ds, health.files, readable, x)
    # content: exactly the files the probe will read are hashed (one pass over what Spark reads)
    if ensure_intact(spark, ds, st, live, say, rerun=tag):
        live = live_files(ds, check_index(st, ds).files, readable, x)
    idx_rows = sum(f.rows if f.rows is not None else st.parquet_rows(st.path(layout.INDEX, f.rel))
                   for f in live)
    idx_bytes = sum(f.size for f in live)
    xs = expiry_point_frame(spark, ds, x)
    cands = candidates(batch, store.read_live(spark, ds, st, live, tag), ds, xs)
    if cands is not None:
        cands = cands.persist(CACHE)
        cached.append(cands)
    # only what the writers and the index need is cached (the row origin has done its job)
    classified = (classify(batch, cands, ds, tag, xs).drop("_blk", "_rid")
                  .persist(CACHE))
    cached.append(classified)
    # one job builds the cache the five writes below read (concurrent writes on an unbuilt cache
    # would each start building it) and counts every output on the way
    agg = classified.agg(*[F.count_if(F.col(OUT) == o).alias(o) for o in OUTPUTS],
                         F.count_if(F.col(KIND) == CONFLICT).alias("conflicts")).collect()[0]
    t = lap("classify", t)
    say(f"{ds.name} {partition_key}: {rows_in} rows in, classified; writing outputs")

    # 5. outputs and the staged index entries, written concurrently from the cached classification
    # (on small batches a load is mostly per-job latency). Each output partition is then swapped
    # in atomically; the conservation check reads the counts back from the written footers.
    run_tmp = st.path(TMP, f"{tag}-{uuid.uuid4().hex[:12]}")
    n_files = max(1, math.ceil(rows_in / ROWS_PER_FILE))
    out_files: dict[str, list[str]] = {}  # per output: the Parquet files its partition holds

    def write_output(name: str) -> str:
        tmp = f"{run_tmp}/{name}"
        out_df = _sabotage(_select_output(classified, ds, name), name)
        (out_df.coalesce(n_files).write.mode("overwrite")
         .option("maxRecordsPerFile", ROWS_PER_FILE)
         .parquet(st.to_uri(tmp)))
        return tmp

    label = f"dataset {ds.name!r} hour {to_key(hour)}"
    entries = _sabotage(classified.filter(F.col(OUT) == UNIQUE), "index")
    with ThreadPoolExecutor(max_workers=len(OUTPUTS) + 1) as pool:
        written = {name: pool.submit(write_output, name) for name in OUTPUTS}
        staging = pool.submit(store.stage_entries, ds, st, entries, tag, n_files)
        for name in OUTPUTS:
            target = st.path(name, f"load_hour={tag}")
            st.replace_dir(written[name].result(), target)
            out_files[name] = st.list_files(target, ".parquet")
            _fault(f"after_output:{name}")
        staged = staging.result()
    st.remove(run_tmp)
    _fault("after_outputs")
    files_written = sum(len(files) for files in out_files.values())
    t = lap("write_outputs", t)
    try:
        figures = checks.check_conservation(st, tag, rows_in, label)
        # 6. index entries: staged above, moved in place only now
        _fault("after_index_staged")
        slices = store.publish_entries(st, staged, tag)
        files_written += len(slices)
        t = lap("write_index", t)
        checks.check_unique_and_index(spark, ds, st, tag, figures, cands, label)
    except checks.LoadCheckError:
        _unpersist(cached)
        _forget_outputs(st, tag)
        raise
    _unpersist(cached)
    _fault("before_commit")
    t = lap("checks", t)

    counts = {o: int(agg[o]) for o in OUTPUTS}
    result = LoadResult(
        dataset=ds.name,
        partition_key=to_key(hour),
        load_hour=tag,
        rows_in=rows_in,
        unique=counts[UNIQUE],
        duplicates=counts[DUPLICATES],
        expired=counts[EXPIRED],
        rejected=counts[REJECTED],
        conflicts=int(agg["conflicts"]),
        latest_point=latest,
        expiry_point=x,
        files_in=len(inputs),
        index_rows_written=counts[UNIQUE],
        index_rows_read=idx_rows,
        index_bytes_read=idx_bytes,
        index_files_read=len(live),
        index_slices_written=slices,
        index_slices_deleted=0,
        files_written=files_written,
        check_figures=figures.as_metadata(),
    )
    # 7. commit: what the record vouches for is on disk first (local file systems)
    for name in OUTPUTS:
        st.sync_tree(st.path(name, f"load_hour={tag}"))
    for n in slices:
        st.sync_tree(st.path(layout.INDEX, layout.load_rel(n, tag)))
    result.seconds = {**timings, "total": round(time.perf_counter() - t0, 3)}
    record = result.as_record()
    record.update(
        committed_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        index_checksum=figures.checksum,
        inputs=[{"path": f.path, "size": f.size, "mtime": f.mtime} for f in inputs],
        index_files=index_file_manifest(st, tag, slices),
        index_format=layout.INDEX_FORMAT,
        output_files={name: [{"name": p.rsplit("/", 1)[1], "size": int(st.fs.info(p)["size"])}
                             for p in files] for name, files in out_files.items()},
    )
    commits.write_commit(st, tag, record)
    t = lap("commit", t)

    # 8. retention (never changes results: reads filter on v >= X_H anyway)
    if ds.expiry is not None:
        floor_rec = commits.read_commit(st, to_tag(hour - ds.index.retention_lag_hours * HOUR))
        if floor_rec is not None:
            result.index_slices_deleted = apply_retention(
                st, ds, floor_rec.get("expiry_point"))
    t = lap("retention", t)
    def intact(n: int, loads: list[str]) -> bool:
        found = content_damage(st, [f for f in health.files.values()
                                    if f.slice == n and set(f.holds) & set(loads)])
        if found:
            record_damage(st, found)
        return not found

    compaction.compact(spark, ds, st, committed | {tag}, intact)
    lap("compact", t)
    timings["total"] = round(time.perf_counter() - t0, 3)
    result.seconds = timings
    say(
        f"{ds.name} {partition_key}: in={rows_in} unique={result.unique} "
        f"duplicates={result.duplicates} expired={result.expired} rejected={result.rejected} "
        f"({timings['total']:.1f}s)"
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
    on_hour: Callable[[LoadResult], None] | None = None,
) -> list[LoadResult]:
    """Load hours in ascending order under the dataset lock, in this one Spark session (R11).

    The one lock-plus-hour loop: the Dagster asset runs it too. `on_hour` sees each committed
    hour as soon as it is committed, so a caller still knows which hours a failing run did commit;
    `remote` names the Spark Connect server in use, so losing it is one SparkServerError line.
    """
    from dedup_pipeline.engine.session import connect_errors
    from dedup_pipeline.engine.storage import Lock

    keys = sorted(partition_keys, key=parse_key)
    results = []
    # Lock.__exit__ never lets a failing release (the same full or read-only disk) replace the
    # load's own error
    with Lock(Storage(ds.output), owner), connect_errors(remote):
        for key in keys:
            result = run_load(spark, ds, key, progress)
            results.append(result)
            if on_hour is not None:
                on_hour(result)
    return results
