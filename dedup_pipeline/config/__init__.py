"""Dataset configuration (design.md C1, C2): `models` holds the YAML, `loading` reads a file into them,
`errors` says what is wrong in one line naming file, dataset and field. Nothing runs on a bad config.
"""

from dedup_pipeline.config.errors import ConfigError
from dedup_pipeline.config.loading import load_config, parse_config
from dedup_pipeline.config.models import BUILTIN_DEMO, NAME_RE, DatasetConfig, PipelineConfig, SparkConfig

__all__ = ["BUILTIN_DEMO", "NAME_RE", "ConfigError", "DatasetConfig", "PipelineConfig", "SparkConfig",
           "load_config", "parse_config"]
