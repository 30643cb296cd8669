"""The benchmark: this pipeline against its peers, side by side in one run (design.md N1, N2).

    ./scripts/bench.sh            # the full run (1-1.75 h on 2 cores; writes RESULTS.md)
    ./scripts/bench.sh --quick    # tiny data, every part once, a few minutes: the test suite's
    ./scripts/bench.sh --long     # T2 at 720 h: (a) every hour, (b) and (e) sampled (~45 min)
    ./scripts/bench.sh --s3       # the S3 point (benchmarks/s3.py): S3 vs local disk, requests
    ./scripts/bench.sh --peers    # the lake-native MERGE peers (benchmarks/peers.py), ~40 min

Hours in order, one system computing at a time. (a) this pipeline and (d) Structured Streaming
each run in a process and Spark session of their own (benchmarks/worker.py: so each has its own
peak memory, T6, and never pays for another system's garbage); the rest share the runner's
session. Every measured step starts with the hour's landing files in the page cache. Per hour
it loads (a), (f) the pipeline without expiry and (d), which all need every hour; at the measured
hours (history lengths `--points`, three consecutive hours each, one with `--quick`) it also runs
(b) the naive anti-join, (c) recompute and (e) the plain copy, and checks that (a) and (b) keep
exactly the same unique rows and that both conserve rows. At the first hour of each point (a)'s hour is
also rerun by a `dedup-pipeline run` process of its own, a fresh driver as a Dagster run has one
(T6f: memory per run, without the warm-up of a JVM that has loaded every hour before; the rerun
must leave the same unique rows). Over the hours up to the first point's last, (g) loads each
hour the way the recommended topology runs it: a fresh `dedup-pipeline run` process against one
warm Spark Connect server (T8: against (a) and (d) of the same hour; its unique rows must equal
(a)'s). Then the 1e6-row scenario (T4), the backfill as whole processes (T5), and one hour at a
time materialized from the UI of `dagster dev` against a warm server (T8ui, benchmarks/ui.py).
`--skip` takes parts (big, backfill, fresh, deployed, ui) and peers (streaming, pipeline_noexp,
naive, recompute, floor) for exploratory runs. It prints a table with the target
ratios and writes `benchmarks/results/<stamp>.json`, a PNG plot and (full runs)
`benchmarks/RESULTS.md`.
`--long` is the run for T2 at 720 h of history: only (a) every hour and (b), (e) at 24, 168 and
720 h; its data lives in `work/long/` and it rewrites only the long-run section of RESULTS.md
(a full run keeps that section).
Exit status 1 if a correctness check failed; a missed target is reported, never an error.
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
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from benchmarks import systems, warm
from benchmarks.data import input_paths, is_conserved, landing, unique_table
from benchmarks.probe import Cost, exit_status, measured, run_process, settle
from benchmarks.worker import WORKER_CONF, System, Worker, dataset_from_spec
from dedup_pipeline.config import DatasetConfig
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.commits import CommitRecord
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import run_load
from dedup_pipeline.engine.session import BASE_CONF, SparkSettings, get_session
from dedup_pipeline.hours import HOUR, format_hour, parse_hour, to_tag

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SYSTEMS = {
    "pipeline": "(a) this pipeline",
    "naive": "(b) naive anti-join vs full unique",
    "recompute": "(c) dropDuplicates over all",
    "streaming": "(d) streaming dropDuplicatesWithinWatermark, RocksDB",
    "floor": "(e) plain copy, JSON -> Parquet",
    "pipeline_noexp": "(f) this pipeline, no expiry",
    "deployed": "(g) as deployed: a fresh run process, warm server",
}
EVERY_HOUR = ("pipeline", "pipeline_noexp", "streaming")
SAMPLED = ("naive", "recompute", "floor")
BENCH_CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "6g"}
# (a) and (d) run in processes of their own (benchmarks/worker.py), three JVMs in 24 GiB


@dataclass
class Plan:
    points: tuple[int, ...]  # history lengths measured, three consecutive hours each
    rows_per_hour: int
    big_rows_per_hour: int  # T4 scenario
    big_history: int
    backfill_hours: int  # T5: hours in the single-run backfill
    separate_runs: int  # T5: one-hour runs, each a whole process
    quick: bool = False
    isolate: bool = True  # (a) and (d) in processes of their own (benchmarks/worker.py)
    every_hour: tuple[str, ...] = EVERY_HOUR  # systems loaded every hour
    sampled: tuple[str, ...] = SAMPLED  # systems run at the measured hours only
    long: bool = False  # the long run: T2 at 720 h, its own section of RESULTS.md
    fresh: bool = True  # T6f: rerun (a)'s first hour at each point in a process of its own
    deployed: bool = True  # T8: (g), a fresh `run` process per hour against a warm Connect server
    ui: bool = True  # T8ui: one hour materialized from the UI of `dagster dev` (benchmarks/ui.py)
    ui_rows: int = 2_000
    ui_warmup: int = 2
    ui_measured: int = 3
    span: int = 3  # consecutive hours measured at each point (their median is the point's figure)

    @property
    def deployed_hours(self) -> int:
        """(g) loads hours 0 .. the first point's last: its server warms up on the hours before."""
        return min(self.points) + self.span if self.deployed else 0

    @property
    def hours(self) -> int:
        return max(self.points) + self.span

    def measured(self) -> dict[int, int]:
        """hour index -> the history length it is measured for."""
        return {p + k: p for p in self.points for k in range(self.span)}


FULL = Plan(points=(24, 72, 168), rows_per_hour=100_000, big_rows_per_hour=1_000_000,
            big_history=24, backfill_hours=168, separate_runs=3)
# The test suite's run: every part once on tiny data, one hour per point (a smoke test of the
# scripts and the report, minutes; its figures mean nothing).
QUICK = Plan(points=(1, 2), rows_per_hour=300, big_rows_per_hour=1_000, big_history=1,
             backfill_hours=2, separate_runs=1, quick=True, isolate=False, ui_rows=50,
             ui_warmup=0, ui_measured=1, span=1)
# The long run measures T2 at 720 h: only what that ratio needs, (a) every hour and (b) (with the
# copy (e) for scale) at three history lengths. Recompute would take hours at 720 h of history,
# and (d)/(f) every hour would triple the run (4-5 h instead of about 2 h).
LONG = Plan(points=(24, 168, 720), rows_per_hour=100_000, big_rows_per_hour=1_000_000,
            big_history=24, backfill_hours=0, separate_runs=0, every_hour=("pipeline",),
            sampled=("naive", "floor"), long=True, deployed=False, ui=False)
