"""One system in its own process and JVM, driven hour by hour by the runner.

Why: in one shared JVM every system reports the same peak memory (the heap and native memory the
heaviest peer, recompute, grew to), and a step can pay for the garbage of the step before. Each
worker owns a warm Spark session of its own; the runner sends it one hour at a time and waits, so
the workers and the runner never compute at the same moment (2 cores, no contention) and the
hour-by-hour order of the run is unchanged: the naive and recompute peers at hour H still read the
unique table the pipeline wrote for the hours before H.

`--quick` runs them in the runner's own session instead (`System` directly: the same step code,
without two cold JVMs in the test suite); `test_benchmarks` drives a real worker separately.

Protocol (JSON lines): the runner writes {"hour": "<partition key>"}; the worker answers
{"cost": {...}, "extra": {...}} or {"error": "..."}; end of input ends the worker.

    python -m benchmarks.worker pipeline|streaming|merge_spark|merge_duckdb <spec.json>
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import yaml

from benchmarks.probe import Cost, measured, read_answer
from dedup_pipeline.config import DatasetConfig, parse_config
from dedup_pipeline.hours import parse_hour

KINDS = ("pipeline", "streaming", "merge_spark", "merge_duckdb")
# each worker's session: (a)'s and (d)'s in the full benchmark, (d)'s in `benchmarks.warm`
WORKER_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "4g"}


def dataset_from_spec(spec: dict[str, Any]) -> DatasetConfig:
    """The spec names the generated config file and the dataset's (already rewritten) section."""
    config = Path(spec["config"])
    raw = yaml.safe_load(config.read_text())
    raw["datasets"] = [spec["dataset"]]
    return parse_config(raw, str(config), config.parent).datasets[0]


class System:
    """One system's hourly step in the process that runs it: (a) `run_load`, or (d) feeding the
    hour to the streaming query and running it once. Measured with `probe.measured`."""

    def __init__(self, kind: str, spark: Any, ds: DatasetConfig, root: str = ""):
        from benchmarks import merge, systems

        assert kind in KINDS, kind
        self.kind, self.spark, self.ds = kind, spark, ds
        self.stream = systems.StreamingPeer(spark, ds, Path(root)) if kind == "streaming" else None
        self.merge: merge.MergeSpark | merge.MergeDuckdb | None = None
        if kind == "merge_spark":
            self.merge = merge.MergeSpark(spark, ds, root)
        elif kind == "merge_duckdb":
            self.merge = merge.MergeDuckdb(ds, root)

    def step(self, key: str) -> tuple[Cost, dict[str, Any]]:
        from dedup_pipeline.engine.core.parse import list_input_files
        from dedup_pipeline.engine.load import run_load
        from dedup_pipeline.objectstore import is_s3

        hour = parse_hour(key)
        # local landing files are read into the page cache first; S3 has no such state
        inputs = [f.path for f in list_input_files(self.ds, hour) if not is_s3(f.path)]
        if self.merge is not None:
            files = [f.path for f in list_input_files(self.ds, hour)]
            with measured(self.spark, inputs) as cost:
                extra = self.merge.step(hour, files)
            return cost, extra
        if self.stream is not None:
            self.stream.feed(hour)
            with measured(self.spark, inputs) as cost:
                self.stream.run()
            return cost, {}
        with measured(self.spark, inputs) as cost:
            r = run_load(self.spark, self.ds, key)
        return cost, {"result": r.to_json()}

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


def serve(kind: str, spec: dict[str, Any], rx: IO[str], tx: IO[str]) -> None:
    from dedup_pipeline.engine.session import SparkSettings, get_session

    ds = dataset_from_spec(spec)
    spark = None
    if kind != "merge_duckdb":  # (i) has no Spark
        # an s3:// landing zone or output brings S3A's jars and settings (from the AWS_* variables)
        spark = get_session(SparkSettings(conf=spec["conf"], app_name=f"bench-{kind}"),
                            roots=(ds.source.path, ds.output))
        spark.sparkContext.setLogLevel("ERROR")
    system = System(kind, spark, ds, spec["root"])
    for line in rx:
        try:
            cost, extra = system.step(json.loads(line)["hour"])
            answer: dict[str, Any] = {"cost": asdict(cost), "extra": extra}
        except Exception:  # noqa: BLE001 - reported to the runner, which stops the run
            answer = {"error": traceback.format_exc()}
        tx.write(json.dumps(answer, default=str) + "\n")
        tx.flush()
    system.close()
    if spark is not None:
        spark.stop()


class Worker:
    """The runner's handle on one worker process."""

    def __init__(self, kind: str, spec: dict[str, Any], log: Path, python: str = sys.executable):
        """`python`: the interpreter the worker runs in ((h) runs in a venv of its own)."""
        assert kind in KINDS, kind
        self.kind = kind
        spec_path = log.with_suffix(".json")
        spec_path.write_text(json.dumps(spec))
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [python, "-m", "benchmarks.worker", kind, str(spec_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
            cwd=Path(__file__).resolve().parent.parent)
        self.log = log

    def step(self, hour_key: str) -> tuple[Cost, dict[str, Any]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"hour": hour_key}) + "\n")
        self.proc.stdin.flush()
        answer = read_answer(self.proc, self.kind, f"at {hour_key}", self.log)
        return Cost(**answer["cost"]), answer["extra"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def main(argv: list[str]) -> int:
    kind, spec_path = argv
    # answers go to the real stdout; anything else written to fd 1 (the JVM the session starts
    # inherits it, py4j, print) goes to the log on stderr instead
    tx = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(kind, json.loads(Path(spec_path).read_text()), sys.stdin, tx)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
