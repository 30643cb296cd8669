"""Assemble the Definitions for a pipeline config: one `dg.Definitions` per dataset, merged with
`Definitions.merge` beside one Spark resource and the in-process executor (one Spark driver per
run, not one per step)."""

from __future__ import annotations

import warnings

import dagster as dg

from dedup_pipeline.config import DatasetConfig, PipelineConfig
from dedup_pipeline.orchestration.assets import build_dataset_defs
from dedup_pipeline.orchestration.explain import build_explain_job
from dedup_pipeline.orchestration.landing_checks import build_input_check
from dedup_pipeline.orchestration.recovery import (
    build_migrate_job,
    build_rebuild_job,
    build_recovery_sensor,
    build_run_end_sensors,
)
from dedup_pipeline.orchestration.resources import SparkResource
from dedup_pipeline.orchestration.schedules import build_hourly_schedule, build_reconcile_schedule
from dedup_pipeline.orchestration.sensors import build_landing_sensor
from dedup_pipeline.orchestration.upkeep import build_upkeep

# A sensor that targets asset jobs (the landing sensor: load job and input-check job) is rebuilt
# when the Definitions resolve, and Dagster 1.13 then passes `owners` itself and warns that the
# parameter is beta; the project sets no owners. Silenced by its exact text so `dagster dev` and
# the daemon stay quiet, and nothing else is.
warnings.filterwarnings("ignore", message=r"Parameter `owners` of initializer `SensorDefinition",
                        category=dg.BetaWarning)


def build_dataset_definitions(ds: DatasetConfig) -> dg.Definitions:
    """Everything of one dataset: its assets and input check, its load, rebuild, migrate and
    explain jobs, its landing and recovery sensors, its hourly and reconcile schedules, and (for
    Delta outputs) its table upkeep job and schedule."""
    d = build_dataset_defs(ds)
    rebuild = build_rebuild_job(ds)
    jobs = [d.job, rebuild, build_migrate_job(ds), build_explain_job(ds)]
    schedules = [build_hourly_schedule(ds, d.job), build_reconcile_schedule(ds, d.job.name)]
    if ds.output_format == "delta":
        upkeep, upkeep_schedule = build_upkeep(ds)
        jobs.append(upkeep)
        schedules.append(upkeep_schedule)
    return dg.Definitions(
        assets=[d.raw, d.load],
        asset_checks=[build_input_check(ds)],
        jobs=jobs,
        sensors=[build_recovery_sensor(ds, rebuild), build_landing_sensor(ds, d.job)],
        schedules=schedules,
    )


def build_definitions(cfg: PipelineConfig) -> dg.Definitions:
    """Every dataset's Definitions merged with what they share: the Spark resource, the
    in-process executor and the run-failure summary sensor."""
    shared = dg.Definitions(
        sensors=build_run_end_sensors(list(cfg.datasets)),
        resources={"spark": SparkResource.from_config(cfg.spark)},
        executor=dg.in_process_executor,
    )
    return dg.Definitions.merge(shared, *(build_dataset_definitions(ds) for ds in cfg.datasets))
