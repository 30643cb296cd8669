"""Where a load's time goes, hour after hour, in one warm process: the profiler behind docs/notes.md.

    .venv/bin/python -m benchmarks.profile --rows-per-hour 100000 --hours 30 --rerun-last 3

Loads `--hours` consecutive generated hours into a fresh output directory with `run_load`, then
reruns the last hour `--rerun-last` times. Per load it prints wall and CPU seconds (driver JVM +
Python, `probe.measured`), the JVM's JIT compilation time, how many classes Spark's code generator
compiled (a cache miss each), GC time, memory (the load's peak resident set, JVM + Python; then,
after a full GC, the heap's live set / committed size and non-heap in use), the load's own
stage timings and its Spark jobs and stages (`--jobs` lists each job: its Python call site,
stages run and milliseconds). A rerun of an hour generates exactly the code of its first run, so
"new hour vs rerun" isolates what per-hour code generation costs; JIT and compile counts are far steadier than
wall time on a shared machine.
Nothing is asserted: it reports (a test runs it on tiny data so it never rots).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.probe import measured
from dedup_pipeline.config import load_config
from dedup_pipeline.engine.core.parse import list_input_files
from dedup_pipeline.engine.load import run_load
from dedup_pipeline.engine.session import SparkSettings, get_session
from dedup_pipeline.hours import HOUR, format_hour, parse_hour
from dedup_pipeline.sample.generate import generate_landing

START = "2026-11-01-00:00"
REPO = Path(__file__).resolve().parent.parent


class JvmCounters:
    """Cumulative JIT milliseconds, codegen compilations and GC milliseconds of the driver JVM."""

    def __init__(self, spark: Any):
        jvm = spark.sparkContext._jvm
        self.mf = jvm.java.lang.management.ManagementFactory
        self.codegen = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()

    def read(self) -> tuple[int, int, int]:
        gc = sum(b.getCollectionTime() for b in self.mf.getGarbageCollectorMXBeans())
        return (int(self.mf.getCompilationMXBean().getTotalCompilationTime()),
                int(self.codegen.getCount()), int(gc))

    def memory_mib(self) -> dict[str, int]:
        """After a full GC: the heap's live set and committed size, and non-heap (metaspace, code
        cache) in use; MiB. Tells a growing live set (a leak, a filling cache) from a heap the
        collector merely expanded."""
        self.mf.getMemoryMXBean().gc()
        heap = self.mf.getMemoryMXBean().getHeapMemoryUsage()
        non_heap = self.mf.getMemoryMXBean().getNonHeapMemoryUsage()
        return {"heap_live_mib": heap.getUsed() >> 20, "heap_committed_mib": heap.getCommitted() >> 20,
                "non_heap_mib": non_heap.getUsed() >> 20}


def _job_list(spark: Any) -> list[Any]:
    listed = spark.sparkContext._jsc.sc().statusStore().jobsList(None)  # a Scala Seq
    return [listed.apply(i) for i in range(listed.length())]


def last_job_id(spark: Any) -> int:
    return max((j.jobId() for j in _job_list(spark)), default=-1)


def spark_jobs(spark: Any, after: int) -> list[dict[str, Any]]:
    """The Spark jobs since job `after` from the driver's status store (kept whether or not the
    UI is on), the load's writer threads' included: each job's call site (PySpark names the
    Python file and line), its stages (run and skipped) and its wall milliseconds."""
    jobs = []
    for j in _job_list(spark):
        if j.jobId() <= after:
            continue
        sub, end = j.submissionTime(), j.completionTime()
        ms = (end.get().getTime() - sub.get().getTime()
              if sub.isDefined() and end.isDefined() else 0)
        jobs.append({"id": j.jobId(), "site": str(j.name()).replace(str(REPO) + "/", ""),
                     "stages": j.stageIds().length(), "skipped": j.numSkippedStages(), "ms": ms})
    return sorted(jobs, key=lambda x: x["id"])


def profile(work: Path, rows: int, hours: int, rerun_last: int, conf: dict[str, str],
            out: Any = sys.stdout, jobs_detail: bool = False) -> list[dict[str, Any]]:
    """Load and measure; returns one record per load (also printed as a line each)."""
    data = work / f"landing_{rows}"
    stamp = data / ".generated"
    want = json.dumps({"hours": hours, "rows": rows, "start": START})
    if not stamp.exists() or stamp.read_text() != want:
        generate_landing(data, hours=hours, rows_per_hour=rows, seed=7, start=START)
        stamp.write_text(want)
    ds = load_config(str(data / "dedup.yaml")).datasets[0]
    ds = ds.model_copy(update={"output": str(work / "out")})
    shutil.rmtree(ds.output, ignore_errors=True)
    spark = get_session(SparkSettings(conf={"spark.ui.enabled": "false", **conf}))
    spark.sparkContext.setLogLevel("ERROR")
    counters = JvmCounters(spark)
    start = parse_hour(ds.start)
    plan = [(i, "new") for i in range(hours)] + [(hours - 1, "rerun")] * rerun_last
    records = []
    for i, kind in plan:
        hour = start + i * HOUR
        before = counters.read()
        last = last_job_id(spark)
        with measured(spark, [f.path for f in list_input_files(ds, hour)]) as cost:
            r = run_load(spark, ds, format_hour(hour))
        jobs = spark_jobs(spark, last)
        jit, compiles, gc = (a - b for a, b in zip(counters.read(), before, strict=True))
        rec = {"hour": i, "kind": kind, "seconds": round(cost.seconds, 2),
               "cpu_seconds": round(cost.cpu_seconds, 1), "jit_ms": jit,
               "codegen_compiles": compiles, "gc_ms": gc, "rows_in": r.rows_in,
               "index_rows_read": r.index_rows_read, "stages": r.seconds,
               "peak_rss_mib": cost.peak_rss_bytes >> 20, **counters.memory_mib(),
               "spark_jobs": len(jobs), "spark_stages": sum(j["stages"] for j in jobs),
               "spark_stages_run": sum(j["stages"] - j["skipped"] for j in jobs), "jobs": jobs}
        records.append(rec)
        stages = " ".join(f"{k}={v:.2f}" for k, v in r.seconds.items() if k != "total" and v >= 0.01)
        print(f"h{i:<3} {kind:5} {cost.seconds:6.2f}s cpu {cost.cpu_seconds:5.1f}s "
              f"jit {jit / 1000:5.1f}s compiles {compiles:3d} gc {gc / 1000:4.1f}s "
              f"| rss {rec['peak_rss_mib']} heap {rec['heap_live_mib']}/"
              f"{rec['heap_committed_mib']} non-heap {rec['non_heap_mib']} MiB | {stages} | "
              f"jobs {rec['spark_jobs']} stages {rec['spark_stages_run']} run "
              f"({rec['spark_stages']} with skipped)", file=out, flush=True)
        if jobs_detail:
            for j in jobs:
                print(f"    job {j['id']:>5} {j['ms']:6d} ms {j['stages'] - j['skipped']} stage(s)"
                      f" {j['site']}", file=out)
    new = [r for r in records if r["kind"] == "new"]
    late = new[len(new) // 2:]
    for label, xs in (("new hours, second half", late),
                      ("reruns", [r for r in records if r["kind"] == "rerun"])):
        if xs:
            print(f"{label}: median {statistics.median(r['seconds'] for r in xs):.2f}s, JIT "
                  f"{statistics.median(r['jit_ms'] for r in xs) / 1000:.1f}s, codegen compiles "
                  f"{statistics.median(r['codegen_compiles'] for r in xs):.0f} (n={len(xs)})",
                  file=out, flush=True)
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows-per-hour", type=int, default=100_000)
    ap.add_argument("--hours", type=int, default=30, help="consecutive new hours to load")
    ap.add_argument("--rerun-last", type=int, default=3, help="then rerun the last hour N times")
    ap.add_argument("--work", default=str(Path(__file__).resolve().parent / "work" / "profile"))
    ap.add_argument("--jobs", action="store_true",
                    help="list each load's Spark jobs: call site, stages run, milliseconds")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="extra Spark setting (repeatable), e.g. spark.driver.memory=6g")
    args = ap.parse_args(argv)
    conf = dict(c.split("=", 1) for c in args.conf)
    profile(Path(args.work), args.rows_per_hour, args.hours, args.rerun_last, conf,
            jobs_detail=args.jobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
