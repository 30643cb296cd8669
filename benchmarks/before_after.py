"""The hourly load of two checkouts of the repository, before and after a change, side by side
in one run on the same landing files.

    git worktree add ../before <commit>       # the code before the change, beside this checkout
    .venv/bin/python -m benchmarks.before_after --before ../before --after .
    .venv/bin/python -m benchmarks.before_after --before ../before --after . --quick  # smoke run

The full run takes about 50 min on 2 idle cores (171 1e5-row hours and 27 1e6-row hours loaded by
each version), plus about 10 min to generate the landing files unless a full run of run.py left
them in benchmarks/work/ (~15 GB there with both versions' outputs). `--quick` (history 2 and 4 h
of 1,000-row hours, T4 at 5,000 rows) takes a few minutes. The runner (the data, (e), the report)
is the code it is started from; each version's load is its checkout's.

Each checkout's `run_load` runs in a process and JVM of its own (`benchmarks/checkout_worker.py`,
PYTHONPATH=<checkout>, (a)'s settings of the main benchmark) and builds its own output history
(`out/before_after/<version>` beside the landing files: the two may write different formats),
loading every hour in order. The two alternate within each hour, never computing at once: even
hours before then after, odd hours after then before, so that the machine's drift hits both alike;
every load starts with the hour's files in the page cache. At the measured hours (three
consecutive hours at each history length of `--history`, 1e5 rows each, and the T4 scenario: a
1e6-row hour at 24 h of history) the runner's own session also times the plain copy (e) of the
same hour (`systems.floor_copy`). The data is `benchmarks/run.py`'s (same generator, seed and
folders: a full run's landing files are reused).

It prints, per measured point and version, the median wall seconds of `run_load`, the ratio
after / before (of the medians, and the median of the per-hour ratios), (a) / (e), and each stage
of the load's `seconds` (the steps after the commit marked) as seconds and as a share of the
load, and writes `benchmarks/results/before_after-<stamp>.json`. Both versions must report the
same counts for every hour (rows in, unique, duplicates, expired, rejected) and conserve rows:
exit status 1 otherwise, or if a part stopped on an error (what it measured until then is still
reported). A slower "after" is reported, never an error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from benchmarks import systems
from benchmarks.data import input_paths, landing
from benchmarks.probe import exit_status, measured, read_answer, save_report
from benchmarks.run import BENCH_CONF, machine
from benchmarks.worker import WORKER_CONF, dataset_from_spec
from dedup_pipeline.engine.session import SparkSettings, get_session
from dedup_pipeline.hours import HOUR, format_hour, parse_hour

HERE = Path(__file__).resolve().parent
VERSIONS = ("before", "after")
COUNTS = ("rows_in", "unique", "duplicates", "expired", "rejected", "conflicts")
# the stages recorded after this one ran after the hour was committed (publish, housekeeping)
COMMIT_STAGE = "commit"


@dataclass(frozen=True)
class Plan:
    history: tuple[int, ...] = (24, 168)  # history lengths measured, `per_point` hours each
    rows: int = 100_000
    big_rows: int = 1_000_000  # T4: one 1e6-row hour at `big_history` hours of history
    big_history: int = 24
    per_point: int = 3
    big: bool = True
    memory: str = WORKER_CONF["spark.driver.memory"]  # each worker's driver, 1e5-row hours
    big_memory: str = BENCH_CONF["spark.driver.memory"]  # and at 1e6 rows (as run.py's T4)
    quick: bool = False

    @property
    def hours(self) -> int:
        return max(self.history) + self.per_point

    def measured(self) -> set[int]:
        """The hour indexes measured (those of every history length; they may overlap)."""
        return {p + k for p in self.history for k in range(self.per_point)}


QUICK = Plan(history=(2, 4), rows=1_000, big_rows=5_000, big_history=2, quick=True)


@dataclass
class Sample:
    part: str  # "base" (1e5-row hours) or "big" (T4)
    version: str  # "before", "after" or "floor" (the copy (e))
    hour: str
    history: int  # hours loaded before this one
    measured: bool  # an hour of a measured point: (e) ran too
    wall: float
    cpu: float
    order: int = 0  # 0: this version loaded the hour first, 1: second
    record: dict[str, Any] = field(default_factory=dict)


class Checkout:
    """The runner's handle on one checkout's worker process."""

    def __init__(self, version: str, root: Path, spec: dict[str, Any], log: Path):
        self.version, self.root, self.log = version, root, log
        spec_path = log.with_suffix(".json")
        spec_path.write_text(json.dumps(spec))
        env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}  # a local JVM each
        env["PYTHONPATH"] = str(root)  # the checkout's package, nothing of the runner's tree
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(HERE / "checkout_worker.py"), str(spec_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
            cwd=root, env=env)
        ready = self._answer("starting")["ready"]
        loaded = Path(ready["dedup_pipeline"]).resolve()
        if not loaded.is_relative_to(root):
            self.close()
            raise RuntimeError(f"the {version} worker imported {loaded}, not {root}'s package")

    def _answer(self, what: str) -> dict[str, Any]:
        return read_answer(self.proc, self.version, what, self.log)

    def load(self, key: str, inputs: list[str]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"hour": key, "inputs": inputs}) + "\n")
        self.proc.stdin.flush()
        return self._answer(f"at {key}")

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


class BeforeAfter:
    def __init__(self, plan: Plan, checkouts: dict[str, Path], work: Path, say: Any):
        self.plan, self.checkouts, self.work, self.say = plan, checkouts, work, say
        self.samples: list[Sample] = []
        self.failures: list[str] = []

    def run_part(self, spark: Any, part: str, config: Path, hours: int, at: set[int],
                 memory: str) -> None:
        """Load `hours` hours with both checkouts, alternating; (e) at the measured hours."""
        raw = yaml.safe_load(config.read_text())
        logs = self.work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        conf = {**WORKER_CONF, "spark.driver.memory": memory}
        specs = {}
        for v in VERSIONS:
            d = {**raw["datasets"][0], "output": f"out/before_after/{v}"}
            shutil.rmtree(config.parent / d["output"], ignore_errors=True)
            specs[v] = {"config": str(config), "dataset": d, "conf": conf,
                        "name": f"bench-{v}-{part}"}
        ds = dataset_from_spec(specs["before"])  # the runner's view: landing files, (e)'s schema
        start = parse_hour(ds.start)
        scratch = str(config.parent / "out" / "before_after" / "floor")
        workers: dict[str, Checkout] = {}
        try:
            for v in VERSIONS:
                workers[v] = Checkout(v, self.checkouts[v], specs[v], logs / f"{v}-{part}.log")
            for i in range(hours):
                hour = start + i * HOUR
                key, inputs, measure = format_hour(hour), input_paths(ds, hour), i in at
                order = VERSIONS if i % 2 == 0 else VERSIONS[::-1]
                line = f"{part} h{i:>4} {key}:"
                got = {}
                for n, v in enumerate(order):
                    a = workers[v].load(key, inputs)
                    got[v] = a["record"]
                    self.samples.append(Sample(part, v, key, i, measure, round(a["wall"], 3),
                                               round(a["cpu"], 3), n, a["record"]))
                    line += f" {v} {a['wall']:6.2f}s"
                if i == 0:  # the runner's session warms up on the copy: (e) is never cold
                    systems.floor_copy(spark, ds, hour, scratch)
                if measure:
                    with measured(spark, inputs) as ce:
                        systems.floor_copy(spark, ds, hour, scratch)
                    self.samples.append(Sample(part, "floor", key, i, True,
                                               round(ce.seconds, 3), round(ce.cpu_seconds, 3)))
                    line += f" | (e) {ce.seconds:5.2f}s"
                line += self.check(key, got)
                self.say(line)
        finally:
            for w in workers.values():
                w.close()

    def check(self, key: str, got: dict[str, dict[str, Any]]) -> str:
        """Both versions conserve rows and agree on every count of the hour."""
        bad = []
        for v, r in got.items():
            if r["rows_in"] != r["unique"] + r["duplicates"] + r["expired"] + r["rejected"]:
                bad.append(f"{key}: {v} broke conservation")
        differ = [c for c in COUNTS if c in got["before"] and c in got["after"]
                  and got["before"][c] != got["after"][c]]
        if differ:
            bad.append(f"{key}: before and after differ in "
                       + ", ".join(f"{c} ({got['before'][c]} vs {got['after'][c]})"
                                   for c in differ))
        self.failures += bad
        return " | counts differ!" if bad else ""


# ---------------------------------------------------------------------- report
def _stage_split(seconds: dict[str, float]) -> tuple[list[str], list[str]]:
    """The record's stages in order, split into those up to the commit and those after it."""
    names = [k for k in seconds if k != "total"]
    if COMMIT_STAGE in names:
        cut = names.index(COMMIT_STAGE) + 1
        return names[:cut], names[cut:]
    return names, []


