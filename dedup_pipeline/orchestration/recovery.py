"""Index recovery (design.md R12, D3) and the run failure summary.

- `{ds}_index_rebuild` job: rebuilds index entries from unique, for the given hours or all; with
  `migrate: true` in its op config, moves the dataset to its config's contract (`dedup-pipeline
  migrate`).
- `{ds}_index_recovery_sensor`: compares the index files with the commit records (listing only;
  plus the content damage a load recorded in index/_damaged.json), and each tick hashes the next
  512 MB of index files against their recorded SHA-256 (a rolling scrub; the sensor cursor is the
  last file hashed). It requests a rebuild of exactly the damaged loads; its run key names the
  damage, so a repeated tick requests nothing new while that rebuild is pending. A damaged commit
  record is reported (skip reason and warning naming file, hour and fix), not rebuilt: rerunning
  the hour repairs it.
- `{ds}_run_end`: on a failed run of the dataset, writes one paragraph (dataset, hours, stage,
  error) into that run's own event log, where the UI shows it next to the failure; and it restates
  the committed hours a failed or cancelled load did not load (`hour_events.restate_finished_run`).
  Runs of other datasets and other jobs of the code location are left alone.
"""


import hashlib
import json

import dagster as dg
from pyspark.sql import SparkSession

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import contract
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.hooks import Progress
from dedup_pipeline.engine.core.index.health import check_index, scrub
from dedup_pipeline.engine.core.lock import Lock
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import rebuild_index
from dedup_pipeline.engine.migrate import migrate
from dedup_pipeline.hours import format_tag, parse_hour, to_tag
from dedup_pipeline.orchestration import hour_events, names, runs
from dedup_pipeline.orchestration.resources import SparkResource

RECOVERY_INTERVAL_S = 120
# Index bytes hashed per sensor tick (a rolling scrub; ~0.3 s per 512 MB from the page cache at
# sha256's 1.7 GB/s, more from disk): every file is covered within size / budget ticks.
SCRUB_BYTES_PER_TICK = 512 << 20


class RebuildConfig(dg.Config):
    hours: list[str] = []  # partition keys like 2026-11-01-05:00; empty = every committed hour
    # true: move the dataset to its config's contract first (a breaking change: key, fingerprint,
    # expiry, index layout, schema), re-deriving every hour's index entries under it
    migrate: bool = False


def build_rebuild_job(ds: DatasetConfig) -> dg.JobDefinition:
    """`{ds}_index_rebuild`: index entries rebuilt from unique (R12), for the given hours or all;
    with `migrate: true`, what `dedup-pipeline migrate` runs (engine/migrate.py): the dataset moved
    to its config as it is now, in one committed step."""

    @dg.op(name=names.rebuild_op_name(ds.name), tags={names.DATASET_TAG: ds.name},
           pool=names.pool_name(ds.name))
    def rebuild(context: dg.OpExecutionContext, config: RebuildConfig, dedup_spark: SparkResource) -> None:
        if config.migrate and config.hours:
            raise dg.Failure(f"{ds.name}: `migrate: true` re-derives every hour; leave `hours` empty")
        say = runs.progress(context)
        what = "migrate" if config.migrate else "index rebuild"
        with Lock(Storage(ds.output), owner=f"dagster run {context.run.run_id} ({what})"):
            spark = dedup_spark.get_session((ds.output, ds.source.path))
            if config.migrate:
                _migrate(context, spark, ds, say)
            else:
                _rebuild(context, spark, ds, config.hours, say)

    @dg.job(name=names.rebuild_job_name(ds.name), tags={names.DATASET_TAG: ds.name},
            description=f"Rebuild the key index of {ds.name!r} from its unique output (R12): every "
                        "committed hour, or those in `hours`. With `migrate: true`: move the "
                        "dataset to its config as it is now after a breaking change, re-deriving "
                        "the index under the new contract in one committed step.")
    def job() -> None:
        rebuild()

    return job


def _rebuild(context: dg.OpExecutionContext, spark: SparkSession, ds: DatasetConfig,
             hours: list[str], say: Progress) -> None:
    tags = [to_tag(parse_hour(h)) for h in hours] or None
    scope = f"{len(tags)} hour(s)" if tags else "every committed hour"
    say(f"{ds.name}: rebuilding index entries of {scope} from unique")
    res = rebuild_index(spark, ds, tags)
    after = check_index(Storage(ds.output), ds)
    say(f"{ds.name}: rebuilt {res.entries} entries of {res.loads} load(s) in "
        f"{res.seconds:.1f}s; index now: {after.summary()}")
    if not after.index_ok:
        raise RuntimeError(f"{ds.name}: index still damaged after rebuild: {after.summary()}")
    context.log_event(dg.AssetObservation(
        asset_key=names.asset_key(ds, names.INDEX),
        metadata={"rebuilt_loads": res.loads, "rebuilt_entries": res.entries,
                  "rebuild_seconds": res.seconds}))


def _migrate(context: dg.OpExecutionContext, spark: SparkSession, ds: DatasetConfig,
             say: Progress) -> None:
    res = migrate(spark, ds, say)
    say(res.summary())
    if res.to_version is not None:
        context.log_event(dg.AssetObservation(
            asset_key=names.asset_key(ds, names.INDEX),
            metadata={"contract_version": res.to_version, "migrated": "; ".join(res.changes),
                      "rebuilt_loads": res.loads, "rebuilt_entries": res.entries}))


