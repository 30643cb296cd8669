"""Index recovery (design.md R12, D3) and the run failure summary.

- `{ds}_index_rebuild` job: rebuilds index entries from unique, for the given hours or all.
- `{ds}_index_recovery_sensor`: compares the index files with the commit records (listing only;
  plus the content damage a load recorded in index/_damaged.json), and each tick hashes the next
  512 MB of index files against their recorded SHA-256 (a rolling scrub; the sensor cursor is the
  last file hashed). It requests a rebuild of exactly the damaged loads; its run key names the
  damage, so a repeated tick requests nothing new while that rebuild is pending. A damaged commit
  record is reported (skip reason and warning naming file, hour and fix), not rebuilt: rerunning
  the hour repairs it.
- `{ds}_run_failure_summary`: on a failed run of the dataset, writes one paragraph (dataset,
  hours, stage, error) into that run's own event log, where the UI shows it next to the failure;
  with `{ds}_run_canceled_restate` it restates the committed hours a failed or cancelled load did
  not load (`hour_events.restate_finished_run`). Runs of other datasets and other jobs of the code
  location are left alone.
"""


import hashlib

import dagster as dg

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import contract
from dedup_pipeline.engine.core.commit_log import CommitLog
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


def build_rebuild_job(ds: DatasetConfig) -> dg.JobDefinition:
    @dg.op(name=names.rebuild_op_name(ds.name), tags={names.DATASET_TAG: ds.name},
           pool=names.pool_name(ds.name))
    def rebuild(context: dg.OpExecutionContext, config: RebuildConfig, dedup_spark: SparkResource) -> None:
        tags = [to_tag(parse_hour(h)) for h in config.hours] or None
        scope = f"{len(tags)} hour(s)" if tags else "every committed hour"
        say = runs.progress(context)
        say(f"{ds.name}: rebuilding index entries of {scope} from unique")
        with Lock(Storage(ds.output), owner=f"dagster run {context.run.run_id} (index rebuild)"):
            res = rebuild_index(dedup_spark.get_session((ds.output, ds.source.path)), ds, tags)
            after = check_index(Storage(ds.output), ds)
        say(f"{ds.name}: rebuilt {res.entries} entries of {res.loads} load(s) in "
                         f"{res.seconds:.1f}s; index now: {after.summary()}")
        if not after.index_ok:
            raise RuntimeError(f"{ds.name}: index still damaged after rebuild: {after.summary()}")
        context.log_event(dg.AssetObservation(
            asset_key=names.asset_key(ds, names.INDEX),
            metadata={"rebuilt_loads": res.loads, "rebuilt_entries": res.entries,
                      "rebuild_seconds": res.seconds}))

    @dg.job(name=names.rebuild_job_name(ds.name), tags={names.DATASET_TAG: ds.name},
            description=f"Rebuild the key index of {ds.name!r} from its unique output (R12).")
    def job() -> None:
        rebuild()

    return job


def build_migrate_job(ds: DatasetConfig) -> dg.JobDefinition:
    """`{ds}_contract_migrate`: what `dedup-pipeline migrate` runs (engine/migrate.py)."""

    @dg.op(name=names.migrate_op_name(ds.name), tags={names.DATASET_TAG: ds.name},
           pool=names.pool_name(ds.name))
    def migrate_op(context: dg.OpExecutionContext, dedup_spark: SparkResource) -> None:
        say = runs.progress(context)
        with Lock(Storage(ds.output), owner=f"dagster run {context.run.run_id} (migrate)"):
            res = migrate(dedup_spark.get_session((ds.output, ds.source.path)), ds, say)
        say(res.summary())
        if res.to_version is not None:
            context.log_event(dg.AssetObservation(
                asset_key=names.asset_key(ds, names.INDEX),
                metadata={"contract_version": res.to_version, "migrated": "; ".join(res.changes),
                          "rebuilt_loads": res.loads, "rebuilt_entries": res.entries}))

    @dg.job(name=names.migrate_job_name(ds.name), tags={names.DATASET_TAG: ds.name},
            description=f"Migrate {ds.name!r} to its config as it is now: re-derive the key index "
                        "from unique under the new contract, in one committed step.")
    def job() -> None:
        migrate_op()

    return job


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


def build_run_end_sensors(ds: DatasetConfig, running: bool = True) -> list[dg.SensorDefinition]:
    """The sensors on the dataset's runs that end without success: `{ds}_run_failure_summary` (a
    failed run: the summary paragraph into its log, then the committed hours it did not load
    restated) and `{ds}_run_canceled_restate` (a cancelled load: its committed hours restated).
    The load step restates what it can itself; these cover the runs whose step never ran
    (cancelled in the queue, a resource that would not start, a killed worker). A run is the
    dataset's by `runs.dataset_of_run`; any other run is left alone."""

    @dg.run_failure_sensor(name=names.run_failure_sensor_name(ds.name),
                           default_status=names.sensor_status(running))
    def run_failure_summary(context: dg.RunFailureSensorContext) -> None:
        """Writes one paragraph (dataset, hours, cause, fix) into the dataset's failed run's own
        event log, and restates the committed hours the run did not load."""
        run = context.dagster_run
        if runs.dataset_of_run(run) != ds.name:
            return
        err = runs.first_step_error(context.get_step_failure_events())
        summary = runs.with_config(ds, runs.failure_summary(
            run, err, context.failure_event.message or "the run failed", runs.config_path(ds)))
        context.instance.report_engine_event(summary, run)
        _restate(context.instance, run, ds)

    @dg.run_status_sensor(name=names.run_canceled_sensor_name(ds.name),
                          run_status=dg.DagsterRunStatus.CANCELED,
                          default_status=names.sensor_status(running),
                          description=f"Restates the committed hours a cancelled load of {ds.name} "
                                      "did not load, so their partitions show their committed load.")
    def run_canceled_restate(context: dg.RunStatusSensorContext) -> None:
        if runs.dataset_of_run(context.dagster_run) == ds.name:
            _restate(context.instance, context.dagster_run, ds)

    return [run_failure_summary, run_canceled_restate]