def summarize(samples: list[Sample], part: str, point: int, per_point: int) -> dict[str, Any]:
    """One measured point (the `per_point` hours from `point` hours of history on): per version
    the medians, the stages' seconds and shares; the ratios."""
    at = [s for s in samples if s.part == part and point <= s.history < point + per_point]
    floor = [s.wall for s in at if s.version == "floor"]
    e = statistics.median(floor) if floor else None
    out: dict[str, Any] = {"part": part, "history": point,
                           "hours": sorted({s.hour for s in at}), "floor_seconds": e,
                           "versions": {}}
    for v in VERSIONS:
        xs = [s for s in at if s.version == v]
        if not xs:
            continue
        wall = statistics.median(s.wall for s in xs)
        total = sum(s.record["seconds"].get("total", 0.0) for s in xs)
        before_commit, after_commit = _stage_split(xs[0].record["seconds"])
        stages = {}
        for name in before_commit + after_commit:
            vals = [s.record["seconds"].get(name, 0.0) for s in xs]
            stages[name] = {"median_seconds": round(statistics.median(vals), 3),
                            "share": round(sum(vals) / total, 4) if total else None,
                            "after_commit": name in after_commit}
        groups = {}
        for group, names in (("up_to_commit", before_commit), ("after_commit", after_commit)):
            vals = [sum(s.record["seconds"].get(n, 0.0) for n in names) for s in xs]
            groups[group] = {"median_seconds": round(statistics.median(vals), 3),
                             "share": round(sum(vals) / total, 4) if total else None}
        out["versions"][v] = {
            "median_seconds": round(wall, 3),
            "per_hour_seconds": [s.wall for s in sorted(xs, key=lambda s: s.history)],
            "median_cpu_seconds": round(statistics.median(s.cpu for s in xs), 3),
            "median_record_total": round(statistics.median(
                s.record["seconds"].get("total", 0.0) for s in xs), 3),
            "stages": stages,
            "groups": groups,
            "vs_floor": round(wall / e, 3) if e else None,
        }
    vs = out["versions"]
    if all(v in vs for v in VERSIONS):
        out["after_over_before"] = round(vs["after"]["median_seconds"]
                                         / vs["before"]["median_seconds"], 3)
        by_hour = {(s.version, s.hour): s.wall for s in at}
        paired = [by_hour[("after", h)] / by_hour[("before", h)] for h in out["hours"]
                  if ("after", h) in by_hour and ("before", h) in by_hour]
        out["after_over_before_paired"] = round(statistics.median(paired), 3) if paired else None
    return out


