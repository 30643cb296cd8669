"""One hour's events for the Dagster UI: its materializations with that hour's own figures,
and its check evaluations targeting exactly those materializations (design.md D4, D5; per-hour
truth in the UI, D4a / D5a).

Why this module exists: in Dagster 1.13 a partition's check status is its latest evaluation
targeting its latest materialization, and neither `MaterializeResult` nor `AssetCheckResult`
takes a partition (dagster issues #18123, #17836), so a ranged run stamps every hour alike. A
ranged run therefore yields, per hour, `AssetMaterialization`s and `AssetCheckEvaluation`s that
name the materialization they judge, whose type Dagster does not re-export: this module imports
it from `dagster._core` (the package's only `dagster._` import; the component imports one name
from `dagster.components` that the top-level package does not re-export, and `landing_checks.py`
overrides one private method of `AssetCheckResult`). One-hour runs take Dagster's own output
events (`assets.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData as TargetMaterialization,  # not re-exported
)

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import lake
from dedup_pipeline.engine.core.checks import LoadCheckError
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import CommitRecord
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import HourSet, format_hour, format_tag, hour_range, parse_hour, to_tag
from dedup_pipeline.orchestration import checks, names
from dedup_pipeline.orchestration.explain import key_sampler, sample_metadata
from dedup_pipeline.orchestration.names import INDEX, PARTITION, RANGE_END, RANGE_START, asset_key


def as_event(ds: DatasetConfig, e: checks.Evaluation, partition: str,
             target: TargetMaterialization | None
             ) -> dg.AssetCheckEvaluation:
    """The evaluation of one hour, for that partition, targeting that hour's latest
    materialization (so Dagster counts it as current: Passed/Failed, not Missing)."""
    return dg.AssetCheckEvaluation(
        asset_key=asset_key(ds, e.asset), check_name=e.name, passed=e.passed,
        severity=e.severity, partition=partition, metadata=e.metadata,
        blocking=checks.CHECKS[e.name][1], target_materialization_data=target)


def _point(ds: DatasetConfig, value: float | int) -> Any:
    """An expiry-axis point as the UI should show it: a time for timestamp/date expiry columns
    (v is epoch microseconds / days), the number itself otherwise."""
    kind = ds.expiry_type
    if kind == "timestamp":
        return dg.MetadataValue.timestamp(value / 1_000_000)
    if kind == "date":
        return dg.MetadataValue.timestamp(value * 86_400)
    return value


def hour_metadata(ds: DatasetConfig, r: CommitRecord) -> dict[str, Any]:
    """The figures of ONE hour, put on that hour's materialization so Plots -> Partitions shows
    one point per loaded hour (D5)."""
    md: dict[str, Any] = {
        "rows_in": r.rows_in,
        "unique": r.unique,
        "duplicates": r.duplicates,
        "expired": r.expired,
        "rejected": r.rejected,
        "conflicts": r.conflicts,
        **r.rates,
        "index_keys_written": r.index_rows_written,
        "index_rows_read": r.index_rows_read,
        "index_bytes_read": r.index_bytes_read,
        "files_in": r.files_in,
        "files_written": r.files_written,
    }
    if r.latest_point is not None:
        md["latest_point"] = _point(ds, r.latest_point)
    if r.expiry_point is not None:
        md["expiry_point"] = _point(ds, r.expiry_point)
    for stage, secs in r.seconds.items():
        md[f"seconds_{stage}"] = secs
    return md


def table_metadata(ds: DatasetConfig, name: str, tag: str) -> dict[str, Any]:
    """Where a downstream asset reads output `name`'s hour `tag`: the Delta table's path, the table
    version that committed the hour, and the hour's file count in it."""

    if name == INDEX or not lake.enabled(ds):
        return {}
    st = Storage(ds.output)
    found = lake.hour_files(st, name, tag)
    if found is None:
        return {}
    return {"table_path": dg.MetadataValue.path(lake.table_path(st, name)),
            "delta_version": found[0], "table_files": found[1]}


def output_metadata(ds: DatasetConfig, r: CommitRecord, name: str,
                    md: dict[str, Any] | None = None) -> dict[str, Any]:
    """What output `name`'s materialization of hour `r` carries: its rows, the hour's figures
    (`md`, else built), where its table holds the hour."""
    return {"dagster/row_count": row_count(r, name), **(md or hour_metadata(ds, r)),
            **table_metadata(ds, name, r.load_hour)}


def row_count(r: CommitRecord, name: str) -> int:
    return r.index_rows_written if name == INDEX else int(getattr(r, name))


