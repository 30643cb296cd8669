"""Bookkeeping against history: is a load's and a recovery-sensor tick's
driver-side work the same at a year of committed hours as at a day?

Synthesizes a dataset with N committed hours (commit records in the format `CommitRecord` writes,
and small index files of the entry schema for the live window only: older slices were deleted
by retention, as `_retention.json` says), at N = 24 and N = 8,760, then measures side by side:

- (a) a load's bookkeeping: what `run_load` does of history on the driver before and around the
  Spark work (the record listing and order check, the health check, the summary save, the previous
  record, retention state, the live-file selection, hashing the files the probe reads), and
  optionally (`--load`) one real load of a tiny hour N;
- (b) one tick of the recovery sensor (`{ds}_index_recovery_sensor`);
- for comparison, a check that reads every record (`check_index(full=True)`, what every load and
  tick did before the summary).

Driver wall time (median of `--repeat`) and the file-system requests made through `Storage`
(`benchmarks/fs_requests.py`), and the ratios N=8,760 / N=24. Run: ``python -m benchmarks.bookkeeping``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.fs_requests import count_requests
from dedup_pipeline.config import DatasetConfig, parse_config
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.commit_log import CommitLog
from dedup_pipeline.engine.core.commits import CommitRecord, IndexFileEntry
from dedup_pipeline.engine.core.index import layout
from dedup_pipeline.engine.core.index.health import check_index, content_damage
from dedup_pipeline.engine.core.index.layout import IndexFile
from dedup_pipeline.engine.core.index.live import EarlierLoads, check_retention, live_files
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.hours import HOUR, format_hour, parse_hour, to_tag
from dedup_pipeline_tests.conftest import NOTHING

START = "2025-01-01-00:00"
LIVE = 24  # hours whose index files are live (the expiry period; retention deleted the rest)
HOUR_US = 3_600_000_000  # one hour in the expiry value's units (timestamp: microseconds)


def dataset(root: Path) -> DatasetConfig:
    """A clicks-like dataset with 24 h expiry, one index slice per hour, no compaction."""
    raw = {"name": "clicks", "start": START,
           "source": {"path": "landing", "format": "jsonl",
                      "schema": {"event_id": "string", "event_time": "timestamp"}},
           "key": ["event_id"], "output": "warehouse",
           "expiry": {"column": "event_time", "period": "24h"},
           "index": {"slice_span": "1h", "retention_lag_hours": LIVE, "compact_after": 0}}
    return parse_config({"datasets": [raw]}, "bookkeeping", root).datasets[0]


def _index_file_bytes(tag: str, first_v: int) -> bytes:
    t = pa.table({"_h1": pa.array(range(1, 11), pa.int64()),
                  "_h2": pa.array(range(11, 21), pa.int64()),
                  "_load_hour": pa.array([tag] * 10, pa.string()),
                  "_v": pa.array([first_v + i for i in range(10)], pa.int64())})
    buf = io.BytesIO()
    pq.write_table(t, buf)
    return buf.getvalue()


def index_entry(st: Storage, tag: str, v0: int, live: bool) -> IndexFileEntry:
    """Hour `tag`'s one index file (10 entries from expiry value `v0`), written in its slice when
    `live` (retention deleted the others), and its record entry."""
    n_slice = v0 // HOUR_US
    data = _index_file_bytes(tag, v0)
    entry = IndexFileEntry(slice=n_slice, name="part-00000.snappy.parquet", size=len(data),
                           rows=10, sha256=hashlib.sha256(data).hexdigest())
    if live:
        d = Path(st.path(layout.INDEX, layout.load_rel(n_slice, tag)))
        d.mkdir(parents=True, exist_ok=True)
        (d / entry.name).write_bytes(data)
    return entry


def hour_record(st: Storage, ds: DatasetConfig, i: int, first_live: int,
                **fields: Any) -> CommitRecord:
    """Hour i's record (and its index file, written when i >= first_live), the latest point at
    the hour's end (X_{i+1} = the start of hour i+1-LIVE); `fields` add counts, files, token."""
    hour = parse_hour(START) + i * HOUR
    tag = to_tag(hour)
    v0 = int(hour.timestamp()) * 1_000_000
    n_slice = v0 // HOUR_US
    entry = index_entry(st, tag, v0, live=i >= first_live)
    latest = v0 + HOUR_US
    return CommitRecord(**{
        **NOTHING, "latest_point": float(latest), "expiry_point": float(latest - LIVE * HOUR_US),
        "index_rows_written": 10, "index_slices_written": (n_slice,),
        "committed_at": "2026-01-01T00:00:00Z", "index_files": (entry,), **fields},
        dataset=ds.name, partition_key=format_hour(hour), load_hour=tag)


