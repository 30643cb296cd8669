"""The Spark resource: typed settings, env vars resolved by us, the session started lazily.

Why not dagster-pyspark's PySparkResource: `dg.EnvVar` inside its `spark_config` silently becomes a
bogus conf key (the session falls back to local[*]), and it never stops its session. Our resource
reads SPARK_MASTER_URL / SPARK_REMOTE / DEDUP_SPARK_CONF_* at run time (SPEC C3).
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field
from pyspark.sql import SparkSession

from dedup_pipeline.config import SparkConfig
from dedup_pipeline.engine.session import SparkSettings, get_session


class SparkResource(dg.ConfigurableResource):
    """Where loads run: local mode by default, a cluster or Spark Connect by config/env."""

    master: str | None = Field(default=None, description="spark.master, e.g. spark://host:7077")
    remote: str | None = Field(default=None, description="Spark Connect URL, e.g. sc://host:15002")
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark settings")

    @classmethod
    def from_config(cls, cfg: SparkConfig) -> SparkResource:
        return cls(master=cfg.master, remote=cfg.remote, conf=dict(cfg.conf))

    def get_session(self) -> SparkSession:
        return get_session(SparkSettings(self.master, self.remote, dict(self.conf)))

    def remote_url(self) -> str | None:
        """The Spark Connect server runs use (environment first), None without one."""
        return SparkSettings(self.master, self.remote, dict(self.conf)).resolved().remote
