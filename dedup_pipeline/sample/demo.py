"""The demo dataset (design.md C1): the config `dedup-pipeline generate` and `demo` write beside their
data, and the one the Dagster definitions show when no config is given.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dedup_pipeline.config import BUILTIN_DEMO, PipelineConfig, load_config, parse_config
from dedup_pipeline.hours import PARTITION_FMT

SCHEMA = {"event_id": "string", "user_id": "string", "event_time": "timestamp", "url": "string",
          "amount": "double"}


def demo_dataset(start: str, name: str = "clicks", fmt: str = "jsonl") -> dict[str, Any]:
    """The demo's dataset as its YAML mapping; paths are relative to the config file."""
    return {
        "name": name,
        "start": start,
        "source": {"path": f"landing/{name}", "format": fmt, "schema": dict(SCHEMA)},
        "key": ["event_id"],
        "fingerprint": ["user_id", "url"],
        "order_by": "event_time",
        "expiry": {"column": "event_time", "period": "24h", "basis": "event"},
        "output": f"warehouse/{name}",
    }


# where `dedup-pipeline demo` writes its dataset: a dg project's package, the component's defs.yaml
DEMO_PROJECT = "dedup_demo"
DEMO_DEFS = Path(DEMO_PROJECT, "defs", "clicks", "defs.yaml")


def demo_config(root: str | os.PathLike[str] | None = None) -> PipelineConfig:
    """The demo's config: the component's defs.yaml in the dg project `root` (DEDUP_DEMO_DIR, else
    ./demo) once `dedup-pipeline demo` has written it; until then an empty demo dataset whose 24
    hours end at the last complete hour, so `dagster dev` always has something to load."""
    base = Path(root or os.environ.get("DEDUP_DEMO_DIR", "demo")).resolve()
    written = base / DEMO_DEFS
    if written.exists():
        return load_config(written)
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = (now - timedelta(hours=24)).strftime(PARTITION_FMT)
    return parse_config({"datasets": [demo_dataset(start)]}, BUILTIN_DEMO, base)