LONG_PARTS = {"big", "backfill", "deployed", "ui"}  # never part of the long run
PARTS = {"big", "backfill", "fresh", "deployed", "ui"}  # what --skip takes, besides system names
# (g)'s warm Spark Connect server: (a)'s worker settings on the server's command line
SERVER_CONF = {"spark.driver.memory": WORKER_CONF["spark.driver.memory"]}


@dataclass
class Sample:
    system: str
    hour: str
    history: int  # hours loaded before this one
    seconds: float
    cpu_seconds: float
    peak_rss_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)


class Deployed:
    """(g), the recommended topology as a user runs it (T8): for each hour a fresh
    `dedup-pipeline run` process (Python start-up, Dagster definitions, an in-process Dagster run
    recorded in an instance on disk, a Spark Connect client) against one warm Spark Connect server
    (`dedup-pipeline spark-server`, (a)'s driver memory), loading into an output of its own."""

    def __init__(self, bench: Bench, config: Path):
        from dedup_pipeline.cli.runs import DEMO_INSTANCE_YAML

        self.ds = bench.dataset(config, "out/deployed")
        self.cfg = bench.cli_config(config, self.ds, "deployed.yaml", {})
        logs = bench.work / "logs"
        logs.mkdir(exist_ok=True)
        self.log = logs / "deployed-runs.log"
        home = bench.work / "deployed_home"  # the instance the runs write to, as a deployment's
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir()
        (home / "dagster.yaml").write_text(DEMO_INSTANCE_YAML)
        port = warm.free_port()
        self.server = warm.start_server(port, logs / "spark-server.log", SERVER_CONF)
        self.env = warm.child_env(SPARK_REMOTE=f"sc://127.0.0.1:{port}", DAGSTER_HOME=str(home))

    def step(self, spark: Any, hour: datetime) -> tuple[float, CommitRecord]:
        """Wall seconds of the run process for `hour` (its landing files in the page cache first,
        as every system's) and the hour's commit record."""
        settle(spark, input_paths(self.ds, hour))
        wall = warm.fresh_run(self.cfg, format_hour(hour), self.env, self.log)
        rec = commits.read_commit(Storage(self.ds.output), to_tag(hour))
        if rec is None:
            raise RuntimeError(f"(g) did not commit {format_hour(hour)}; see {self.log}")
        return wall, rec

    def close(self) -> None:
        warm.stop_server(self.server)