def build_recovery_sensor(ds: DatasetConfig, job: dg.JobDefinition, running: bool = True
                          ) -> dg.SensorDefinition:
    # targeted by name, not by the job object: Dagster binds resources to a sensor's job object by
    # copying the sensor with `owners=[]`, a beta parameter, which warns on every code load
    @dg.sensor(name=names.recovery_sensor_name(ds.name), job_name=job.name,
               minimum_interval_seconds=RECOVERY_INTERVAL_S,
               default_status=names.sensor_status(running),
               description="Detects a missing or damaged key index (files vs commit records) and "
                           "launches a rebuild of the affected hours.")
    def recovery(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        st = Storage(ds.output)
        damage = check_index(st, ds)
        context.update_cursor(scrub(st, damage, context.cursor or "", SCRUB_BYTES_PER_TICK))
        if damage.ok:
            return dg.SkipReason(f"{ds.name}: index healthy")
        context.log.warning(runs.with_config(ds, f"{ds.name}: {damage.summary()}"))
        hours = [format_tag(t) for t in damage.damaged_loads]
        if not hours:  # only damaged commit records: a rebuild cannot restore them, a rerun does
            return dg.SkipReason(runs.with_config(ds, f"{ds.name}: {damage.summary()}"))
        try:  # a rebuild under a config that breaks the contract would only fail
            contract.check(st, ds, "", CommitLog(st).committed())
        except contract.ContractError as e:
            return dg.SkipReason(runs.with_config(ds, f"{ds.name}: {damage.summary()}; not rebuilt: {e}"))
        fingerprint = hashlib.sha256(repr((damage.missing, damage.unexpected, damage.corrupt,
                                           damage.other_format)).encode()).hexdigest()
        return dg.SensorResult(run_requests=[dg.RunRequest(
            run_key=f"{ds.name}:rebuild:{fingerprint[:16]}", job_name=job.name,
            run_config={"ops": {names.rebuild_op_name(ds.name): {"config": {"hours": hours}}}},
            tags={names.DATASET_TAG: ds.name, names.REASON_TAG: "damaged index"},
        )])

    return recovery


def _restate(instance: dg.DagsterInstance, run: dg.DagsterRun, ds: DatasetConfig) -> None:
    """The committed hours of a load run of `ds` that ended without loading them, restated into
    its log (`hour_events.restate_finished_run`)."""
    if runs.is_load(run, ds.name):
        hour_events.restate_finished_run(instance, ds, run)


RUN_END_INTERVAL_S = 30
RUN_ENDS = (dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED)
RUN_ENDS_PER_TICK = 100  # per kind of end; a longer queue is taken over the next ticks


def _latest_end(instance: dg.DagsterInstance, kind: dg.DagsterEventType) -> int:
    """The storage id of the newest run end of this kind, -1 if none."""
    latest = instance.fetch_run_status_changes(kind, limit=1).records
    return latest[0].storage_id if latest else -1


def _cursor(text: str | None) -> dict[str, int] | None:
    try:
        got = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(got, dict) or {k.value for k in RUN_ENDS} - got.keys():
        return None
    return {k: int(v) for k, v in got.items()}


def _summarize(instance: dg.DagsterInstance, run: dg.DagsterRun, ds: DatasetConfig,
               message: str | None) -> None:
    """One paragraph (dataset, hours, cause, fix) into a failed run's own event log."""
    err = runs.run_error(instance, run.run_id)
    summary = runs.with_config(ds, runs.failure_summary(
        run, err, message or "the run failed", runs.config_path(ds)))
    instance.report_engine_event(summary, run)


def build_run_end_sensor(ds: DatasetConfig, running: bool = True) -> dg.SensorDefinition:
    """`{ds}_run_end`: the dataset's runs that end without success, in the order they ended. A
    failed run gets one paragraph (dataset, hours, cause, fix) in its own event log; a failed or
    cancelled load gets the committed hours it did not load restated. The load step restates what
    it can itself; this covers the runs whose step never ran (cancelled in the queue, a resource
    that would not start, a killed worker). A run is the dataset's by `runs.dataset_of_run`; any
    other run is left alone. Its cursor is the storage id of the last failure and the last
    cancellation handled; the first tick starts from the newest of each (as Dagster's run status
    sensors do), so a new dataset does not act on old runs."""

    @dg.sensor(name=names.run_end_sensor_name(ds.name), minimum_interval_seconds=RUN_END_INTERVAL_S,
               default_status=names.sensor_status(running),
               description=f"On a failed run of {ds.name!r}: one paragraph of cause and fix in "
                           "its log. On a failed or cancelled load: the committed hours it did "
                           "not load restated, so their partitions show their committed load.")
    def run_end(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        instance = context.instance
        cursor = _cursor(context.cursor)
        if cursor is None:
            context.update_cursor(json.dumps({k.value: _latest_end(instance, k) for k in RUN_ENDS}))
            return dg.SkipReason(f"watching the runs of {ds.name} that end from now on")
        handled = []
        for kind in RUN_ENDS:
            records = instance.fetch_run_status_changes(
                dg.RunStatusChangeRecordsFilter(event_type=kind, after_storage_id=cursor[kind.value]),
                limit=RUN_ENDS_PER_TICK, ascending=True).records
            for rec in records:
                run = instance.get_run_by_id(rec.run_id)
                if run is not None and runs.dataset_of_run(run) == ds.name:
                    if kind is dg.DagsterEventType.RUN_FAILURE:
                        _summarize(instance, run, ds, rec.event_log_entry.dagster_event.message)
                    _restate(instance, run, ds)
                    handled.append(run.run_id[:8])
                cursor[kind.value] = rec.storage_id
                context.update_cursor(json.dumps(cursor))  # a later error keeps what is done
        return dg.SkipReason(f"{ds.name}: handled the end of run(s) {', '.join(handled)}" if handled
                             else f"{ds.name}: no run ended without success since the last tick")

    return run_end
