"""The code location: `dg dev` (pyproject [tool.dg]) or `dagster dev -w workspace.yaml` loads `defs`
from here, with no other step (design.md D7).

The config comes from DEDUP_CONFIG, or the built-in demo dataset when unset (design.md C1). Loading
reads and validates YAML only; Spark starts inside a run.
"""

import os

from dedup_pipeline.config import load_config
from dedup_pipeline.orchestration.definitions import build_definitions
from dedup_pipeline.sample.demo import demo_config

defs = build_definitions(load_config(os.environ["DEDUP_CONFIG"]) if os.environ.get("DEDUP_CONFIG")
                         else demo_config())
