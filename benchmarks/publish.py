"""The cost of publishing an hour to the four Delta tables, against the load it is part of.

    .venv/bin/python -m benchmarks.publish [--hours 24,720] [--rows 100000] [--work DIR]

Side by side in one process:
- the load: `dedup-pipeline generate` writes two hours of `--rows` rows; both are loaded in one
  warm Spark session (delta mode) and the second hour's load time is the denominator;
- the publish: for each history length N, four tables with N committed hours (one commit per
  table and hour, as loads make them, checkpoints every 100 commits as delta-rs writes them),
  then three more hours are published and the median per-hour time of `lake.publish_load`
  (four commits, each file's footer checked) is taken; also the load-start repair check
  (`repair_pending` with nothing pending) and the upkeep (`vacuum`: vacuum, checkpoint, log
  clean-up) at that length.
The target (issue: publish at 720 hours <= 3% of a 1e5-row load) is printed with the ratio.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dedup_pipeline.config import DatasetConfig, parse_config
from dedup_pipeline.engine import lake
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.commits import CommitRecord, OutputFileEntry
from dedup_pipeline.engine.core.outputs import OUTPUTS, partition
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import HOUR, format_hour, parse_hour, to_tag
from dedup_pipeline_tests.conftest import NOTHING

START = "2026-01-01-00:00"


def _dataset(root: Path) -> DatasetConfig:
    raw = {"datasets": [{
        "name": "clicks", "start": START, "key": ["event_id"], "output": str(root / "out"),
        "source": {"path": str(root / "landing"), "format": "jsonl",
                   "schema": {"event_id": "string", "user_id": "string",
                              "event_time": "timestamp", "url": "string"}},
        "fingerprint": ["user_id", "url"], "order_by": "event_time",
        "expiry": {"column": "event_time", "period": "24h"}}]}
    return parse_config(raw, "benchmark", root).datasets[0]


def output_files(st: Storage, ds: DatasetConfig, i: int, tag: str) -> dict[str, tuple[Any, ...]]:
    """Hour `tag`'s files, one small file per output of the output's schema (numbered `i`), as
    record entries."""
    files: dict[str, tuple[Any, ...]] = {}
    for name in OUTPUTS:
        schema = lake.arrow_schema(ds, name)
        table = pa.table({f.name: pa.nulls(10, f.type) for f in schema if f.name != lake.PART})
        d = Path(st.path(*partition(name, tag)))
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"part-00000-{i:06d}-c000.snappy.parquet"
        pq.write_table(table, p)
        files[name] = (OutputFileEntry(name=p.name, size=p.stat().st_size),)
    return files


def _hour(st: Storage, ds: DatasetConfig, i: int) -> CommitRecord:
    """Hour i's files (one small file per output, of the output's schema) and its record."""
    tag = to_tag(parse_hour(START) + i * HOUR)
    files = output_files(st, ds, i, tag)
    rec = CommitRecord(**{**NOTHING, "output_files": files},
                       dataset=ds.name, partition_key=format_hour(parse_hour(tag)), load_hour=tag,
                       rows_in=40, unique=10, duplicates=10, expired=10, rejected=10,
                       publish_token=lake.new_token())
    commits.write_commit(st, rec)
    return rec


def measure_publish(n: int, work: Path) -> dict[str, float]:
    root = work / f"publish-{n}"
    shutil.rmtree(root, ignore_errors=True)
    ds = _dataset(root)
    st = Storage(ds.output)
    t0 = time.perf_counter()
    for i in range(n):
        lake.publish_load(st, ds, _hour(st, ds, i))
    build = time.perf_counter() - t0
    times, repairs = [], []
    for i in range(n, n + 3):
        rec = _hour(st, ds, i)
        t = time.perf_counter()
        lake.publish_load(st, ds, rec)
        times.append(time.perf_counter() - t)
        t = time.perf_counter()
        lake.repair_pending(st, ds)
        repairs.append(time.perf_counter() - t)
    t = time.perf_counter()
    lake.vacuum(st, lake.MIN_RETENTION_HOURS)
    upkeep = time.perf_counter() - t
    return {"hours": n, "publish_s": statistics.median(times), "repair_check_s":
            statistics.median(repairs), "upkeep_s": upkeep, "build_s": build}


def measure_load(rows: int, work: Path) -> tuple[float, float]:
    """The second of two generated `rows`-row hours, loaded in one warm session (delta mode)."""
    from dedup_pipeline.config import load_config
    from dedup_pipeline.engine.load import load_hours
    from dedup_pipeline.engine.session import SparkSettings, get_session
    from dedup_pipeline.sample.generate import generate_landing

    root = work / "load"
    shutil.rmtree(root, ignore_errors=True)
    stats = generate_landing(str(root), hours=2, rows_per_hour=rows, seed=7, start=None,
                             fmt="jsonl", progress=lambda _m: None)
    cfg = load_config(stats.config)
    ds = cfg.datasets[0]
    spark = get_session(SparkSettings(cfg.spark.master, cfg.spark.remote, cfg.spark.conf))
    spark.sparkContext.setLogLevel("ERROR")
    keys = sorted({f"{p.parent.parent.name[5:]}-{p.parent.name[5:]}:00"
                   for p in Path(ds.source.path).rglob("*.jsonl")})
    _first, second = load_hours(spark, ds, keys[:2])
    assert second.seconds.get("publish") is not None  # delta mode published it
    return second.seconds["total"], second.seconds["publish"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", default="24,720")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--work", default=None)
    a = ap.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="publish-bench-"))
    load_s, in_load = measure_load(a.rows, work)
    print(f"load of a {a.rows:,}-row hour (warm session, delta mode, publish included): "
          f"{load_s:.2f} s, of it the publish (second hour of the table) {in_load * 1000:.0f} ms")
    print(f"{'hours':>6} {'publish ms':>11} {'% of load':>10} {'repair check ms':>16} "
          f"{'upkeep ms':>10} {'build s':>8}")
    for n in (int(x) for x in a.hours.split(",")):
        r = measure_publish(n, work)
        print(f"{n:>6} {r['publish_s'] * 1000:>11.1f} {100 * r['publish_s'] / load_s:>9.2f}% "
              f"{r['repair_check_s'] * 1000:>16.1f} {r['upkeep_s'] * 1000:>10.1f} "
              f"{r['build_s']:>8.1f}")
    print("target: publish at 720 hours <= 3% of the load")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
