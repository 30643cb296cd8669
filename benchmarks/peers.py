"""The lake-native peers against this pipeline, hour after hour (design.md N2 (h), (i); T10h, T10i).

    ./scripts/bench.sh --peers                       # 24 and 168 h of history at 1e5 rows/hour (~40 min)
    python -m benchmarks.peers --points 24,168,720   # add the 720 h point (several hours more)
    python -m benchmarks.peers --points 168,720 --thin 10000   # 720 h in about an hour
    python -m benchmarks.peers --quick               # tiny data, a smoke test (the suite's)
    python -m benchmarks.peers --rows 1000000 --points 24 --only merge_duckdb,merge_spark

Every hour is loaded by (a) this pipeline (`run_load`, benchmarks/worker.py, the worker's
settings), (h) Spark + Delta insert-only MERGE and (i) DuckDB + delta-rs insert-only MERGE
(benchmarks/merge.py), each in a process of its own, one computing at a time, each hour's landing
files in the page cache first. A MERGE's cost grows with the table it merges into, so each peer
merges every hour from the first. At the measured hours (`--points`, three consecutive hours
each) the rows each peer inserted for the hour must equal (a)'s unique rows for it (whole rows of
the declared columns, as multisets); a difference is a correctness failure (exit 1).

`--defaults` adds (a'): the same load with the product's Spark defaults (no driver memory set:
Spark's 1g), what a `dedup-pipeline run` gets unless its config says otherwise, beside (a)'s
worker setting (4g).

Prints, per point, the median seconds of each system and the ratios peer/(a) (above 1: the peer
is slower), and the history length where each peer's per-hour time first stays above (a)'s (the
crossing: the first hour from which the median of five consecutive hours of peer/(a) is >= 1).
Writes benchmarks/results/peers-<stamp>.json.

`--thin ROWS` gives every hour more than FULL_BEFORE hours before a measured point ROWS rows
instead of `--rows` (a thin history): the commits, Delta log entries, files and index slices a
long history leaves behind are all there, while the rows that can still be live at a point (the
24 h expiry window, late and replayed records) come from full hours. It makes the 720 h point a
one-hour run instead of a three-hour one. The files per hour of each table are printed for full
and thin hours (a thin hour that wrote fewer files would flatter a MERGE), and no crossing is
computed (a thin hour is not the same work as a full one).

(h) runs in the venv scripts/merge_spark_env.sh builds (pyspark 4.2.0 + delta-spark 4.4.0; no
delta-spark release supports the product's pyspark 4.3); without it (h) is skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import yaml
from deltalake import DeltaTable

from benchmarks.data import landing, unique_table
from benchmarks.probe import Cost, exit_status, save_report
from benchmarks.worker import WORKER_CONF, Worker, dataset_from_spec
from dedup_pipeline.engine.core.commits import CommitRecord
from dedup_pipeline.hours import HOUR, format_hour, parse_hour, to_tag

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NAMES = {"pipeline": "(a) this pipeline", "merge_spark": "(h) Spark + Delta MERGE",
         "merge_duckdb": "(i) DuckDB + delta-rs MERGE",
         "pipeline_defaults": "(a') this pipeline, the product's Spark defaults"}
PEERS = ("merge_spark", "merge_duckdb")
SPAN = 3  # consecutive hours measured at each point
FULL_BEFORE = 48  # with --thin: full hours before each point (expiry window 24 h, late, replays)
WINDOW = 5  # hours in the running median that decides a crossing
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Delta's default (50) splits a small table's log replay into 50 tasks: 4.4 s per hour on 2
    # cores against 1.0 s with one partition per core
    "spark.databricks.delta.snapshotPartitions": str(os.cpu_count() or 2),
}


def merge_env(build: bool = True) -> Path | None:
    """The (h) environment's directory (venv/, jars/), built by scripts/merge_spark_env.sh when
    Maven is at hand; None (and (h) skipped) when it cannot be, or, with `build` False, when it
    is not built yet."""
    cmd = [str(REPO / "scripts" / "merge_spark_env.sh"), *([] if build else ["--cached"])]
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except (subprocess.CalledProcessError, OSError) as e:
        if build:
            print(f"(h) skipped: its environment could not be built ({e})", file=sys.stderr)
        return None
    return Path(out.strip().splitlines()[-1])


def _rows(t: pa.Table, columns: list[str]) -> list[tuple]:
    """Whole rows of `columns`, timestamps as microseconds (time zones differ between writers)."""
    cols = []
    for c in columns:
        a = t.column(c)
        if pa.types.is_timestamp(a.type):
            a = pc.cast(pc.cast(a, pa.timestamp("us")), pa.int64())
        cols.append(a.to_pylist())
    return sorted(zip(*cols, strict=True), key=repr)


def pipeline_unique(root: Path, tag: str, columns: list[str]) -> list[tuple]:
    return _rows(unique_table(root, tag, columns), columns)


def peer_unique(root: Path, tag: str, columns: list[str]) -> list[tuple]:
    t = DeltaTable(str(root / "unique")).to_pyarrow_table(filters=[("load_hour", "=", tag)])
    return _rows(t, columns)


def crossing(a: list[float], peer: list[float]) -> int | None:
    """The first hour from which the median of WINDOW hours of peer/(a) is >= 1 and stays so."""
    ratios = [p / x for p, x in zip(peer, a, strict=True)]
    med = [statistics.median(ratios[i:i + WINDOW]) for i in range(len(ratios) - WINDOW + 1)]
    for i in range(len(med)):
        if all(m >= 1 for m in med[i:]):
            return i
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default="24,168", help="history lengths measured (hours)")
    ap.add_argument("--rows", type=int, default=100_000, help="rows per hour")
    ap.add_argument("--only", default=",".join(PEERS), help="peers to run (comma-separated)")
    ap.add_argument("--quick", action="store_true", help="tiny data: 300 rows, points 1 and 2")
    ap.add_argument("--defaults", action="store_true",
                    help="also (a'): the pipeline with the product's Spark defaults (the driver "
                         "memory a user gets: Spark's 1g) beside (a)'s worker settings (4g)")
    ap.add_argument("--thin", type=int, default=None, metavar="ROWS",
                    help=f"hours more than {FULL_BEFORE} h before every point get ROWS rows")
    ap.add_argument("--work", default=str(HERE / "work" / "peers"))
    args = ap.parse_args(argv)
    points = (1, 2) if args.quick else tuple(sorted(int(p) for p in args.points.split(",")))
    rows = 300 if args.quick else args.rows
    span = 1 if args.quick else SPAN
    peers = [p for p in args.only.split(",") if p]
    unknown = set(peers) - set(PEERS)
    if unknown:
        ap.error(f"--only takes {', '.join(PEERS)}; not {', '.join(sorted(unknown))}")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    def say(msg: str) -> None:
        print(msg, flush=True)

    hours = max(points) + span
    full = frozenset(h for p in points for h in range(max(0, p - FULL_BEFORE), p + span))
    thin = (args.thin, full) if args.thin is not None and not args.quick else None
    config = landing(work / (f"landing-{rows}" + (f"-thin{args.thin}" if thin else "")), hours,
                     rows, say, thin)
    raw = yaml.safe_load(config.read_text())
    spec_ds = raw["datasets"][0]
    columns = list(spec_ds["source"]["schema"])
    env = merge_env() if "merge_spark" in peers else None
    if "merge_spark" in peers and env is None:
        peers.remove("merge_spark")
    if args.defaults:
        peers.append("pipeline_defaults")
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    outs = {k: work / "out" / k for k in ("pipeline", *peers)}
    for p in outs.values():
        shutil.rmtree(p, ignore_errors=True)
        p.mkdir(parents=True)
    workers: dict[str, Worker] = {}

    def spec(kind: str, conf: dict[str, str]) -> dict[str, Any]:
        ds = {**spec_ds, "name": "clicks", "output": str(outs[kind])}
        return {"config": str(config), "dataset": ds, "conf": conf, "root": str(outs[kind])}

    samples: dict[str, list[float]] = {k: [] for k in outs}
    costs: dict[str, list[dict[str, Any]]] = {k: [] for k in outs}
    failures: list[str] = []
    checked: dict[str, int] = {p: 0 for p in peers}
    measured = {p + k for p in points for k in range(span)}
    try:
        workers["pipeline"] = Worker("pipeline", spec("pipeline", WORKER_CONF),
                                     logs / "pipeline.log")
        if "pipeline_defaults" in peers:  # what a `dedup-pipeline run` gets: no settings of ours
            workers["pipeline_defaults"] = Worker("pipeline", spec("pipeline_defaults", {}),
                                                  logs / "pipeline_defaults.log")
        if "merge_duckdb" in peers:
            workers["merge_duckdb"] = Worker("merge_duckdb", spec("merge_duckdb", {}),
                                             logs / "merge_duckdb.log")
        if "merge_spark" in peers:
            assert env is not None
            jars = ",".join(str(j) for j in sorted((env / "jars").glob("*.jar")))
            conf = {**WORKER_CONF, **DELTA_CONF, "spark.jars": jars}
            workers["merge_spark"] = Worker("merge_spark", spec("merge_spark", conf),
                                            logs / "merge_spark.log",
                                            python=str(env / "venv" / "bin" / "python"))
        start = parse_hour(dataset_from_spec(spec("pipeline", {})).start)
        t0 = time.perf_counter()
        for i in range(hours):
            hour = start + i * HOUR
            key = format_hour(hour)
            line = f"h{i:>4} {key}:"
            for kind, w in workers.items():
                cost, extra = w.step(key)
                samples[kind].append(cost.seconds)
                costs[kind].append({"hour": key, "history": i, **_cost(cost)})
                if kind.startswith("pipeline"):
                    ra = CommitRecord.from_json(extra["result"], to_tag(hour))
                    costs[kind][-1]["stages"] = ra.seconds
                line += f" {kind_label(kind)} {cost.seconds:6.2f}s"
            if i in measured:
                tag = to_tag(hour)
                want = pipeline_unique(outs["pipeline"], tag, columns)
                for p in peers:
                    got = (pipeline_unique(outs[p], tag, columns) if p == "pipeline_defaults"
                           else peer_unique(outs[p], tag, columns))
                    same = got == want
                    checked[p] += 1
                    line += f" {kind_label(p)}==(a): {'yes' if same else 'NO'}"
                    if not same:
                        failures.append(f"{key}: {NAMES[p]} inserted {len(got)} rows, (a) kept "
                                        f"{len(want)} unique rows; they differ")
            if (i + 1) % 24 == 0 and i + 1 < hours:
                left = (time.perf_counter() - t0) / (i + 1) * (hours - i - 1)
                line += f" | {i + 1}/{hours} h, about {left / 60:.0f} min to go"
            say(line)
    finally:
        for w in workers.values():
            w.close()

    report = summarize(samples, costs, points, span, rows, peers, checked, say,
                       crossings=thin is None)
    report["thin"] = None if thin is None else {"rows": thin[0], "full_hours": sorted(full)}
    if thin is not None:
        report["files_per_hour"] = files_per_hour(outs, hours, full, say)
    report["failures"] = failures
    path = save_report("peers", report)
    say(f"report: {path.relative_to(REPO)}")
    return exit_status(failures)


def files_per_hour(outs: dict[str, Path], hours: int, full: frozenset[int],
                   say: Any) -> dict[str, dict[str, float]]:
    """Files each system's unique table added per commit (one commit an hour: version i is hour
    i), averaged over the full and the thin hours."""
    say("\nfiles added to the unique table per hour (full hours / thin hours)")
    found: dict[str, dict[str, float]] = {}
    for kind, root in outs.items():
        adds: dict[int, int] = {}
        for f in (root / "unique" / "_delta_log").glob("*.json"):
            with f.open() as fh:
                adds[int(f.stem)] = sum(1 for line in fh if "add" in json.loads(line))
        if sorted(adds) != list(range(hours)):
            say(f"  {kind_label(kind)}: {len(adds)} commits for {hours} hours; not compared")
            continue
        per = {name: statistics.mean(adds[v] for v in adds if (v in full) == is_full)
               for name, is_full in (("full", True), ("thin", False))}
        found[kind] = per
        say(f"  {kind_label(kind)}: {per['full']:.2f} / {per['thin']:.2f}")
    return found


def kind_label(kind: str) -> str:
    return NAMES[kind].split()[0]


def _cost(c: Cost) -> dict[str, Any]:
    return {"seconds": round(c.seconds, 3), "cpu_seconds": round(c.cpu_seconds, 3),
            "peak_rss_bytes": c.peak_rss_bytes}


def summarize(samples: dict[str, list[float]], costs: dict[str, list[dict[str, Any]]],
              points: tuple[int, ...], span: int, rows: int, peers: list[str],
              checked: dict[str, int], say: Any, crossings: bool = True) -> dict[str, Any]:
    """The table: per point the median seconds of each system and peer/(a); the crossings."""
    table = []
    say(f"\n{rows} rows/hour; median of {span} hours at each history length; "
        "ratio = peer / (a), above 1 the peer is slower")
    head = f"{'history':>8} {'(a) s':>7}" + "".join(
        f" {kind_label(p) + ' s':>7} {kind_label(p) + '/(a)':>8}" for p in peers)
    say(head)
    for p in points:
        row: dict[str, Any] = {"history": p}
        a = statistics.median(samples["pipeline"][p:p + span])
        row["pipeline"] = round(a, 3)
        text = f"{p:>8} {a:7.2f}"
        for k in peers:
            v = statistics.median(samples[k][p:p + span])
            row[k], row[f"{k}/pipeline"] = round(v, 3), round(v / a, 3)
            text += f" {v:7.2f} {v / a:8.2f}"
        table.append(row)
        say(text)
    crossed: dict[str, int | None] = {}
    for k in peers:
        if not crossings:
            say(f"{NAMES[k]}: no crossing computed (a thin history)")
            continue
        c = crossing(samples["pipeline"], samples[k]) if len(samples[k]) >= WINDOW else None
        crossed[k] = c
        say(f"{NAMES[k]}: " + (f"slower than (a) from {c} h of history on" if c is not None
                               else "never slower than (a) over the hours run"))
    return {"rows_per_hour": rows, "points": list(points), "span": span, "table": table,
            "crossing_history": crossed, "checked_hours": checked, "samples": costs,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}


if __name__ == "__main__":
    raise SystemExit(main())
