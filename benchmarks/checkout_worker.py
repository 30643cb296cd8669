"""One checkout's hourly load in a process and JVM of its own (benchmarks/before_after.py).

Run as a file, never as a module of a package, so that everything it loads of the project comes
from the checkout named by PYTHONPATH, not from the tree the runner runs in:

    PYTHONPATH=<checkout> python -P benchmarks/checkout_worker.py <spec.json>

`-P` keeps this file's own folder off `sys.path` (its modules would shadow the standard library's
`profile`). Only the standard library is imported at the top; the checkout provides
`dedup_pipeline.config.parse_config`, `dedup_pipeline.engine.session.get_session` and
`dedup_pipeline.engine.load.run_load`, which every version of the package has.

Protocol (JSON lines): once started, the worker writes {"ready": {"dedup_pipeline": <its
__init__.py>, "pid": ...}}; then the runner writes {"hour": "<partition key>", "inputs": [<the
hour's landing files>]} and the worker answers {"wall": s, "cpu": s, "record": {...}} or
{"error": "..."}; end of input ends the worker. Each hour starts as in `benchmarks.probe.settle`:
the hour's files read into the page cache, dirty pages written, the JVM's garbage collected; then
only `run_load` is timed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import IO, Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
# the record's figures the runner compares and reports
FIGURES = ("rows_in", "unique", "duplicates", "expired", "rejected", "conflicts", "files_in",
           "index_rows_read", "index_bytes_read", "index_files_read", "files_written")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / CLK_TCK


def _settle(spark: Any, inputs: list[str]) -> None:
    for path in inputs:
        with open(path.removeprefix("file:"), "rb") as f:
            while f.read(1 << 24):
                pass
    os.sync()
    with contextlib.suppress(Exception):
        spark.sparkContext._jvm.java.lang.System.gc()


def _jvm_pid(spark: Any) -> int | None:
    try:
        return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:  # noqa: BLE001 - no JVM handle: Python's CPU only
        return None


def _dataset(spec: dict[str, Any]) -> Any:
    """The generated config with its one dataset section replaced by the spec's."""
    import yaml

    from dedup_pipeline.config import parse_config

    config = Path(spec["config"])
    raw = yaml.safe_load(config.read_text())
    raw["datasets"] = [spec["dataset"]]
    return parse_config(raw, str(config), config.parent).datasets[0]


def serve(spec: dict[str, Any], rx: IO[str], tx: IO[str]) -> None:
    import dedup_pipeline
    from dedup_pipeline.engine.load import run_load
    from dedup_pipeline.engine.session import SparkSettings, get_session

    spark = get_session(SparkSettings(conf=spec["conf"], app_name=spec.get("name", "bench")))
    spark.sparkContext.setLogLevel("ERROR")
    ds = _dataset(spec)
    pids = [p for p in (os.getpid(), _jvm_pid(spark)) if p is not None]
    tx.write(json.dumps({"ready": {"dedup_pipeline": dedup_pipeline.__file__,
                                   "pid": os.getpid()}}) + "\n")
    tx.flush()
    for line in rx:
        try:
            ask = json.loads(line)
            _settle(spark, ask["inputs"])
            cpu0 = sum(_cpu_seconds(p) for p in pids)
            t0 = time.perf_counter()
            rec = run_load(spark, ds, ask["hour"])
            wall = time.perf_counter() - t0
            cpu = sum(_cpu_seconds(p) for p in pids) - cpu0
            record = {k: getattr(rec, k) for k in FIGURES if hasattr(rec, k)}
            record["seconds"] = dict(rec.seconds)
            answer: dict[str, Any] = {"wall": wall, "cpu": cpu, "record": record}
        except Exception:  # noqa: BLE001 - reported to the runner, which stops the run
            answer = {"error": traceback.format_exc()}
        tx.write(json.dumps(answer, default=str) + "\n")
        tx.flush()
    spark.stop()


def main(argv: list[str]) -> int:
    (spec_path,) = argv
    # answers go to the real stdout; anything else written to fd 1 (the JVM inherits it, py4j,
    # print) goes to the log on stderr instead
    tx = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(json.loads(Path(spec_path).read_text()), sys.stdin, tx)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
