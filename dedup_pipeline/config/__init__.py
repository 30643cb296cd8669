"""Dataset configuration (SPEC C1, C2): fail fast, naming file, dataset and field.

`models` holds the YAML as frozen pydantic models, `loading` reads a file into them, `errors`
turns pydantic's errors into one line. Nothing runs on a bad config.
"""

from dedup_pipeline.config.errors import ConfigError, config_error
from dedup_pipeline.config.loading import load_config, parse_config
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

__all__ = ["BUILTIN_DEMO", "NAME_RE", "ChecksConfig", "ConfigError", "CsvConfig", "DatasetConfig",
           "ExpiryConfig", "IndexConfig", "LandingConfig", "PipelineConfig", "SourceConfig",
           "SparkConfig", "config_error", "load_config", "parse_config"]
