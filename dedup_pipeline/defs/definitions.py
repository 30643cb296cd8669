"""Assemble the Definitions for a pipeline config: every dataset's assets and jobs, one Spark
resource, the in-process executor (one Spark driver per run, not one per step)."""

from __future__ import annotations

import dagster as dg

from dedup_pipeline.config import PipelineConfig
from dedup_pipeline.defs.assets import build_dataset_defs
from dedup_pipeline.defs.resources import SparkResource


def build_definitions(cfg: PipelineConfig) -> dg.Definitions:
    assets: list[dg.AssetsDefinition | dg.AssetSpec] = []
    jobs = []
    for ds in cfg.datasets:
        d = build_dataset_defs(ds)
        assets += [d.raw, d.load]
        jobs.append(d.job)
    return dg.Definitions(
        assets=assets,
        jobs=jobs,
        resources={"spark": SparkResource.from_config(cfg.spark)},
        executor=dg.in_process_executor,
    )


def load_job_name(dataset: str) -> str:
    return f"{dataset}_hourly_load"