class Bench:
    def __init__(self, plan: Plan, work: Path, say: Any):
        self.plan, self.work, self.say = plan, work, say
        self.samples: list[Sample] = []
        self.failures: list[str] = []
        self.fresh: list[dict[str, Any]] = []  # T6f: one rerun process per history point

    # ------------------------------------------------------------------ data
    def landing(self, name: str, hours: int, rows: int) -> Path:
        return landing(self.work / name, hours, rows, self.say)

    def section(self, config: Path, output: str, expiry: bool = True) -> dict[str, Any]:
        """The generated dataset, writing to `output` (emptied first), with or without expiry."""
        raw = yaml.safe_load(config.read_text())
        d = raw["datasets"][0]
        d["output"] = output
        if not expiry:
            d.pop("expiry")
            d["name"] = f"{d['name']}_noexp"
        shutil.rmtree(config.parent / output, ignore_errors=True)
        return d

    def dataset(self, config: Path, output: str, expiry: bool = True) -> DatasetConfig:
        spec = {"config": str(config), "dataset": self.section(config, output, expiry)}
        return dataset_from_spec(spec)

    def system(self, spark: Any, kind: str, config: Path, output: str,
               root: Path | None = None, memory: str | None = None) -> Worker | System:
        """(a) or (d): in a process of its own (see benchmarks/worker.py), or with `--quick` in
        the runner's session."""
        conf = {**WORKER_CONF, **({"spark.driver.memory": memory} if memory else {})}
        spec = {"config": str(config), "dataset": self.section(config, output),
                "conf": conf, "root": str(root or "")}
        if not self.plan.isolate:
            return System(kind, spark, dataset_from_spec(spec), spec["root"])
        logs = self.work / "logs"
        logs.mkdir(exist_ok=True)
        return Worker(kind, spec, logs / f"{kind}-{Path(output).name}.log")

    def record(self, system: str, hour: datetime, history: int, cost: Cost, **extra: Any) -> None:
        if not cost.peak_is_per_step:
            extra["peak_is_per_step"] = False  # the reset was refused: a lifetime peak
        self.samples.append(Sample(system, format_hour(hour), history, round(cost.seconds, 3),
                                   round(cost.cpu_seconds, 3), cost.peak_rss_bytes, extra))

    # ------------------------------------------------------------------ the main loop
    def run_hours(self, spark: Any, config: Path) -> None:
        plan = self.plan
        ds = self.dataset(config, "out/pipeline")
        every = set(plan.every_hour)
        noexp = (self.dataset(config, "out/pipeline_noexp", expiry=False)
                 if "pipeline_noexp" in every else None)
        scratch = self.work / "out" / "scratch"
        start = parse_hour(ds.start)
        measured_at = plan.measured()
        pipeline = self.system(spark, "pipeline", config, "out/pipeline")
        stream = (self.system(spark, "streaming", config, "out/streaming",
                              root=self.work / "out" / "streaming")
                  if "streaming" in every else None)
        deployed = None
        t0 = time.perf_counter()
        try:
            deployed = Deployed(self, config) if plan.deployed else None
            for i in range(plan.hours):
                hour = start + i * HOUR
                key = format_hour(hour)
                ca, extra = pipeline.step(key)
                ra = CommitRecord.from_json(extra["result"], to_tag(hour))
                self.record("pipeline", hour, i, ca, **_load_figures(ra))
                line = f"h{i:>4} {key}: (a) {ca.seconds:5.2f}s"
                conserved = is_conserved(ra)
                if noexp is not None:
                    with measured(spark, input_paths(ds, hour)) as cf:
                        rf = run_load(spark, noexp, key)
                    self.record("pipeline_noexp", hour, i, cf, **_load_figures(rf))
                    line += f" (f) {cf.seconds:5.2f}s"
                    conserved = conserved and is_conserved(rf)
                if stream is not None:
                    cd, _ = stream.step(key)
                    self.record("streaming", hour, i, cd)
                    line += f" (d) {cd.seconds:5.2f}s"
                if deployed is not None:
                    line += self.deployed_hour(spark, deployed, ds, hour, i)
                    if i + 1 == plan.deployed_hours:
                        deployed.close()  # its JVM's memory back before the longer histories
                        deployed = None
                if i in measured_at:
                    line += self.sampled(spark, ds, hour, i, ra, scratch)
                if plan.fresh and i in plan.points:
                    line += self.fresh_driver(config, ds, hour, i, scratch)
                if i + 1 < plan.hours and (i + 1) % 24 == 0:  # long runs: when will it end
                    left = (time.perf_counter() - t0) / (i + 1) * (plan.hours - i - 1)
                    line += f" | {i + 1}/{plan.hours} h, about {left / 60:.0f} min to go"
                self.say(line)
                if not conserved:
                    self.failures.append(f"{key}: the pipeline broke conservation")
        finally:
            pipeline.close()
            if stream is not None:
                stream.close()
            if deployed is not None:
                deployed.close()

    def deployed_hour(self, spark: Any, d: Deployed, ds: DatasetConfig, hour: datetime,
                      i: int) -> str:
        """(g) loads the hour; from the first point on its unique rows must equal (a)'s."""
        wall, rec = d.step(spark, hour)
        extra: dict[str, Any] = {"engine_seconds": rec.seconds["total"]}
        line = f" (g) {wall:5.2f}s"
        measured_hour = i >= min(self.plan.points)  # T8 and T8d's hours
        if measured_hour:  # what any run process costs, beside (g)
            rf = warm.run_floor(format_hour(hour), d.env)
            extra.update(run_floor_seconds=rf["wall"], run_floor_marks=rf["marks"])
            line += f" run floor {rf['wall']:4.2f}s"
        self.record("deployed", hour, i, Cost(seconds=wall), **extra)
        if not is_conserved(rec):
            self.failures.append(f"{format_hour(hour)}: (g) broke conservation")
        if measured_hour:
            same = _same_unique(Path(ds.output), Path(d.ds.output), to_tag(hour),
                                list(ds.source.schema))
            if not same:
                self.failures.append(f"{format_hour(hour)}: (g) and (a) kept different unique rows")
            line += f" (g)==(a): {'yes' if same else 'NO'}"
        return line

    def sampled(self, spark: Any, ds: DatasetConfig, hour: datetime, i: int, ra: CommitRecord,
                scratch: Path) -> str:
        """(b), (c), (e) at a measured hour (those in the plan), and the (a) == (b) check."""
        history = str(Path(ds.output) / "unique")
        line = " |"
        if "naive" in self.plan.sampled:
            naive_out = scratch / "naive"
            with measured(spark, input_paths(ds, hour)) as cb:
                rb = systems.naive_load(spark, ds, hour, ra.expiry_point, history, str(naive_out))
            self.record("naive", hour, i, cb, unique=rb.unique)
            same = _same_unique(Path(ds.output), naive_out, to_tag(hour), list(ds.source.schema))
            if not same:
                self.failures.append(f"{format_hour(hour)}: (a) and (b) kept different unique rows")
            if not rb.conserved:
                self.failures.append(f"{format_hour(hour)}: (b) broke conservation")
            line += f" (b) {cb.seconds:5.2f}s"
        if "recompute" in self.plan.sampled:
            with measured(spark, input_paths(ds, hour)) as cc:
                rows = systems.recompute_load(spark, ds, hour, history, str(scratch / "recompute"))
            self.record("recompute", hour, i, cc, table_rows=rows)
            line += f" (c) {cc.seconds:5.2f}s"
        if "floor" in self.plan.sampled:
            with measured(spark, input_paths(ds, hour)) as ce:
                systems.floor_copy(spark, ds, hour, str(scratch / "floor"))
            self.record("floor", hour, i, ce)
            line += f" (e) {ce.seconds:5.2f}s"
        if "naive" in self.plan.sampled:
            line += f" unique (a)==(b): {'yes' if same else 'NO'}"
        return line

    def fresh_driver(self, config: Path, ds: DatasetConfig, hour: datetime, i: int,
                     scratch: Path) -> str:
        """T6f: rerun (a)'s hour with `dedup-pipeline run`, a process and driver of its own with
        the worker's Spark settings, and take its peak memory (JVM + Python). In production each
        Dagster run (an hour, or a backfill range) starts its driver; the worker's resident set
        also carries the warm-up of a JVM that has loaded every hour before (heap growth, code
        cache, Spark's status store), which does not follow history. A rerun redoes the hour's
        whole load (R10) and must leave the same unique rows: checked against (b) when it ran."""
        cfg = self.cli_config(config, ds, "fresh.yaml", WORKER_CONF)
        key = format_hour(hour)
        (self.work / "logs").mkdir(exist_ok=True)
        seconds, peak = _cli_run(cfg, key, key, log=self.work / "logs" / f"fresh-{i}.log")
        self.fresh.append({"hour": key, "history": i, "seconds": round(seconds, 2),
                           "peak_rss_bytes": peak})
        line = f" | fresh-driver rerun {seconds:5.1f}s {peak / 2**20:5.0f} MiB"
        if "naive" in self.plan.sampled:
            same = _same_unique(Path(ds.output), scratch / "naive", to_tag(hour),
                                list(ds.source.schema))
            if not same:
                self.failures.append(f"{key}: the fresh-driver rerun changed (a)'s unique rows")
            line += f" same unique: {'yes' if same else 'NO'}"
        return line

    def cli_config(self, config: Path, ds: DatasetConfig, name: str,
                   conf: dict[str, str]) -> Path:
        """A copy of the landing's config writing to `ds`'s output, with these Spark settings."""
        raw = yaml.safe_load(config.read_text())
        raw["datasets"][0]["output"] = str(Path(ds.output))
        raw["spark"] = {"conf": dict(conf)}
        cfg = config.parent / name
        cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
        return cfg

    # ------------------------------------------------------------------ T4: big hours
    def run_big(self, spark: Any) -> None:
        plan = self.plan
        hours = plan.big_history + plan.span
        config = self.landing("landing_big", hours, plan.big_rows_per_hour)
        ds = self.dataset(config, "out/big")
        start = parse_hour(ds.start)
        # alone with the runner in this part: the same driver memory as the runner's copy (e)
        pipeline = self.system(spark, "pipeline", config, "out/big",
                               memory=BENCH_CONF["spark.driver.memory"])
        try:
            self._big_hours(spark, ds, pipeline, start, hours)
        finally:
            pipeline.close()

    def _big_hours(self, spark: Any, ds: DatasetConfig, pipeline: Worker | System, start: datetime,
                   hours: int) -> None:
        plan = self.plan
        for i in range(hours):
            hour = start + i * HOUR
            ca, extra = pipeline.step(format_hour(hour))
            ra = CommitRecord.from_json(extra["result"], to_tag(hour))
            line = f"big h{i:>3}: (a) {ca.seconds:6.2f}s"
            if i >= plan.big_history:
                self.record("big_pipeline", hour, i, ca, **_load_figures(ra))
                with measured(spark, input_paths(ds, hour)) as ce:
                    systems.floor_copy(spark, ds, hour, str(self.work / "out" / "scratch" / "bigf"))
                self.record("big_floor", hour, i, ce)
                line += f" (e) {ce.seconds:6.2f}s"
            self.say(line)

    # ------------------------------------------------------------------ T5: whole processes
    def run_backfill(self, config: Path) -> dict[str, Any]:
        plan = self.plan
        ds = self.dataset(config, "out/backfill")
        cfg = self.cli_config(config, ds, "backfill.yaml", BENCH_CONF)
        start = parse_hour(ds.start)
        first, last = format_hour(start), format_hour(start + (plan.backfill_hours - 1) * HOUR)
        single, peak = _cli_run(cfg, first, last)
        self.say(f"backfill {plan.backfill_hours} h as one run: {single:.1f}s "
                 f"({single / plan.backfill_hours:.2f}s per hour, peak {peak / 2**20:.0f} MiB)")
        separate = []
        for k in range(plan.separate_runs):
            key = format_hour(start + (plan.backfill_hours + k) * HOUR)
            separate.append(_cli_run(cfg, key, key)[0])
            self.say(f"separate one-hour run {key}: {separate[-1]:.1f}s")
        return {"backfill_hours": plan.backfill_hours, "single_run_seconds": round(single, 2),
                "single_run_peak_rss_bytes": peak,
                "single_run_per_hour": round(single / plan.backfill_hours, 3),
                "separate_run_seconds": [round(s, 2) for s in separate],
                "separate_run_per_hour": round(statistics.median(separate), 3)}


    # ------------------------------------------------------------------ T8ui: the UI
    def run_ui(self) -> dict[str, Any]:
        """One hour at a time materialized from `dagster dev`'s UI against a warm server."""
        from benchmarks.ui import measure_ui

        plan = self.plan
        return measure_ui(self.work / "ui", rows=plan.ui_rows, warmup=plan.ui_warmup,
                          measured=plan.ui_measured, say=self.say)


