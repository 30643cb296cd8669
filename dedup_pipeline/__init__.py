"""dedup_pipeline: deduplicate hourly at-least-once batches into clean Delta tables on PySpark,
orchestrated by Dagster. The engine (`dedup_pipeline.engine`) has no Dagster import; the Dagster
layer lives in `dedup_pipeline.orchestration`.

`dedup_pipeline.DedupDataset` is the Dagster component (design.md D8), the module `dg` discovers
through the `dagster_dg_cli.registry_modules` entry point. It is imported on first use, so
importing the engine never imports Dagster.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["DedupDataset"]


def __getattr__(name: str) -> Any:
    if name == "DedupDataset":
        from dedup_pipeline.orchestration.component import DedupDataset

        return DedupDataset
    raise AttributeError(f"module 'dedup_pipeline' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "DedupDataset"])
