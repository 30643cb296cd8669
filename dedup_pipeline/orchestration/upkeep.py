"""Upkeep of the output tables (engine/lake.py), what `dedup-pipeline vacuum` and
`verify --repair` run.

- `{ds}_table_upkeep` job: under the dataset lock (in the dataset's pool, so it queues behind a
  load), rolls pending hours forward, deletes files reruns replaced more than the retention ago
  (never a full vacuum), checkpoints each log and cleans up old log entries.
  With `repair: true` (what `dedup-pipeline verify --repair` runs) it instead rolls every hour
  forward comparing its files, and writes lost key digests again (engine/verify.py `repair`).
- `{ds}_table_upkeep_schedule`: daily at 03:15 UTC, running by default (no Spark needed).
"""

import dagster as dg

from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine import lake, verify
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.orchestration import names, runs

UPKEEP_CRON = "15 3 * * *"


class UpkeepConfig(dg.Config):
    retention_hours: int = lake.DEFAULT_RETENTION_HOURS
    repair: bool = False  # verify --repair: compare every hour's files, rewrite lost key digests


def build_upkeep(ds: DatasetConfig, running: bool = True
                 ) -> tuple[dg.JobDefinition, dg.ScheduleDefinition]:
    @dg.op(name=names.upkeep_op_name(ds.name), tags={names.DATASET_TAG: ds.name},
           pool=names.pool_name(ds.name))
    def vacuum_tables(context: dg.OpExecutionContext, config: UpkeepConfig) -> None:
        say = runs.progress(context)
        owner = f"dagster run {context.run.run_id} (table {'repair' if config.repair else 'upkeep'})"
        if config.repair:
            verify.repair(ds, owner, say)
        elif not lake.enabled(ds):
            say(f"{ds.name}: output_format is parquet: nothing to vacuum")
        else:
            lake.upkeep(Storage(ds.output), ds, config.retention_hours, owner, say)

    @dg.job(name=names.upkeep_job_name(ds.name), tags={names.DATASET_TAG: ds.name},
            description=f"Vacuum (retention, never full), checkpoint and clean up the logs of "
                        f"{ds.name!r}'s output Delta tables; with repair: true, roll every "
                        "hour forward comparing its files and write lost key digests again.")
    def job() -> None:
        vacuum_tables()

    schedule = dg.ScheduleDefinition(
        name=names.upkeep_schedule_name(ds.name), job=job, cron_schedule=UPKEEP_CRON,
        execution_timezone="UTC", default_status=(dg.DefaultScheduleStatus.RUNNING if running
                        else dg.DefaultScheduleStatus.STOPPED),
        description=f"Daily upkeep of {ds.name!r}'s output tables.")
    return job, schedule
