"""The floor of a fresh run process (T8d): what Dagster and the Spark Connect client cost a run
before any load work, measured with our asset's shape and our instance.

    DAGSTER_HOME=... [SPARK_REMOTE=sc://...] python -m benchmarks.run_floor 2026-11-01-05:00

One process does what a `dedup-pipeline run` process does around the engine, and nothing of the
engine: the same interpreter settings (`console`'s GC thresholds and quick exit), `import dagster`,
the Connect client's import and a session with one trivial query (only with SPARK_REMOTE), the
instance of DAGSTER_HOME, and one Dagster run of a multi-asset shaped like a dataset's load (the
same outputs and asset checks, so the same events are written), whose body only yields results.
It does not import `dedup_pipeline` beyond `console` (stdlib only): the floor is Dagster's and
Spark Connect's, not ours. Prints one JSON line: seconds since the interpreter began its
imports at each step, and the run's event count. `benchmarks.warm` runs it beside the real run
process, hour by hour; `test_benchmarks` checks that its shape is the product's.
"""

import gc
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

from dedup_pipeline.console import GC_THRESHOLDS, leave

# The load's assets and checks (`defs.assets`, `defs.checks.CHECKS`): check name -> asset name.
OUTPUTS = ("unique", "duplicates", "expired", "rejected", "index")
CHECKS = {"conservation": "unique", "unique_keys": "unique", "index_agrees": "index",
          "index_size": "index", "duplicate_rate": "duplicates", "conflict_rate": "duplicates",
          "rejected_rate": "rejected"}
BLOCKING = {"conservation", "unique_keys", "index_agrees"}
DATASET = "floor"


def main(hour: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    marks: dict[str, float] = {}

    def mark(step: str) -> None:
        marks[step] = round(time.perf_counter() - t0, 3)

    import dagster as dg
    mark("import_dagster")
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)  # as the CLI does
    remote = os.environ.get("SPARK_REMOTE")
    if remote:
        from pyspark.sql.connect.session import SparkSession

        from dedup_pipeline.engine.connect_auth import client_url
        mark("import_connect")
    # (no `from __future__ import annotations` here: Dagster resolves the body's annotations,
    # and `dg` is local to this function)
    pdef = dg.HourlyPartitionsDefinition(start_date=hour)  # `hour` is always a partition

    @dg.multi_asset(
        name=f"{DATASET}_load",
        specs=[dg.AssetSpec([DATASET, o], partitions_def=pdef) for o in OUTPUTS],
        check_specs=[dg.AssetCheckSpec(c, asset=[DATASET, a], blocking=c in BLOCKING,
                                       partitions_def=pdef) for c, a in CHECKS.items()],
        partitions_def=pdef)
    def load(context: dg.AssetExecutionContext) -> Iterator[Any]:
        if remote:
            spark = SparkSession.builder.remote(client_url(remote)).getOrCreate()
            spark.range(1).count()
            mark("session_and_query")
        for o in OUTPUTS:
            yield dg.MaterializeResult(asset_key=[DATASET, o], metadata={"rows": 0})
        for c, a in CHECKS.items():
            yield dg.AssetCheckResult(asset_key=[DATASET, a], check_name=c, passed=True)

    with dg.DagsterInstance.get() as instance:
        mark("instance")
        # as `defs.runner.run_range` runs one hour: the job in process, Dagster's console quiet
        job = dg.Definitions(assets=[load]).resolve_implicit_global_asset_job_def()
        result = job.execute_in_process(instance=instance, partition_key=hour, run_config={
            "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}})
        mark("run")
        events = len(instance.all_logs(result.run_id))
    return {"marks": marks, "events": events}


if __name__ == "__main__":
    gc.set_threshold(*GC_THRESHOLDS)
    report = main(sys.argv[1])
    print(json.dumps(report), flush=True)
    leave(0)
