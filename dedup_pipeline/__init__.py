"""dedup_pipeline: deduplicate hourly at-least-once batches into clean Delta tables on PySpark,
orchestrated by Dagster. The engine (`dedup_pipeline.engine`) has no Dagster import; the Dagster
layer lives in `dedup_pipeline.orchestration`.

`dedup_pipeline.DedupDataset` is the Dagster component (design.md D8), the module `dg` discovers
through the `dagster_dg_cli.registry_modules` entry point; `dedup_pipeline.dataset_assets(defs_yaml)`
gives downstream code a dataset's partitions definition, asset keys and tables. Both are imported
on first use, so importing the engine never imports Dagster.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["DedupDataset", "dataset_assets"]


def __getattr__(name: str) -> Any:
    if name in ("DedupDataset", "dataset_assets"):
        from dedup_pipeline.orchestration import component

        return getattr(component, name)
    raise AttributeError(f"module 'dedup_pipeline' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
