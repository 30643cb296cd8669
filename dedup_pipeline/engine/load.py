"""A load as the product runs it, under the dataset lock (design.md L1-L3, R8-R11): the core's
phases (engine/core/load.py) and the wings' steps in one function, `_load`, in the order they
happen.

Before the batch is read: the Delta tables catch up with the records (a publish a crash cut
short), the dataset contract admits the config, a rerun's tables keep serving the hour's last
record until its own publish (L1b). Just before the commit record: the tables' preconditions, the
contract's new version, the tables marked pending. After the commit, in order: the Delta publish,
the key digest `explain` filters by (L2b), index retention, index compaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from collections.abc import Set as AbstractSet
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import contract, keydigest, lake
from dedup_pipeline.engine.contract import Verdict
from dedup_pipeline.engine.core import decide, hooks, write
from dedup_pipeline.engine.core import load as core
from dedup_pipeline.engine.core.batch import Persisted
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import CommitRecord
from dedup_pipeline.engine.core.hooks import Progress
from dedup_pipeline.engine.core.index import compaction, rebuild
from dedup_pipeline.engine.core.index.health import content_damage, record_damage
from dedup_pipeline.engine.core.index.live import apply_retention
from dedup_pipeline.engine.core.index.rebuild import RebuildResult
from dedup_pipeline.engine.core.lock import Lock
from dedup_pipeline.engine.core.outputs import OUT, REJECTED
from dedup_pipeline.engine.core.storage import TMP, Storage
from dedup_pipeline.engine.session import connect_errors
from dedup_pipeline.hours import HOUR, parse_hour, to_tag


def _contract(st: Storage, ds: DatasetConfig, o: core.Opened, say: Progress) -> Verdict:
    """The config against the recorded contract: a breaking change stops here."""
    verdict = contract.check(st, ds, o.partition_key, o.committed)
    line = contract.describe_new(verdict)
    if line:
        say(f"{ds.name} {o.partition_key}: {line}")
    old = o.log.read_intact(o.tag) if o.tag in o.committed else None  # damaged: the rerun repairs it
    if old is not None and old.contract_version != verdict.version:
        was = old.contract_version
        said = f"contract v{was}" if was is not None else "no recorded contract"
        say(f"{ds.name} {o.partition_key}: rerun of an hour loaded under {said}; it is "
            f"reloaded under contract v{verdict.version}, the one in force now")
    return verdict


def _migrated_latest(ds: DatasetConfig, o: core.Opened) -> tuple[float | None] | None:
    """L_{H-1} when a migration since its load re-derived it under the terms in force (another
    expiry column or basis: the previous record's number is of another column)."""
    if o.hour <= parse_hour(ds.start):
        return None
    prev = o.log.read(to_tag(o.hour - HOUR))
    if prev is None:
        return None
    mig = contract.migrated_since(contract.read_history(o.st, prev.load_hour),
                                  prev.contract_version)
    if mig is None or mig.migration is None or mig.migration.latest_points is None:
        return None
    return (mig.migration.latest_points.get(prev.load_hour),)


def _tables_rerun(ds: DatasetConfig, o: core.Opened) -> None:
    """A rerun's hour is marked with its record: its tables keep serving that record's files
    until the new publish, also if this attempt crashes (L1b); a crashed attempt's unlisted files
    go."""
    if o.tag in o.committed:
        old = o.log.read_intact(o.tag)
        if old is not None:
            lake.mark_rerun(o.st, ds, old)
        else:
            lake.mark_pending(o.st, ds, o.tag)
    lake.drop_unpublished(o.st, ds, o.tag)


def _key_digest(p: core.Prepared, classified: DataFrame) -> dict[str, Any]:
    """The hour's key digest (L2b), from the cached classification, swapped in and then listed in
    the record: a filter for `explain`, which reads an hour without a listed one in full."""
    st, tag = p.st, p.tag
    tmp = st.path(TMP, f"{tag}-{keydigest.DIGEST}-{uuid.uuid4().hex[:12]}")
    keydigest.write_digest(st, classified.filter(F.col(OUT) != REJECTED), tmp)
    target = st.path(*keydigest.parts(tag))
    st.replace_dir(tmp, target)
    st.sync_tree(target)
    return {"key_digest": keydigest.entries(st, tag)}


def _retention(ds: DatasetConfig, p: core.Prepared, rec: CommitRecord) -> dict[str, Any]:
    """Index slices below X_{H - lag} go (never changes results: reads filter on v >= X_H)."""
    if ds.expiry is None:
        return {}
    floor_rec = p.log.read(to_tag(p.hour - ds.index.retention_lag_hours * HOUR))
    if floor_rec is not None and contract.migrated_since(
            contract.read_history(p.st, p.tag), floor_rec.contract_version) is not None:
        floor_rec = None  # its X_H is of the terms before a migration: nothing is deleted
    if floor_rec is None:
        return {}
    # never below this load's own X_H: a lengthened period (an evolvable contract change) must
    # find its window in the index; with one period all along X_{H-lag} <= X_H
    floor = floor_rec.expiry_point
    if floor is not None and rec.expiry_point is not None:
        floor = min(floor, rec.expiry_point)
    return {"index_slices_deleted": apply_retention(p.st, ds, floor)}


def _compact(spark: SparkSession, ds: DatasetConfig, p: core.Prepared) -> None:
    """Per-load index directories of a slice are merged once there are enough (design.md I5);
    a file whose content does not match its record is left alone and recorded as damage."""
    st = p.st
    done = p.committed.copy()
    done.add(p.tag)

    def intact(n: int, loads: list[str]) -> bool:
        found = content_damage(st, [f for f in p.health.files.values()
                                    if f.slice == n and set(f.holds) & set(loads)])
        if found:
            record_damage(st, found)
        return not found

    compaction.compact(spark, ds, st, done, intact)


def rebuild_index(spark: SparkSession, ds: DatasetConfig,
                  tags: list[str] | None = None) -> RebuildResult:
    """The index rebuilt from unique as the product runs it (R12, K3): the config must keep the
    dataset's contract (entries under another key would match nothing), and with Delta tables the
    unique table must serve the files the records list; then the core's rebuild."""
    st = Storage(ds.output)
    committed = CommitLog(st).committed()
    contract.check(st, ds, "", committed)
    lake.check_rebuild_sources(st, ds, sorted(committed) if tags is None else tags)
    return rebuild.rebuild_index(spark, ds, tags)


def run_load(spark: SparkSession, ds: DatasetConfig, partition_key: str,
             progress: Progress | None = None, *, run_hours: Collection[str] = (),
             remote: str | None = None) -> CommitRecord:
    """Load one hour; the caller holds the dataset lock (`load_hours`).

    `run_hours`: the partition keys of the whole run. A committed hour after this one that is not
    among them refuses the load (`LaterHoursLoadedError`): reloading an hour leaves every later
    loaded hour stale unless they are reloaded after it, in the same run. A failed read of an
    index file is recorded as damage; with `on_damaged_index: rebuild` the load is redone after
    the rebuild, else it fails with the rebuild hint. `remote`: the Spark Connect server in use,
    so losing it is one SparkServerError line.
    """
    say = progress or (lambda _msg: None)
    tags = {to_tag(parse_hour(k)) for k in run_hours}
    try:
        return _load(spark, ds, partition_key, say, tags, remote)
    except Exception as e:  # noqa: BLE001 - only a failed read of an index file is retried
        core.retry_after_index_read_failure(ds, e)
    return _load(spark, ds, partition_key, say, tags, remote)


def _load(spark: SparkSession, ds: DatasetConfig, partition_key: str, say: Progress,
          run_tags: AbstractSet[str], remote: str | None) -> CommitRecord:
    """The load in the order it happens; each lap names a stage of the record's `seconds`. A
    crash before the commit record leaves H not loaded (the next attempt forgets it first);
    after it, H is loaded and the next load finishes what is left (publish, upkeep)."""
    clock = core.Clock()
    tables = lake.enabled(ds)
    # the cache is released however the load ends; a lost Connect server is named, and its client
    # closed, first: releasing the cache through it would retry the lost server once per frame
    with Persisted() as cache, connect_errors(remote, spark):
        # -- admit: may H load, under which contract, with what L_{H-1}
        o = core.open_hour(ds, partition_key)
        st = o.st
        clock.lap("index_health")
        if tables:  # the tables catch up with the records (a publish a crash cut short)
            lake.repair_pending(st, ds, say)
        clock.lap("before_tables")
        verdict = _contract(st, ds, o, say)
        clock.lap("before_contract")
        token = lake.new_token() if tables else None
        clock.lap("before_rerun")
        healthy = core.admit(spark, ds, o, say, run_tags)
        if tables:  # L1b: a rerun's tables keep serving its last record until its own publish
            _tables_rerun(ds, o)
        # -- read: H forgotten (crash from here on: H not loaded), the batch parsed and cached
        p = core.forget_and_read(spark, ds, o, healthy, cache, say, _migrated_latest(ds, o))
        clock.lap("parse")
        # -- decide
        c = decide.classify_batch(spark, ds, p, cache, say)
        clock.lap("classify")
        say(f"{ds.name} {partition_key}: {p.batch.rows_in} rows in, classified; writing outputs")
        # -- write, then the blocking checks on what was written (nothing committed on failure)
        w = write.write(ds, p, c)
        clock.lap("write_outputs")
        v = write.verify_written(spark, ds, p, c, w, clock.lap)
        hooks.at("before_commit")
        clock.lap("checks")
        # -- commit: the wings' preconditions and records, then H's record (atomic): H loaded
        fields: dict[str, Any] = {"contract_version": verdict.version}
        if tables:
            fields["publish_token"] = token
        rec = core.record(ds, p, c, w, v, clock, fields)
        try:  # an hour a wing refuses (e.g. a table's schema) is never committed
            if tables:
                lake.check_publishable(st, ds, w.out_files, p.tag)
            contract.record(st, verdict)
            hooks.at("after_contract")
            if tables:  # the tables lag the record until the publish
                lake.mark_pending(st, ds, p.tag)
        except Exception:  # (a crash leaves them to the next attempt, which forgets them first)
            core.forget_written(ds, p, w)
            raise
        rec = core.commit(p, rec)
        clock.lap("commit")
        # -- after the commit, in order; none changes a later result. A crash here leaves H
        # loaded with the commit-time record; the next load or `verify --repair` finishes
        if tables:  # one Delta commit per output table (a crash before all four: H stays marked)
            hooks.at("before_publish")
            lake.publish_load(st, ds, rec)
        clock.lap("publish")
        changed = _key_digest(p, c.frame)
        clock.lap("key_digest")
        changed.update(_retention(ds, p, rec))
        clock.lap("retention")
        _compact(spark, ds, p)
        clock.lap("compact")
        result = core.finish(p, rec, changed, clock)
        cache.release()  # here, so a server lost at the very end is named too
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
    keys = sorted(partition_keys, key=parse_hour)
    results = []
    # Lock.__exit__ never lets a failing release (the same full or read-only disk) replace the
    # load's own error
    with Lock(Storage(ds.output), owner):
        for key in keys:
            result = run_load(spark, ds, key, progress, run_hours=keys, remote=remote)
            results.append(result)
            if on_hour is not None:
                on_hour(result)
    return results