def complete_run(plan: Plan, skip: set[str]) -> bool:
    """Only a run that measures every target replaces RESULTS.md and its plot: not `--quick`,
    not `--long`, nothing skipped, three history points reaching 168 h or more."""
    return (not plan.quick and not plan.long and not skip and len(plan.points) >= 3
            and max(plan.points) >= 168)


def complete_long_run(plan: Plan) -> bool:
    """A `--long` run reaching 720 h replaces the long-run section of RESULTS.md (only that)."""
    return plan.long and not plan.quick and len(plan.points) >= 3 and max(plan.points) >= 720


LONG_BEGIN = "<!-- long run: written by `./scripts/bench.sh --long`, kept by full runs -->"
LONG_END = "<!-- end of the long run -->"


HAND_BEGIN = ("<!-- hand-written: everything below is kept by hand (a full run of run.py rewrites "
              "the sections above this line) -->")
HAND_END = "<!-- end of the hand-written part -->"


def _section(md: str, begin: str, end: str) -> str | None:
    """The part of `md` between the markers `begin` and `end` (included), None if absent."""
    if begin not in md or end not in md:
        return None
    start = md.index(begin)
    return md[start:md.index(end, start) + len(end)]


def _with_section(md: str, old: str | None, section: str | None) -> str:
    """`md` with `old` replaced by `section` (appended if `old` is None; unchanged if no section)."""
    if section is None:
        return md
    if old is not None:
        return md.replace(old, section)
    return md.rstrip("\n") + "\n\n" + section + "\n"


def long_section(md: str) -> str | None:
    """The long-run section of a RESULTS.md (markers included), None if it has none."""
    return _section(md, LONG_BEGIN, LONG_END)


def with_long_section(md: str, section: str | None) -> str:
    """`md` with its long-run section replaced by `section` (appended if it has none)."""
    return _with_section(md, long_section(md), section)


def hand_section(md: str) -> str | None:
    """The hand-written part of a RESULTS.md (targets, analysis, run history), None if absent."""
    return _section(md, HAND_BEGIN, HAND_END)


def with_hand_section(md: str, section: str | None) -> str:
    """`md` with its hand-written part replaced by `section` (appended if it has none)."""
    return _with_section(md, hand_section(md), section)


def _load_figures(r: CommitRecord) -> dict[str, Any]:
    return {"rows_in": r.rows_in, "unique": r.unique, "index_rows_read": r.index_rows_read,
            "index_bytes_read": r.index_bytes_read, "index_files_read": r.index_files_read,
            "files_written": r.files_written, "stages": r.seconds}


def _same_unique(a_root: Path, b_root: Path, tag: str, columns: list[str]) -> bool:
    """Whole rows of two unique partitions compared as multisets (order-free)."""
    def rows(root: Path) -> list[tuple]:
        t = unique_table(root, tag, [*columns, "_source_file"])
        return sorted(zip(*[t.column(c).to_pylist() for c in t.column_names], strict=True),
                      key=repr)
    return rows(a_root) == rows(b_root)