def _label(p: dict[str, Any], plan: Plan) -> str:
    rows = plan.big_rows if p["part"] == "big" else plan.rows
    return f"{'T4 ' if p['part'] == 'big' else ''}{p['history']}h x {rows:,}"


def table(points: list[dict[str, Any]], plan: Plan, tolerance: float) -> str:
    head = (f"{'point':<22}{'before s':>10}{'after s':>10}{'after/before':>14}{'paired':>8}"
            f"{'(e) s':>8}{'(a)/(e) before':>16}{'after':>7}  verdict")
    lines = [head, "-" * len(head)]
    for p in points:
        vs = p["versions"]
        b, a = vs.get("before", {}), vs.get("after", {})
        r = p.get("after_over_before")
        verdict = ("-" if r is None else "not slower" if r <= 1 + tolerance
                   else f"SLOWER by {100 * (r - 1):.0f}%")
        lines.append(
            f"{_label(p, plan):<22}{_num(b.get('median_seconds'), 10, 2)}"
            f"{_num(a.get('median_seconds'), 10, 2)}{_num(r, 14, 3)}"
            f"{_num(p.get('after_over_before_paired'), 8, 3)}{_num(p['floor_seconds'], 8, 2)}"
            f"{_num(b.get('vs_floor'), 16, 2)}{_num(a.get('vs_floor'), 7, 2)}  {verdict}")
    lines.append(f"(medians of {plan.per_point} hours; paired: the median of the per-hour "
                 f"after/before ratios; verdict: after/before <= {1 + tolerance:.2f})")
    return "\n".join(lines)


