"""The one builder of Dagster definitions (design.md D8): `build_dataset_definitions` makes
everything of one dataset, self-contained so that datasets compose in any code location. Both ways
of loading the product call it: the `DedupDataset` component (one per `defs.yaml`,
`orchestration/component.py`) and the standalone code location (`build_definitions`: every dataset
of a `DEDUP_CONFIG` file, plus the in-process executor for the whole location)."""

from __future__ import annotations

import functools

import dagster as dg

from dedup_pipeline.config import DatasetConfig, PipelineConfig, SparkConfig
from dedup_pipeline.orchestration import names
from dedup_pipeline.orchestration.assets import build_dataset_defs
from dedup_pipeline.orchestration.explain import build_explain_job
from dedup_pipeline.orchestration.landing_checks import build_input_check
from dedup_pipeline.orchestration.recovery import (
    build_rebuild_job,
    build_recovery_sensor,
    build_run_end_sensor,
)
from dedup_pipeline.orchestration.resources import SparkResource
from dedup_pipeline.orchestration.schedules import build_hourly_schedule, build_reconcile_schedule
from dedup_pipeline.orchestration.sensors import build_landing_sensor
from dedup_pipeline.orchestration.upkeep import build_upkeep


def build_dataset_definitions(ds: DatasetConfig, spark: SparkResource, running: bool = True,
                              group: str | None = None) -> dg.Definitions:
    """Everything of one dataset: its assets and input check, its load, index rebuild (also
    migrate) and explain jobs, its landing, recovery and run-end sensors, its hourly and reconcile
    schedules, its table upkeep job (and for Delta outputs its schedule), and the Spark resource
    its steps use, under the key `dedup_spark` (`names.SPARK_RESOURCE`: a team's own `spark` resource beside
    it is left alone). Every name carries the dataset's name, so datasets never collide; `spark`
    must be the same object for every dataset of a code location (`spark_resource`).
    `running`: whether its sensors and upkeep schedule start running (a component's `sensors:`);
    `group`: its asset group (a component's `group_name:`, default the dataset's name)."""
    d = build_dataset_defs(ds, group)
    rebuild = build_rebuild_job(ds)
    upkeep, upkeep_schedule = build_upkeep(ds, running)
    jobs = [d.job, rebuild, build_explain_job(ds), upkeep]
    schedules = [build_hourly_schedule(ds, d.job), build_reconcile_schedule(ds, d.job.name)]
    if ds.output_format == "delta":
        schedules.append(upkeep_schedule)
    return dg.Definitions(
        assets=[d.raw, d.load],
        asset_checks=[build_input_check(ds)],
        jobs=jobs,
        sensors=[build_recovery_sensor(ds, rebuild, running),
                 build_landing_sensor(ds, d.job, running=running),
                 build_run_end_sensor(ds, running)],
        schedules=schedules,
        resources={names.SPARK_RESOURCE: spark},
    )


@functools.cache
def _spark_resource(settings: str) -> SparkResource:
    return SparkResource.from_config(SparkConfig.model_validate_json(settings))


def spark_resource(cfg: SparkConfig) -> SparkResource:
    """The `spark` resource of these settings: one object per distinct settings in the process,
    because `Definitions.merge` accepts a resource key twice only as the same object (two
    components without a `spark:` attribute share the environment's)."""
    return _spark_resource(cfg.model_dump_json())


def build_definitions(cfg: PipelineConfig) -> dg.Definitions:
    """The standalone code location: every dataset of the file, and the in-process executor (one
    Spark driver per run, not one per step)."""
    spark = spark_resource(cfg.spark)
    return dg.Definitions.merge(dg.Definitions(executor=dg.in_process_executor),
                                *(build_dataset_definitions(ds, spark) for ds in cfg.datasets))
