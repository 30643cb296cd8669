"""The code location: `dg dev` (pyproject [tool.dg]) or `dagster dev -w workspace.yaml` loads `defs`
from here.

The config comes from DEDUP_CONFIG, or the built-in demo dataset when unset (SPEC C1). Loading
reads and validates YAML only; Spark starts inside a run.
"""

from dedup_pipeline.config import config_from_env
from dedup_pipeline.orchestration.definitions import build_definitions

defs = build_definitions(config_from_env())