def _cli_run(cfg: Path, first: str, last: str, log: Path | None = None) -> tuple[float, int]:
    """`dedup-pipeline run` as its own process (Spark start-up and Dagster included): wall
    seconds and peak memory (JVM + Python)."""
    with tempfile.TemporaryDirectory(prefix="bench-dagster-") as home:
        env = {**os.environ, "DAGSTER_HOME": home}
        out = log or Path(home) / "run.log"
        rc, took, peak = run_process(
            [sys.executable, "-m", "dedup_pipeline.cli", "run", "--config", str(cfg),
             "--from", first, "--to", last], env=env, log=str(out))
        if rc != 0:
            raise RuntimeError(f"dedup-pipeline run {first}..{last} failed (exit {rc}):\n"
                               f"{out.read_text()[-4000:]}")
    return took, peak


# ---------------------------------------------------------------------- report
def _median(samples: list[Sample], system: str, history: int, attr: str = "seconds",
            span: int = 3) -> float | None:
    vals = [getattr(s, attr) for s in samples if s.system == system
            and s.history in range(history, history + span)]
    return statistics.median(vals) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def targets(plan: Plan, samples: list[Sample], backfill: dict[str, Any] | None,
            fresh: list[dict[str, Any]] | None = None,
            ui: dict[str, Any] | None = None) -> list[dict]:
    """The targets of docs/design.md "Targets (T)", bounds as in RESULTS.md: T1 the load's growth
    with history, T2 against the naive anti-join, T3 against streaming, T4 against the plain copy,
    T5 the single-run backfill, T6 and T6f peak driver memory, T7a and T7b the index read without
    expiry, T8, T8d and T8ui the deployed run. A target whose inputs were not measured is left out
    or has no value."""
    lo, hi, n = min(plan.points), max(plan.points), plan.span
    a = {p: _median(samples, "pipeline", p, span=n) for p in plan.points}
    out: list[dict] = []

    def add(tid: str, what: str, value: float | None, op: str, bound: float) -> None:
        ok = None if value is None else (value <= bound if op == "<=" else value >= bound)
        out.append({"target": tid, "what": what, "value": value, "bound": f"{op} {bound}",
                    "met": ok})

    add("T1", f"(a) at {hi}h / (a) at {lo}h", _ratio(a[hi], a[lo]), "<=", 1.15)
    add("T2", f"(b) / (a) at {hi}h", _ratio(_median(samples, "naive", hi, span=n), a[hi]), ">=", 2)
    per_hour = []
    by_hour = {(s.system, s.hour): s for s in samples}
    for s in samples:
        if s.system == "streaming" and s.history > 0 and ("pipeline", s.hour) in by_hour:
            per_hour.append(s.seconds / by_hour[("pipeline", s.hour)].seconds)
    add("T3", "(d) / (a), median per hour", round(statistics.median(per_hour), 3)
        if per_hour else None, ">=", 2)
    big_a = [s.seconds for s in samples if s.system == "big_pipeline"]
    big_e = [s.seconds for s in samples if s.system == "big_floor"]
    add("T4", f"(a) / (e) on {plan.big_rows_per_hour:,}-row hours, {plan.big_history}h history",
        _ratio(statistics.median(big_a), statistics.median(big_e)) if big_a and big_e else None,
        "<=", 5.0)  # 5x, stretch 4x, since 2026-11-26 (the spec's first bound was 2.5)
    if backfill:
        add("T5", "single-run backfill per hour / separate run",
            _ratio(backfill["single_run_per_hour"], backfill["separate_run_per_hour"]), "<=",
            round(1 / 3, 3))
    add("T6", f"peak driver memory (a) at {hi}h / at {lo}h",
        _ratio(_median(samples, "pipeline", hi, "peak_rss_bytes", n),
               _median(samples, "pipeline", lo, "peak_rss_bytes", n)), "<=", 1.2)
    peak = {f["history"]: f["peak_rss_bytes"] for f in fresh or []}
    if lo in peak and hi in peak:
        add("T6f", f"peak memory, fresh driver per run (a rerun) at {hi}h / at {lo}h",
            _ratio(peak[hi], peak[lo]), "<=", 1.2)
    g = [s for s in samples if s.system == "deployed" and s.history in range(lo, lo + n)
         and ("pipeline", s.hour) in by_hour]
    if g:
        add("T8", f"(g) fresh run, warm server / (a) warm, same hour, {lo}h",
            round(statistics.median(s.seconds / by_hour[("pipeline", s.hour)].seconds
                                    for s in g), 3), "<=", 2.0)
        d = [by_hour[("streaming", s.hour)].seconds / s.seconds for s in g
             if ("streaming", s.hour) in by_hour]
        if d:
            add("T8d", f"(d) / (g), same hour, {lo}h: as deployed, ahead of streaming",
                round(statistics.median(d), 3), ">=", 1.0)
    if ui:
        add("T8ui", f"UI, one {ui['rows']:,}-row hour, click to success, median s",
            round(ui["wall"]["median"], 2), "<=", 10.0)
    f_hi = [s for s in samples if s.system == "pipeline_noexp" and s.history in range(hi, hi + n)]
    f_lo = [s for s in samples if s.system == "pipeline_noexp" and s.history in range(lo, lo + n)]
    if f_hi and f_lo:
        bpk = statistics.median(s.extra["index_bytes_read"] / max(1, s.extra["index_rows_read"])
                                for s in f_hi)
        add("T7a", f"(f) index bytes read per live key at {hi}h", round(bpk, 2), "<=", 24)
        keys_growth = (statistics.median(s.extra["index_rows_read"] for s in f_hi)
                       / max(1, statistics.median(s.extra["index_rows_read"] for s in f_lo)))
        time_growth = (statistics.median(s.seconds for s in f_hi)
                       / statistics.median(s.seconds for s in f_lo))
        add("T7b", f"(f) time growth {lo}h->{hi}h / live-key growth",
            round(time_growth / keys_growth, 3), "<=", 1.0)
    return out


def table(plan: Plan, samples: list[Sample]) -> str:
    lines = []
    head = f"{'system':<52}" + "".join(f"{f'{p}h s':>9}{'cpu s':>8}{'MiB':>7}" for p in plan.points)
    lines += [head, "-" * len(head)]
    for sysname, label in SYSTEMS.items():
        if sysname == "deployed" or not any(s.system == sysname for s in samples):
            continue  # (g) is timed as a whole process: its own block (deployed_text)
        row = f"{label:<52}"
        for p in plan.points:
            t = _median(samples, sysname, p, span=plan.span)
            c = _median(samples, sysname, p, "cpu_seconds", plan.span)
            m = _median(samples, sysname, p, "peak_rss_bytes", plan.span)
            row += (f"{t:9.2f}{c:8.1f}{m / 2**20:7.0f}" if t is not None else f"{'-':>9}{'':>15}")
        lines.append(row)
    return "\n".join(lines)