def _latest_materialization(instance: dg.DagsterInstance, key: dg.AssetKey, pk: str
                            ) -> TargetMaterialization | None:
    """The partition's latest materialization, the one Dagster compares a check's target with
    (AssetCheckPartitionInfo.is_current): an evaluation targeting anything else shows Missing."""
    recs = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[pk]), limit=1).records
    if not recs:
        return None
    return TargetMaterialization(
        storage_id=recs[0].storage_id, run_id=recs[0].run_id, timestamp=recs[0].timestamp)


def _evaluations(instance: dg.DagsterInstance, ds: DatasetConfig, pk: str,
                 evals: list[checks.Evaluation]) -> Iterator[dg.AssetCheckEvaluation]:
    targets: dict[str, Any] = {}
    for e in evals:
        if e.asset not in targets:
            targets[e.asset] = _latest_materialization(instance, names.asset_key(ds, e.asset), pk)
        yield as_event(ds, e, pk, targets[e.asset])


CHECKS_ASSET = {name: asset for name, (asset, _, _) in checks.CHECKS.items()}


def of_hour(context: dg.AssetExecutionContext, ds: DatasetConfig, keys: list[dg.AssetKey],
                 raw_key: dg.AssetKey, r: CommitRecord, session: Any = None) -> Iterator[Any]:
    """One hour's events, in the order the UI needs them: its materializations (its own figures),
    then its check evaluations targeting exactly those materializations.

    Yielded (not `context.log_event`-ed): a yielded event is stored before the generator resumes,
    so the evaluations can name the materializations' storage ids.
    """
    pk = r.partition_key
    md = hour_metadata(ds, r)  # the same for every output: built once
    yield dg.AssetObservation(asset_key=raw_key, partition=pk,
                              metadata={"rows": r.rows_in, "files": r.files_in})
    for key in keys:
        yield dg.AssetMaterialization(asset_key=key, partition=pk,
                                      metadata=output_metadata(ds, r, key.path[-1], md))
    yield from _evaluations(context.instance, ds, pk, evaluate(ds, r, session))


def evaluate(ds: DatasetConfig, r: CommitRecord, spark: Any) -> list[checks.Evaluation]:
    """The hour's checks; failing ones that sample keys get sample keys and an explain command."""
    evals = checks.evaluate(ds, r)
    if spark is None:
        return evals
    return checks.with_sample_keys(evals, key_sampler(ds, r.partition_key))


def failed_check(context: dg.AssetExecutionContext, ds: DatasetConfig, pk: str,
                  err: LoadCheckError) -> dg.AssetCheckEvaluation:
    """The failed blocking check of the hour that stopped the run (it committed nothing)."""
    target = _latest_materialization(
        context.instance, names.asset_key(ds, CHECKS_ASSET[err.check]), pk)
    return as_event(
        ds, checks.Evaluation(err.check, False, {"error": str(err), **err.figures,
                                                 **sample_metadata(ds, err.sample_keys)}),
        pk, target)


def restate(context: dg.AssetExecutionContext, ds: DatasetConfig, keys: list[dg.AssetKey],
            pk: str) -> Iterator[Any]:
    """The committed load of an hour this run planned but did not load (it was refused or failed
    before or while loading it, and wrote nothing in it): that load's materializations and check
    evaluations, again, marked as restated. Nothing for an hour that was never loaded.

    Why materializations, not only evaluations: Dagster derives a partition's "Failed" status from
    its latest planned-or-materialized event (`get_latest_asset_partition_materialization_attempts_
    without_materializations`): the run's creation logs one ASSET_MATERIALIZATION_PLANNED per
    partition, and if the run then fails with no materialization after it, the committed hour
    turns red in every partition bar, and the failed-partition set of the status cache keeps it
    until a later materialization of the hour. The restated materialization is that later one.
    """
    rec = CommitLog(Storage(ds.output)).read(to_tag(parse_hour(pk)))
    if rec is None:
        return
    note = (f"restated from the committed load of {pk}: run {context.run.run_id} did not load "
            "this hour and changed nothing in it")
    md = {**hour_metadata(ds, rec), "restated": note}
    for key in keys:
        yield dg.AssetMaterialization(asset_key=key, partition=pk,
                                      metadata=output_metadata(ds, rec, key.path[-1], md))
    evals = [checks.Evaluation(e.name, e.passed, {**e.metadata, "note": note})
             for e in checks.evaluate(ds, rec)]
    yield from _evaluations(context.instance, ds, pk, evals)


