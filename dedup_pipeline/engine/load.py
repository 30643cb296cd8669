"""A load as the product runs it: the core (engine/core/load.py) with its wings, under the
dataset lock (design.md L1-L3, R8-R11).

Before a load, in order: the Delta tables catch up with the records (a publish a crash cut
short), the dataset contract admits the config (it records a new version just before the commit
record), a rerun's tables keep serving the hour's last record until its own publish (L1b). After
the commit, in order: the Delta publish, the key digest `explain` filters by (L2b), index
retention, index compaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import contract, keydigest, lake
from dedup_pipeline.engine.core import commits, hooks
from dedup_pipeline.engine.core import load as core
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import CommitRecord
from dedup_pipeline.engine.core.index import compaction, rebuild
from dedup_pipeline.engine.core.index.health import content_damage, record_damage
from dedup_pipeline.engine.core.index.live import apply_retention
from dedup_pipeline.engine.core.index.rebuild import RebuildResult
from dedup_pipeline.engine.core.load import Admission, Committed, HourContext, Progress, Wings
from dedup_pipeline.engine.core.lock import Lock
from dedup_pipeline.engine.core.outputs import OUT, REJECTED
from dedup_pipeline.engine.core.storage import TMP, Storage
from dedup_pipeline.engine.session import connect_errors
from dedup_pipeline.hours import HOUR, parse_hour, to_tag


def _tables_catch_up(h: HourContext) -> Admission | None:
    """The tables first catch up with the records (a publish a crash cut short); the hour's
    publish preconditions are checked before its record (it is never committed unpublishable)."""
    if not lake.enabled(h.ds):
        return None
    lake.repair_pending(h.st, h.ds, h.say)

    def publishable(files: dict[str, list[str]]) -> None:
        lake.check_publishable(h.st, h.ds, files, h.tag)

    return Admission(before_record=publishable)


def _contract(h: HourContext) -> Admission:
    """The config against the recorded contract (a breaking change stops here); a new version is
    recorded just before the commit record, which names it."""
    verdict = contract.check(h.st, h.ds, h.partition_key, h.committed)
    line = contract.describe_new(verdict)
    if line:
        h.say(f"{h.ds.name} {h.partition_key}: {line}")
    old = _last_record(h) if h.tag in h.committed else None
    if old is not None and old.contract_version != verdict.version:
        was = old.contract_version
        said = f"contract v{was}" if was is not None else "no recorded contract"
        h.say(f"{h.ds.name} {h.partition_key}: rerun of an hour loaded under {said}; it is "
              f"reloaded under contract v{verdict.version}, the one in force now")

    def record(_files: dict[str, list[str]]) -> None:
        contract.record(h.st, verdict)
        hooks.at("after_contract")

    return Admission(record={"contract_version": verdict.version}, before_record=record,
                     previous_latest=lambda: _migrated_latest(h))


def _migrated_latest(h: HourContext) -> tuple[float | None] | None:
    """L_{H-1} when a migration since its load re-derived it under the terms in force (another
    expiry column or basis: the previous record's number is of another column)."""
    if h.hour <= parse_hour(h.ds.start):
        return None
    prev = h.log.read(to_tag(h.hour - HOUR))
    if prev is None:
        return None
    mig = contract.migrated_since(contract.read_history(h.st, prev.load_hour),
                                  prev.contract_version)
    if mig is None or mig.migration is None or mig.migration.latest_points is None:
        return None
    return (mig.migration.latest_points.get(prev.load_hour),)


def _last_record(h: HourContext) -> CommitRecord | None:
    try:
        return h.log.read(h.tag)
    except commits.CommitRecordError:
        return None  # the rerun repairs it


def _tables_rerun(h: HourContext) -> Admission | None:
    """Once the hour is admitted, a rerun's hour is marked with its record: its tables keep
    serving that record's files until the new publish, also if this attempt crashes (L1b); a
    crashed attempt's unlisted files go. Its record marks the hour pending just before it is
    written: the tables lag it until the publish."""
    if not lake.enabled(h.ds):
        return None

    def admitted() -> None:
        if h.tag in h.committed:
            old = _last_record(h)
            if old is not None:
                lake.mark_rerun(h.st, h.ds, old)
            else:
                lake.mark_pending(h.st, h.ds, h.tag)
        lake.drop_unpublished(h.st, h.ds, h.tag)

    def pending(_files: dict[str, list[str]]) -> None:
        lake.mark_pending(h.st, h.ds, h.tag)

    return Admission(record={"publish_token": lake.new_token()}, before_record=pending,
                     on_admitted=admitted)


def _publish(c: Committed) -> None:
    """One Delta commit per output table for H (engine/lake.py). A crash before all four leaves
    H marked; the next load or `verify --repair` rolls it forward."""
    if lake.enabled(c.hour.ds):
        hooks.at("before_publish")
        lake.publish_load(c.hour.st, c.hour.ds, c.record)


def _key_digest(c: Committed) -> dict[str, Any]:
    """The hour's key digest (L2b), from the cached classification, swapped in and then listed in
    the record: a filter for `explain`, which reads an hour without a listed one in full."""
    st, tag = c.hour.st, c.hour.tag
    tmp = st.path(TMP, f"{tag}-{keydigest.DIGEST}-{uuid.uuid4().hex[:12]}")
    keydigest.write_digest(st, c.classified.filter(F.col(OUT) != REJECTED), tmp)
    target = st.path(*keydigest.parts(tag))
    st.replace_dir(tmp, target)
    st.sync_tree(target)
    return {"key_digest": keydigest.entries(st, tag)}


def _retention(c: Committed) -> dict[str, Any]:
    """Index slices below X_{H - lag} go (never changes results: reads filter on v >= X_H)."""
    h, ds = c.hour, c.hour.ds
    if ds.expiry is None:
        return {}
    floor_rec = h.log.read(to_tag(h.hour - ds.index.retention_lag_hours * HOUR))
    if floor_rec is not None and contract.migrated_since(
            contract.read_history(h.st, h.tag), floor_rec.contract_version) is not None:
        floor_rec = None  # its X_H is of the terms before a migration: nothing is deleted
    if floor_rec is None:
        return {}
    # never below this load's own X_H: a lengthened period (an evolvable contract change) must
    # find its window in the index; with one period all along X_{H-lag} <= X_H
    floor = floor_rec.expiry_point
    if floor is not None and c.record.expiry_point is not None:
        floor = min(floor, c.record.expiry_point)
    return {"index_slices_deleted": apply_retention(h.st, ds, floor)}


def _compact(c: Committed) -> None:
    """Per-load index directories of a slice are merged once there are enough (design.md I5);
    a file whose content does not match its record is left alone and recorded as damage."""
    st = c.hour.st

    def intact(n: int, loads: list[str]) -> bool:
        found = content_damage(st, [f for f in c.health.files.values()
                                    if f.slice == n and set(f.holds) & set(loads)])
        if found:
            record_damage(st, found)
        return not found

    compaction.compact(c.hour.spark, c.hour.ds, st, c.committed, intact)


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


WINGS = Wings(
    before_load=(("tables", _tables_catch_up), ("contract", _contract),
                 ("rerun", _tables_rerun)),
    after_commit=(("publish", _publish), ("key_digest", _key_digest), ("retention", _retention),
                  ("compact", _compact)),
)


def run_load(spark: SparkSession, ds: DatasetConfig, partition_key: str,
             progress: Progress | None = None, *, run_hours: Collection[str] = ()) -> CommitRecord:
    """Load one hour with the product's wings; the caller holds the dataset lock."""
    return core.run_load(spark, ds, partition_key, WINGS, progress, run_hours=run_hours)


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
    with Lock(Storage(ds.output), owner), connect_errors(remote, spark):
        for key in keys:
            result = run_load(spark, ds, key, progress, run_hours=keys)
            results.append(result)
            if on_hour is not None:
                on_hour(result)
    return results
