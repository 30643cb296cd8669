"""The Spark resource: typed settings, env vars resolved by us, the session started lazily.

It reads SPARK_MASTER_URL / SPARK_REMOTE / DEDUP_SPARK_CONF_* at run time (SPEC C3) and builds the
session with `engine.session.get_session`. Why not dagster-pyspark (not a dependency): its resource
is a session builder, the one part we need to differ. `dg.EnvVar` inside its `spark_config` becomes
the conf key `spark.master.env` (the session falls back to local[*]), and it hands every setting to
the builder as given, where a Spark Connect client must leave the start-up ones to the server
(`session_conf`). Neither resource stops the session at teardown: an in-process run (CLI `run`,
tests) shares its caller's session, which a stop would kill; a run worker's local session ends with
its process. Evidence: docs/notes.md, "Spark resource".
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
