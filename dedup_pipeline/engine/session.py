"""Build the SparkSession from config and environment (SPEC C3), without Dagster.

Precedence: environment (SPARK_REMOTE, SPARK_MASTER_URL, DEDUP_SPARK_CONF_<KEY>) over the config
file's `spark:` section over defaults. DEDUP_SPARK_CONF_spark__sql__shuffle__partitions=8 sets
`spark.sql.shuffle.partitions` (double underscore -> dot).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
# Settings every load relies on; a user may override any of them.
BASE_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "16",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}
CONF_PREFIX = "DEDUP_SPARK_CONF_"


@dataclass(frozen=True)
class SparkSettings:
    master: str | None = None
    remote: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    app_name: str = "dedup_pipeline"

    def resolved(self) -> SparkSettings:
        """Apply the environment on top of these settings."""
        conf = {**BASE_CONF, **self.conf}
        for k, v in os.environ.items():
            if k.startswith(CONF_PREFIX):
                conf[k[len(CONF_PREFIX):].replace("__", ".")] = v
        remote = os.environ.get("SPARK_REMOTE") or self.remote
        master = os.environ.get("SPARK_MASTER_URL") or self.master
        if remote:
            master = None
        elif not master:
            master = DEFAULT_MASTER
        return SparkSettings(master, remote, conf, self.app_name)


def get_session(settings: SparkSettings) -> SparkSession:
    """Create (or reuse) the process's session. Never called while definitions load."""
    s = settings.resolved()
    builder = SparkSession.builder.appName(s.app_name)
    builder = builder.remote(s.remote) if s.remote else builder.master(s.master or DEFAULT_MASTER)
    for k, v in s.conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    for k in ("spark.sql.session.timeZone", "spark.sql.parquet.outputTimestampType"):
        spark.conf.set(k, s.conf[k])  # runtime settings also apply to a reused session
    return spark