def stages_table(p: dict[str, Any], plan: Plan) -> str:
    vs = p["versions"]
    names: list[str] = []
    for v in VERSIONS:
        names += [n for n in vs.get(v, {}).get("stages", {}) if n not in names]
    after = {n for v in VERSIONS for n, s in vs.get(v, {}).get("stages", {}).items()
             if s["after_commit"]}
    head = (f"{'stage, ' + _label(p, plan):<34}{'before s':>10}{'share':>8}"
            f"{'after s':>10}{'share':>8}")
    def row(label: str, part: str, key: str) -> str:
        """One line: a stage (or group) of both versions, seconds and share of the load."""
        cells = ""
        for v in VERSIONS:
            st = vs.get(v, {}).get(part, {}).get(key)
            cells += (f"{_num(st['median_seconds'], 10, 3)}{_pct(st['share'])}" if st
                      else f"{'-':>10}{'-':>8}")
        return f"{label:<34}{cells}"

    lines = [head, "-" * len(head)]
    lines += [row(("  after commit: " if n in after else "  ") + n, "stages", n) for n in names]
    lines += [row("  " + label, "groups", group)
              for group, label in (("up_to_commit", "up to the commit, in all"),
                                   ("after_commit", "after the commit, in all"))]
    row = f"{'  the record total':<34}"
    for v in VERSIONS:
        row += f"{_num(vs.get(v, {}).get('median_record_total'), 10, 3)}{'':>8}"
    lines.append(row)
    return "\n".join(lines)


def _num(x: float | None, width: int, digits: int) -> str:
    return f"{x:>{width}.{digits}f}" if x is not None else f"{'-':>{width}}"


def _pct(x: float | None) -> str:
    return f"{100 * x:>7.1f}%" if x is not None else f"{'-':>8}"