def synthesize(root: Path, n: int) -> DatasetConfig:
    """N committed hours from START: records written directly (the writer's JSON), index files
    for the last LIVE hours only, the retention state, and the summary loads maintain."""
    ds = dataset(root)
    st = Storage(ds.output)
    os.makedirs(st.path(commits.COMMITS), exist_ok=True)
    start = parse_hour(START)
    first_live = max(0, n - LIVE)
    for i in range(n):
        rec = hour_record(st, ds, i, first_live, rows_in=10, unique=10, duplicates=0, expired=0,
                          rejected=0)
        tag = rec.load_hour
        with open(commits.commit_path(st, tag), "w") as f:
            json.dump(rec.to_json(), f)
    if first_live:
        v_live = int((start + first_live * HOUR).timestamp()) * 1_000_000
        st.write_json_atomic(st.path(layout.INDEX, layout.RETENTION_STATE), {"kept_from": v_live})
    # what the loads before would have left: the summary, valid at the records' directory mtime
    log = CommitLog(st)
    first = check_index(st, ds, full=True, log=log)
    assert first.state is not None
    first.state.commits_mtime = st.stamp_dir(st.path(commits.COMMITS))
    log.follow(first.state)
    log.save_summary()
    return ds


def load_bookkeeping(ds: DatasetConfig, n: int) -> list[IndexFile]:
    """The driver-side bookkeeping of loading hour N (`load.prepare`/`classify_batch` without
    their Spark jobs, and with no earlier attempt to forget): returns the files the probe reads."""
    st = Storage(ds.output)
    hour = parse_hour(START) + n * HOUR
    tag = to_tag(hour)
    log = CommitLog(st)
    health = check_index(st, ds, log=log)
    assert health.state is not None
    commits.check_order(ds, hour, health.state.committed)
    if not health.ok:
        raise RuntimeError(f"synthesized index unhealthy: {health.summary()}")
    log.follow(health.state)
    log.forget(tag)  # nothing there: the requests a load makes anyway
    log.save_summary(drop={tag})
    prev = log.read(to_tag(hour - HOUR))
    assert prev is not None and prev.latest_point is not None
    x = prev.latest_point - LIVE * HOUR_US
    check_retention(st, ds, x)
    live = live_files(ds, health.files, EarlierLoads(health.state.committed, tag), x)
    if content_damage(st, live):
        raise RuntimeError("synthesized index files do not hash to their records")
    return live


def sensor_tick(ds: DatasetConfig) -> Any:
    """One evaluation of the dataset's recovery sensor, as the daemon runs it."""
    import dagster as dg

    from dedup_pipeline.orchestration.recovery import build_rebuild_job, build_recovery_sensor

    return build_recovery_sensor(ds, build_rebuild_job(ds))(dg.build_sensor_context())


def measure(fn: Callable[[], Any], repeat: int) -> tuple[float, Counter[str], Any]:
    """Median wall seconds of `repeat` calls (after one warm-up) and the last call's requests."""
    out = fn()
    times = []
    counted: Counter[str] = Counter()
    for _ in range(repeat):
        with count_requests() as reqs:
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        counted = reqs
    return statistics.median(times), counted, out