def pipeline_io(plan: Plan, samples: list[Sample]) -> str:
    lines = [f"{'(a)/(f) per load':<28}" + "".join(f"{f'{p}h':>28}" for p in plan.points),
             f"{'':<28}" + "".join(f"{'index rows / MB / files out':>28}" for _ in plan.points)]
    for sysname in ("pipeline", "pipeline_noexp"):
        if not any(s.system == sysname for s in samples):
            continue
        row = f"{SYSTEMS[sysname][:28]:<28}"
        for p in plan.points:
            xs = [s for s in samples if s.system == sysname and s.history in range(p, p + plan.span)]
            if xs:
                r = statistics.median(s.extra["index_rows_read"] for s in xs)
                b = statistics.median(s.extra["index_bytes_read"] for s in xs) / 1e6
                f = statistics.median(s.extra["files_written"] for s in xs)
                row += f"{f'{r:,.0f} / {b:.1f} / {f:.0f}':>28}"
        lines.append(row)
    return "\n".join(lines)


def plot(samples: list[Sample], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    for sysname, label in SYSTEMS.items():
        xs = [(s.history, s.seconds) for s in samples if s.system == sysname and s.history > 0]
        if not xs:
            continue
        x, y = zip(*sorted(xs), strict=True)
        if sysname in EVERY_HOUR:
            ax.plot(x, y, label=label, linewidth=1)
        else:
            ax.plot(x, y, "o", label=label, markersize=4)
    ax.set_xlabel("history length (hours loaded before this one)")
    ax.set_ylabel("load time of one hour (s)")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def fresh_text(fresh: list[dict[str, Any]]) -> str:
    """T6f's measurements, one line per history point."""
    if not fresh:
        return ""
    lines = ["(a) rerun by a fresh `dedup-pipeline run` process (Spark start-up and Dagster "
             "included):"]
    lines += [f"  {f['history']:>4}h  {f['hour']}  {f['seconds']:6.1f} s  "
              f"peak {f['peak_rss_bytes'] / 2**20:5.0f} MiB" for f in fresh]
    return "\n".join(lines)


def deployed_text(plan: Plan, samples: list[Sample], fresh: list[dict[str, Any]],
                  ui: dict[str, Any] | None) -> str:
    """T8's measurements side by side: per hour (a) warm in-process, (g) a fresh run process
    against the warm server, (d) streaming's always-on query, the fresh local-mode rerun (T6f);
    then the UI's click-to-success times."""
    lo = min(plan.points)
    by_hour = {(s.system, s.hour): s for s in samples}
    g = sorted((s for s in samples if s.system == "deployed" and s.history in range(lo, lo + plan.span)),
               key=lambda s: s.history)
    lines = []
    if g:
        local = {f["hour"]: f["seconds"] for f in fresh}
        lines += [f"{SYSTEMS['deployed']} (T8), {plan.rows_per_hour:,}-row hours at {lo} h of "
                  "history; (g) loaded every hour before too (its server warmed up on them):",
                  f"  {'hour':<18}{'(a) warm':>10}{'(g) run':>10}{'(g) engine':>12}"
                  f"{'run floor':>11}{'(d) streaming':>15}{'fresh local run':>17}"]
        for s in g:
            a = by_hour.get(("pipeline", s.hour))
            d = by_hour.get(("streaming", s.hour))
            loc = local.get(s.hour)
            lines.append(f"  {s.hour:<18}{a.seconds if a else float('nan'):>9.2f}s"
                         f"{s.seconds:>9.2f}s{s.extra['engine_seconds']:>11.2f}s"
                         f"{s.extra.get('run_floor_seconds', float('nan')):>10.2f}s"
                         f"{d.seconds if d else float('nan'):>14.2f}s"
                         + (f"{loc:>16.2f}s" if loc is not None else f"{'-':>17}"))
        lines.append("  run floor: a `benchmarks.run_floor` process, a fresh run process with no "
                     "load work (Python, Dagster, its instance and the run's events, the Spark "
                     "Connect client and a session); (g) is ahead of (d) only if its engine takes "
                     "under (d) - floor")
    if ui:
        walls = " / ".join(f"{h['wall']:.1f}" for h in ui["per_hour"] if h["measured"])
        lines += [f"UI: one {ui['rows']:,}-row hour materialized from `dagster dev` (warm "
                  f"server), click to SUCCESS: {walls} s (median {ui['wall']['median']:.1f} s; "
                  f"in the queue {ui['queue_wait']['median']:.1f} s, run "
                  f"{ui['run_duration']['median']:.1f} s, of it the load "
                  f"{ui['engine_total']['median']:.1f} s)"]
    return "\n".join(lines)


def results_md(plan: Plan, report: dict[str, Any], tbl: str, io: str, tgt: str,
               png_name: str) -> str:
    m = report["machine"]
    conf = "\n".join(f"- `{k}` = `{v}`" for k, v in report["spark_conf"].items())
    return f"""# Benchmark results

Latest full run: {report["started"]} ({report["minutes"]:.0f} min), produced by

```
{report["command"]}
```

Machine: {m["cpus"]} cores, {m["memory_gib"]:.0f} GiB, {m["platform"]}, Python {m["python"]},
PySpark {m["pyspark"]}, Java {m["java"]}. (a) this pipeline and (d) streaming each ran in a
process and Spark session of their own; (b), (c), (e) and (f) shared the runner's session (all
`local[*]`, warm JVMs, hours in order, one system computing at a time; each step starts with
the hour's landing files in the page cache). Data: `dedup-pipeline generate`,
{plan.rows_per_hour:,} rows/hour of JSONL (UUID keys, fingerprint of two columns, 24h event-time
expiry, 1% in-batch duplicates, 10% replays, 1% conflicts, 5% an hour or more late, 1% over a
day late, 0.4% bad). Times are the median of three consecutive hours at each history length; CPU
is the driver JVM's (executors are its threads in local mode) plus the Python driver's; memory is
the peak resident set of both during the hour, in the system's own process for (a) and (d).
That process has loaded every hour before, so its resident set also carries the JVM's warm-up
(heap growth, code cache, Spark's status store); T6f measures memory as a Dagster run holds it:
the first hour of each point rerun by a `dedup-pipeline run` process of its own (same settings
as (a)'s process), which must leave the same unique rows.

## Per-hour load time

{_md_pre(tbl)}

{_md_pre(io)}

{_fresh_block(report)}{_deployed_block(report)}![load time against history length]({png_name})

## Targets

{_md_pre(tgt)}

Correctness while measuring: {report["correctness"]}

## Settings, every system

{conf}

- (a) and (d), in their own processes: {", ".join(f"`{k}` = `{v}`" for k, v in WORKER_CONF.items())}
  (the runner's session, and (a) in the 1e6-row part: `spark.driver.memory` =
  `{BENCH_CONF["spark.driver.memory"]}`)

- Structured Streaming: {", ".join(f"`{k}` = `{v}`" for k, v in systems.STREAMING_CONF.items())};
  `withWatermark(event_time, 24 hours)`, `dropDuplicatesWithinWatermark([event_id])`, Parquet sink,
  `trigger(availableNow=True)` once per hour, the hour's files hard-linked into its input folder.
- Naive: the same parse as (a), expired records dropped, the first record per key in the batch,
  `LEFT ANTI JOIN` with the full unique table on the key column; the four outputs written.
- Recompute: `dropDuplicates([event_id])` over the unique table so far plus the batch's valid rows,
  the whole table rewritten, partitioned by load hour.
- (b) and (c) read the unique table (a) wrote for the earlier hours (at every measured hour (b)'s
  unique rows are checked equal to (a)'s).
- Backfill (T5): `dedup-pipeline run` processes (Spark start-up and Dagster included); one run over
  {plan.backfill_hours} hours vs one-hour runs.
- As deployed (g), T8: hours 0-{plan.deployed_hours - 1}, each a `dedup-pipeline run --from H --to H`
  process with `SPARK_REMOTE` set to one `dedup-pipeline spark-server` (started for the part,
  {", ".join(f"`{k}` = `{v}`" for k, v in SERVER_CONF.items())}), recording its Dagster run in an
  instance on disk (the demo's `dagster.yaml`); wall time of the whole process, after the hour's
  files are in the page cache. The fresh local run is T6f's rerun (its own JVM).
- UI, T8ui: `dagster dev` (the demo's instance config) with `SPARK_REMOTE` to a warm server; each
  hour launched as the UI's Materialize button sends it (`launchRun` with the partition tag),
  timed from the request to the run's SUCCESS as the UI polls it; the first
  {plan.ui_warmup} hours warm up and are not counted.
"""


def long_results_md(plan: Plan, report: dict[str, Any], tbl: str, io: str, tgts: list[dict],
                    png_name: str) -> str:
    """The long-run section of RESULTS.md (T2 at 720 h), between its markers."""
    measured_tgts = targets_text([t for t in tgts if t["value"] is not None])
    pts = ", ".join(f"{p}" for p in plan.points)
    return f"""{LONG_BEGIN}
## Long run: T2 at {max(plan.points)} hours of history

Run: {report["started"]} ({report["minutes"]:.0f} min), produced by

```
{report["command"]}
```

Same machine, data generator ({plan.rows_per_hour:,} rows/hour) and settings as the full run
above, with only what T2 needs: (a) loads every hour in its own process, and at history lengths
{pts} h (three consecutive hours each, median) the naive anti-join (b) and the plain copy (e)
run in the runner's session; (a) and (b) are checked to keep identical unique rows there.

{_md_pre(tbl)}

{_md_pre(io)}

{_fresh_block(report)}![load time against history length, long run]({png_name})

{_md_pre(measured_tgts)}

Correctness while measuring: {report["correctness"]}
{LONG_END}"""


def _md_pre(text: str) -> str:
    return f"```\n{text}\n```"


def _deployed_block(report: dict[str, Any]) -> str:
    text = report.get("deployed_text") or ""
    return _md_pre(text) + "\n\n" if text else ""


def _fresh_block(report: dict[str, Any]) -> str:
    text = fresh_text(report.get("fresh_driver") or [])
    return _md_pre(text) + "\n\n" if text else ""


def targets_text(tgts: list[dict]) -> str:
    lines = []
    for t in tgts:
        met = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        val = "-" if t["value"] is None else f"{t['value']}"
        lines.append(f"{t['target']:<4} {t['what']:<58} {val:>9}  {t['bound']:<8} {met}")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpus": os.cpu_count(), "memory_gib": mem, "platform": platform.platform(),
            "python": platform.python_version(), "pyspark": pyspark.__version__,
            "java": java.splitlines()[0].split('"')[1] if '"' in java else java.strip()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny data, seconds (the test suite)")
    ap.add_argument("--work", default=str(HERE / "work"), help="data and outputs (large)")
    ap.add_argument("--results", default=str(HERE / "results"), help="JSON and PNG go here")
    ap.add_argument("--rows-per-hour", type=int, help="base scenario rows per hour")
    ap.add_argument("--points", help="history lengths to measure, e.g. 24,72,168")
    ap.add_argument("--hours", type=int,
                    help="shorthand: measure at 24, 72 (168 with --long) and this many hours")
    ap.add_argument("--backfill-hours", type=int, help="hours in the single-run backfill (T5)")
    ap.add_argument("--big-history", type=int, help="history of the 1e6-row scenario (T4)")
    ap.add_argument("--skip", default="",
                    help="parts to skip: big, backfill, fresh, or peers: streaming, "
                         "pipeline_noexp, naive, recompute, floor (comma-separated; a run that "
                         "skips anything leaves RESULTS.md as it is)")
    ap.add_argument("--long", action="store_true",
                    help="the long run for T2: history up to 720 h, (a) every hour, (b) and (e) "
                         "at 24, 168 and 720 h (about 2 h; its own section of RESULTS.md)")
    ap.add_argument("--s3", action="store_true",
                    help="the S3 point only (benchmarks/s3.py): load time per hour on S3 against "
                         "local disk, and object-store requests per load at 24 and 720 h of "
                         "history (--points, --rows-per-hour and --s3-hours apply; `--skip times` or "
                         "`--skip requests`: one part only)")
    ap.add_argument("--s3-hours", type=int, help="hours each system loads in the S3 point")
    ap.add_argument("--peers", action="store_true",
                    help="the lake-native peers only (benchmarks/peers.py): (a) against (h) Spark + "
                         "Delta MERGE and (i) DuckDB + delta-rs MERGE, every hour, at 24 and 168 h "
                         "of history (--points, --rows-per-hour apply)")
    args = ap.parse_args(argv)
    if args.peers:
        from benchmarks import peers
        return peers.main([*(["--quick"] if args.quick else []),
                           *(["--points", args.points] if args.points else []),
                           *(["--rows", str(args.rows_per_hour)] if args.rows_per_hour else []),
                           "--work", str(Path(args.work).resolve() / "peers")])
    if args.s3:
        from benchmarks import s3
        return s3.main(quick=args.quick, work=Path(args.work).resolve(),
                       results=Path(args.results).resolve(), hours=args.s3_hours,
                       rows=args.rows_per_hour, sizes=args.points,
                       skip_times="times" in args.skip.split(","),
                       skip_requests="requests" in args.skip.split(","))
    plan = QUICK if args.quick else FULL
    if args.long:
        plan = replace(plan, every_hour=LONG.every_hour, sampled=LONG.sampled, long=True,
                       **({} if args.quick else {"points": LONG.points}))
    if args.rows_per_hour:
        plan = replace(plan, rows_per_hour=args.rows_per_hour)
    if args.points or args.hours:
        pts = (tuple(int(p) for p in args.points.split(",")) if args.points
               else tuple(sorted({24, 168 if plan.long else 72, args.hours})))
        plan = replace(plan, points=pts, backfill_hours=min(plan.backfill_hours, max(pts)))
    if args.backfill_hours:
        plan = replace(plan, backfill_hours=min(args.backfill_hours, plan.hours - plan.span))
    if args.big_history is not None:
        plan = replace(plan, big_history=args.big_history)
    skip = {s for s in args.skip.split(",") if s} | (LONG_PARTS if plan.long else set())
    unknown = skip - PARTS - set(SYSTEMS) | ({"pipeline"} & skip)
    if unknown:
        ap.error(f"--skip {','.join(sorted(unknown))}: not a part or peer; parts: "
                 f"{', '.join(sorted(PARTS))}; peers: "
                 f"{', '.join(k for k in SYSTEMS if k != 'pipeline')}")
    plan = replace(plan, every_hour=tuple(x for x in plan.every_hour if x not in skip),
                   sampled=tuple(x for x in plan.sampled if x not in skip),
                   fresh=plan.fresh and "fresh" not in skip,
                   deployed=plan.deployed and "deployed" not in skip,
                   ui=plan.ui and "ui" not in skip)
    work = Path(args.work).resolve() / ("long" if plan.long else "")  # keeps the full run's data
    results = Path(args.results).resolve()
    work.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    started = datetime.now(UTC)

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)

    bench = Bench(plan, work, say)
    say(f"plan: {plan.hours} hours x {plan.rows_per_hour:,} rows, history points {plan.points}; "
        f"every hour: {', '.join(plan.every_hour)}; at those points: {', '.join(plan.sampled)}"
        + (f"; skipping: {', '.join(sorted(skip))}" if skip else ""))
    config = bench.landing("landing", plan.hours, plan.rows_per_hour)
    spark = get_session(SparkSettings(conf=BENCH_CONF))
    spark.sparkContext.setLogLevel("ERROR")
    bench.run_hours(spark, config)
    if "big" not in skip:
        bench.run_big(spark)
    backfill = None if "backfill" in skip else bench.run_backfill(config)
    ui = None
    if plan.ui:
        try:
            ui = bench.run_ui()
        except Exception as e:  # noqa: BLE001 - reported with the results, not lost with them
            bench.failures.append(f"the UI part failed: {type(e).__name__}: {e}")

    tgts = targets(plan, bench.samples, backfill, bench.fresh, ui)
    tbl, io, tgt = table(plan, bench.samples), pipeline_io(plan, bench.samples), targets_text(tgts)
    dep = deployed_text(plan, bench.samples, bench.fresh, ui)
    print("\n" + "\n\n".join(b for b in (tbl, io, fresh_text(bench.fresh), dep, tgt) if b)
          + "\n")
    correctness = ("every measured hour: (a) and (b) kept identical unique rows, (g) and (a) too "
                   "where (g) ran, the fresh-driver reruns left the same unique rows; (a), (b), (f) "
                   "and (g) conserved rows" if not bench.failures else "; ".join(bench.failures))
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    report = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "minutes": (time.perf_counter() - t_start) / 60,
        "command": "./scripts/bench.sh " + " ".join(argv if argv is not None else sys.argv[1:]),
        "plan": asdict(plan), "machine": machine(),
        "spark_conf": {"spark.master": "local[*]", **BASE_CONF,
                       **{k: v for k, v in BENCH_CONF.items() if k != "spark.driver.memory"}},
        "worker_conf": WORKER_CONF,
        "samples": [asdict(s) for s in bench.samples], "backfill": backfill,
        "fresh_driver": bench.fresh, "ui": ui,
        "targets": tgts, "correctness": correctness, "failures": bench.failures,
        "deployed_text": dep,
    }
    (results / f"{stamp}.json").write_text(json.dumps(report, indent=1, default=str))
    png = results / f"{stamp}.png"
    plot(bench.samples, png, f"{plan.rows_per_hour:,} rows/hour, {report['machine']['cpus']} "
         f"cores, local Spark ({stamp})")
    say(f"wrote {results / f'{stamp}.json'} and {png}")
    results_md_path = HERE / "RESULTS.md"
    previous = results_md_path.read_text() if results_md_path.exists() else ""
    if complete_run(plan, skip):
        shutil.copy(png, HERE / "load_time_vs_history.png")
        results_md_path.write_text(with_hand_section(with_long_section(
            results_md(plan, report, tbl, io, tgt, "load_time_vs_history.png"),
            long_section(previous)), hand_section(previous)))
        say(f"wrote {results_md_path}")
    elif complete_long_run(plan):
        shutil.copy(png, HERE / "load_time_vs_history_long.png")
        results_md_path.write_text(with_long_section(previous, long_results_md(
            plan, report, tbl, io, tgts, "load_time_vs_history_long.png")))
        say(f"wrote the long-run section of {results_md_path}")
    elif not plan.quick:
        say("a partial run (fewer history points or parts skipped): RESULTS.md left as it is")
    return exit_status(bench.failures)


if __name__ == "__main__":
    raise SystemExit(main())
