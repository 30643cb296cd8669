"""The Spark resource: typed settings, env vars resolved by us, the session started lazily.

It reads SPARK_MASTER_URL / SPARK_REMOTE / DEDUP_SPARK_CONF_* at run time (design.md C3) and builds the
session with `engine.session.get_session`. Why not dagster-pyspark (not a dependency): its resource
is a session builder, the one part we need to differ. `dg.EnvVar` inside its `spark_config` becomes
the conf key `spark.master.env` (the session falls back to local[*]), and it hands every setting to
the builder as given, where a Spark Connect client must leave the start-up ones to the server
(`session_conf`). A Spark Connect session the run opened is released when the run ends (the
server otherwise keeps it until its idle timeout); one the caller already had (an in-process run
sharing it) stays open, and a local session ends with its process. Evidence: docs/notes.md,
"Spark resource".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr
from pyspark.sql import SparkSession

from dedup_pipeline.config import SparkConfig
from dedup_pipeline.engine.session import SparkSettings, connect_session_exists, get_session


class SparkResource(dg.ConfigurableResource):
    """Where loads run: local mode by default, a cluster or Spark Connect by config/env."""

    master: str | None = Field(default=None, description="spark.master, e.g. spark://host:7077")
    remote: str | None = Field(default=None, description="Spark Connect URL, e.g. sc://host:15002")
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark settings")
    _owned: Any = PrivateAttr(default=None)  # a Connect session this run opened: closed at its end

    @classmethod
    def from_config(cls, cfg: SparkConfig) -> SparkResource:
        return cls(master=cfg.master, remote=cfg.remote, conf=dict(cfg.conf))

    def get_session(self, roots: Iterable[str] = ()) -> SparkSession:
        """The run's session; `roots`: the dataset paths it reads and writes (S3 needs S3A)."""
        settings = SparkSettings(self.master, self.remote, dict(self.conf))
        opened = settings.resolved().remote is not None and not connect_session_exists()
        spark = get_session(settings, roots)
        if opened:
            self._owned = spark
        return spark

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """Release the Connect session this run opened when the run ends (success, failure or
        cancel), so the server's sessions do not outlive their runs until its idle timeout. A
        session the caller already had (an in-process run sharing it) is left open; a local
        session is left to its process."""
        spark, self._owned = self._owned, None
        if spark is not None:
            with contextlib.suppress(Exception):  # a server already gone has nothing to release
                spark.stop()

    def remote_url(self) -> str | None:
        """The Spark Connect server runs use (environment first), None without one."""
        return SparkSettings(self.master, self.remote, dict(self.conf)).resolved().remote