def real_load(spark: Any, ds: DatasetConfig, n: int) -> tuple[float, Counter[str]]:
    """One real load of a 10-row hour N: driver wall time and its requests through Storage."""
    from dedup_pipeline.engine.load import run_load

    hour = parse_hour(START) + n * HOUR
    d = Path(ds.source.path) / f"date={hour:%Y-%m-%d}" / f"hour={hour:%H}"
    d.mkdir(parents=True, exist_ok=True)
    ts = hour.strftime("%Y-%m-%dT%H:10:00Z")
    (d / "part-0.jsonl").write_text("".join(
        json.dumps({"event_id": f"new{i}", "event_time": ts}) + "\n" for i in range(10)))
    with count_requests() as reqs:
        t0 = time.perf_counter()
        rec = run_load(spark, ds, format_hour(hour))
        secs = time.perf_counter() - t0
    assert rec.unique == 10, rec
    return secs, reqs


def run(sizes: list[int], repeat: int = 5, spark: Any = None,
        workdir: Path | None = None) -> dict[int, dict[str, Any]]:
    """Synthesize each size and measure; returns {N: {name: (seconds, requests)}}."""
    results: dict[int, dict[str, Any]] = {}
    base = Path(workdir or tempfile.mkdtemp(prefix="bookkeeping-"))
    if spark is not None:  # a warm JVM for both sizes: the first load pays the JIT
        real_load(spark, synthesize(base / "warm-up", 2), 2)
    for n in sizes:
        root = base / f"n{n}"
        t0 = time.perf_counter()
        ds = synthesize(root, n)
        synth = time.perf_counter() - t0
        r: dict[str, Any] = {"synthesize_s": synth}
        secs, reqs, live = measure(lambda ds=ds, n=n: load_bookkeeping(ds, n), repeat)
        r["load"] = (secs, reqs)
        r["live_files"] = len(live)
        secs, reqs, tick = measure(lambda ds=ds: sensor_tick(ds), repeat)
        r["sensor"] = (secs, reqs)
        r["sensor_says"] = getattr(tick, "skip_message", None) or repr(tick)
        st = Storage(ds.output)
        secs, reqs, _ = measure(lambda st=st, ds=ds: check_index(st, ds, full=True), max(1, repeat // 2))
        r["full_check"] = (secs, reqs)
        if spark is not None:
            r["real_load"] = real_load(spark, ds, n)
        results[n] = r
    return results


def report(results: dict[int, dict[str, Any]]) -> str:
    """A table per measurement, and the ratio of the largest history to the smallest."""
    sizes = sorted(results)
    lo, hi = sizes[0], sizes[-1]
    names = [k for k in ("load", "sensor", "real_load", "full_check") if k in results[lo]]
    label = {"load": "(a) load bookkeeping", "sensor": "(b) recovery-sensor tick",
             "real_load": "(a') real load of a 10-row hour", "full_check":
             "every record read (check_index full=True, as before)"}
    lines = [f"history sizes: {', '.join(f'{n} h' for n in sizes)}; live index files: "
             f"{', '.join(str(results[n]['live_files']) for n in sizes)}", ""]
    lines.append("| measurement | " + " | ".join(f"N={n}: ms, requests" for n in sizes)
                 + f" | ratio {hi}/{lo}: time, requests |")
    lines.append("|---" * (len(sizes) + 2) + "|")
    for k in names:
        cells = []
        for n in sizes:
            secs, reqs = results[n][k]
            cells.append(f"{secs * 1e3:.1f} ms, {sum(reqs.values())} "
                         f"({', '.join(f'{a} {b}' for a, b in sorted(reqs.items()))})")
        (s0, r0), (s1, r1) = results[lo][k], results[hi][k]
        ratio_t = s1 / s0 if s0 else float("nan")
        ratio_r = sum(r1.values()) / max(1, sum(r0.values()))
        lines.append(f"| {label[k]} | " + " | ".join(cells) + f" | {ratio_t:.2f}, {ratio_r:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="24,8760", help="history sizes in hours (comma-separated)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--load", action="store_true", help="also time one real load (starts Spark)")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)
    spark = None
    if args.load:
        from dedup_pipeline.engine.session import SparkSettings, get_session
        spark = get_session(SparkSettings(master="local[2]"))
    results = run([int(s) for s in args.sizes.split(",")], args.repeat, spark, args.workdir)
    print(report(results))
    with open("/proc/loadavg") as f:
        print(f"\nload average: {' '.join(f.read().split()[:3])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
