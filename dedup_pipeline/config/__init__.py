"""Dataset configuration (SPEC C1, C2): fail fast, naming file, dataset and field.

`models` holds the YAML as frozen pydantic models, `loading` reads a file (or the built-in demo)
into them, `errors` turns pydantic's errors into one line. Nothing runs on a bad config.
"""

from dedup_pipeline.config.errors import ConfigError, config_error
from dedup_pipeline.config.loading import (
    DEMO_DATASET,
    config_from_env,
    demo_config,
    load_config,
    parse_config,
)
from dedup_pipeline.config.models import (
    BUILTIN_DEMO,
    NAME_RE,
    ChecksConfig,
    CsvConfig,
    DatasetConfig,
    ExpiryConfig,
    IndexConfig,
    LandingConfig,
    PipelineConfig,
    SourceConfig,
    SparkConfig,
)

__all__ = [
    "BUILTIN_DEMO", "DEMO_DATASET", "NAME_RE", "ChecksConfig", "ConfigError", "CsvConfig",
    "DatasetConfig", "ExpiryConfig", "IndexConfig", "LandingConfig", "PipelineConfig",
    "SourceConfig", "SparkConfig", "config_error", "config_from_env", "demo_config", "load_config",
    "parse_config",
]