def committed(ds: DatasetConfig, pk: str) -> bool:
    return CommitLog(Storage(ds.output)).read(to_tag(parse_hour(pk))) is not None


def run_hours(run: dg.DagsterRun) -> list[str]:
    """The hours (partition keys) a run targeted, from Dagster's partition tags; [] for none."""

    start = run.tags.get(RANGE_START) or run.tags.get(PARTITION)
    end = run.tags.get(RANGE_END) or start
    if not start or not end:
        return []
    try:
        return [format_hour(h) for h in hour_range(start, end)]
    except ValueError:
        return []


def restate_finished_run(instance: dg.DagsterInstance, ds: DatasetConfig, run: dg.DagsterRun
                         ) -> list[str]:
    """After a load run ended without success (cancelled, or failed before its step could restate
    anything: a queued run cancelled, a resource that would not start, a killed worker): the
    committed loads of the hours it targeted, restated into the run's own event log, so its
    planned materializations and checks leave no committed hour Failed or Skipped. An hour the run
    itself materialized (loaded, or restated in its step) is left alone, and so is one a later run
    materialized (its retry): that run's events are already the hour's latest, and restating
    after them would put this run's evaluations last, of checks it may never have planned.
    Returns the hours restated."""
    from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData

    log = CommitLog(Storage(ds.output))
    keys = [names.asset_key(ds, n) for n in names.WRITTEN]
    created = instance.get_run_record_by_id(run.run_id)
    since = created.create_timestamp.timestamp() if created is not None else 0.0
    done: list[str] = []
    for pk in run_hours(run):
        rec = log.read(to_tag(parse_hour(pk)))
        if rec is None:
            continue
        latest = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=keys[0], asset_partitions=[pk]), limit=1).records
        if latest and (latest[0].run_id == run.run_id or latest[0].timestamp > since):
            continue
        note = (f"restated from the committed load of {pk}: run {run.run_id} "
                f"({run.status.value.lower()}) did not load this hour and changed nothing in it")
        md = {**hour_metadata(ds, rec), "restated": note}
        for key in keys:
            mat = dg.AssetMaterialization(asset_key=key, partition=pk,
                                          metadata=output_metadata(ds, rec, key.path[-1], md))
            instance.report_dagster_event(DagsterEvent(
                DagsterEventType.ASSET_MATERIALIZATION.value, job_name=run.job_name,
                event_specific_data=StepMaterializationData(mat)), run.run_id)
        evals = [checks.Evaluation(e.name, e.passed, {**e.metadata, "note": note})
                 for e in checks.evaluate(ds, rec)]
        for ev in _evaluations(instance, ds, pk, evals):
            instance.report_dagster_event(DagsterEvent(
                DagsterEventType.ASSET_CHECK_EVALUATION.value, job_name=run.job_name,
                event_specific_data=ev), run.run_id)
        done.append(pk)
    return done


# Hours reported per landing-sensor tick at most: a history loaded elsewhere is reported over a
# few ticks, each tick's events a bounded batch.
UNSEEN_PER_TICK = 48


def unseen_hours(instance: dg.DagsterInstance, ds: DatasetConfig, committed: HourSet,
                 limit: int = UNSEEN_PER_TICK) -> list[str]:
    """Committed hours (partition keys, oldest first) of which this instance holds no
    materialization of `unique`: loaded through another instance (a `dg launch` on a temporary
    one, a CLI run under another DAGSTER_HOME) or before the instance was wiped. One query."""
    seen = instance.get_materialized_partitions(asset_key(ds, "unique"))
    return [pk for pk in (format_tag(t) for t in committed) if pk not in seen][:limit]


def report_unseen(ds: DatasetConfig, log: CommitLog, hours: list[str]) -> list[dg.AssetMaterialization]:
    """The materializations that make committed hours this instance never saw loaded show loaded
    (the landing sensor reports them as its tick's asset events): each output's and the index's,
    with the hour's figures from its commit record and a note saying where they come from. Its
    checks are not evaluated again (their latest evaluations stay the instance's)."""
    events: list[dg.AssetMaterialization] = []
    for pk in hours:
        rec = log.read(to_tag(parse_hour(pk)))
        if rec is None:
            continue
        note = (f"reported from the commit record of {pk}: the hour was loaded outside this "
                "Dagster instance (another DAGSTER_HOME, or a temporary one), and is loaded")
        md = {**hour_metadata(ds, rec), "reported": note}
        events += [dg.AssetMaterialization(asset_key=asset_key(ds, n), partition=pk,
                                           metadata=output_metadata(ds, rec, n, md))
                   for n in names.WRITTEN]
    return events