def checkout_info(root: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

    return {"path": str(root), "commit": git("rev-parse", "HEAD"),
            "describe": git("log", "-1", "--format=%h %s"),
            "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks.before_after",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="checkout of the code before the change")
    ap.add_argument("--after", required=True, help="checkout of the code after the change")
    ap.add_argument("--history", help="history lengths measured (default 24,168)")
    ap.add_argument("--rows", type=int, help="rows per hour (default 100000)")
    ap.add_argument("--big-rows", type=int, help="rows per hour of the T4 scenario (1000000)")
    ap.add_argument("--big-history", type=int, help="history of the T4 scenario (24)")
    ap.add_argument("--skip-big", action="store_true", help="no T4 scenario")
    ap.add_argument("--quick", action="store_true",
                    help="tiny data (history 2,4 at 1,000 rows; T4 at 5,000): a smoke run")
    ap.add_argument("--tolerance", type=float, default=0.05,
                    help="after/before above 1 + this is reported as slower (default 0.05)")
    ap.add_argument("--work", help="landing files and outputs (default benchmarks/work, shared "
                                   "with run.py; --quick: benchmarks/work/before_after-quick)")
    args = ap.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    if args.history:
        plan = replace(plan, history=tuple(sorted({int(h) for h in args.history.split(",")})))
    if args.rows:
        plan = replace(plan, rows=args.rows)
    if args.big_rows:
        plan = replace(plan, big_rows=args.big_rows)
    if args.big_history is not None:
        plan = replace(plan, big_history=args.big_history)
    if args.skip_big:
        plan = replace(plan, big=False)
    checkouts = {v: Path(getattr(args, v)).resolve() for v in VERSIONS}
    for v, root in checkouts.items():
        if not (root / "dedup_pipeline" / "engine" / "load.py").is_file():
            ap.error(f"--{v} {root}: not a checkout of this repository")
    work = Path(args.work or HERE / "work" / ("before_after-quick" if plan.quick else ""))
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    started = datetime.now(UTC)

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)

    info = {v: checkout_info(root) for v, root in checkouts.items()}
    for v in VERSIONS:
        say(f"{v}: {info[v]['path']} at {info[v]['describe'] or '?'}"
            + (" (with uncommitted changes)" if info[v]["uncommitted_changes"] else ""))
    say(f"plan: {plan.hours} hours x {plan.rows:,} rows, measured at {plan.history} h of history"
        + (f"; T4: {plan.big_history + plan.per_point} hours x {plan.big_rows:,} rows"
           if plan.big else ""))
    config = landing(work / "landing", plan.hours, plan.rows, say)
    big_config = (landing(work / "landing_big", plan.big_history + plan.per_point,
                          plan.big_rows, say) if plan.big else None)
    spark = get_session(SparkSettings(conf=BENCH_CONF, app_name="bench-before-after"))
    spark.sparkContext.setLogLevel("ERROR")
    bench = BeforeAfter(plan, checkouts, work, say)
    parts = [("base", config, plan.hours, plan.measured(), plan.memory)]
    if big_config is not None:
        parts.append(("big", big_config, plan.big_history + plan.per_point,
                      {plan.big_history + k for k in range(plan.per_point)},
                      plan.big_memory))
    for part, cfg, hours, at, memory in parts:
        try:
            bench.run_part(spark, part, cfg, hours, at, memory)
        except Exception as e:  # noqa: BLE001 - what was measured is still reported
            bench.failures.append(f"the {part} part stopped: {e}")
            say(f"the {part} part stopped: {str(e)[:2000]}")
    spark.stop()

    points = [summarize(bench.samples, "base", p, plan.per_point) for p in plan.history]
    if plan.big:
        points.append(summarize(bench.samples, "big", plan.big_history, plan.per_point))
    text = "\n\n".join([table(points, plan, args.tolerance),
                        *(stages_table(p, plan) for p in points)])
    print("\n" + text + "\n")
    report = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "minutes": round((time.perf_counter() - t_start) / 60, 1),
        "command": "python -m benchmarks.before_after "
                   + " ".join(argv if argv is not None else sys.argv[1:]),
        "plan": asdict(plan), "checkouts": info, "machine": machine(),
        "worker_conf": WORKER_CONF, "runner_conf": BENCH_CONF, "tolerance": args.tolerance,
        "points": points, "samples": [asdict(s) for s in bench.samples],
        "failures": bench.failures, "table": text,
    }
    out = save_report("before_after", report)
    say(f"wrote {out}")
    return exit_status(bench.failures)


if __name__ == "__main__":
    raise SystemExit(main())
