"""Soak the landing sensor under a real `dagster-daemon` (not a CI test; CI runs a short version,
dedup_pipeline_tests/test_soak.py).

The demo's instance (queued runs, one run per dataset) plus the deploy's retry policy for dead run
workers (run monitoring, run retries), the demo's sensors and schedules as shipped (landing sensor,
index recovery sensor and failure summary on; the hourly and reconcile schedules off), a dataset
whose index repairs itself (`on_damaged_index: rebuild`). For `--minutes` minutes a new complete
hour lands every `--every` seconds; a quarter of the way in a file lands late in a loaded hour, at
half way the whole index is deleted, at three quarters a running load is killed (SIGKILL to its
worker and its Spark). Then it waits for the last hour to load, runs each refusal and failure a
user meets (a rerun refused because later hours are loaded, the dataset lock, a broken contract, a
run without a partition, a load that fails in Spark, a cancelled run) on the same instance, and
prints the figures:

- hours landed, hours committed, successful runs that loaded each hour (must be exactly 1),
- landing-sensor ticks by status, skipped ticks without a reason, failed ticks (must be 0),
- tick errors in the daemon log (must be 0), check runs, the killed run and its retry,
- the refusals and failures run, and whether the UI's partition status of every hour (the
  webserver's GraphQL: `assetPartitionStatuses` of each output, each check's `partitionStatuses`)
  equals the commit records (must).

Exit code 0 when every bar holds. Run as a module from the repository (as a file, its directory's
`profile.py` would shadow the standard library's):

    .venv/bin/python -m benchmarks.soak --minutes 30 --every 120
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.scheduler.instigation import InstigatorType, TickStatus

from dedup_pipeline.cli.runs import DEMO_INSTANCE_YAML
from dedup_pipeline.hours import HOUR, format_hour, format_tag, hour_range, to_tag
from dedup_pipeline.orchestration.names import (
    PARTITION,
    RANGE_END,
    RANGE_START,
    recovery_sensor_name,
)
from dedup_pipeline_tests.daemon_walk import DATASET, Walk

RETRIES = """\
run_retries:
  enabled: true
  max_retries: 2
  retry_on_asset_or_op_failure: false
run_monitoring:
  enabled: true
  start_timeout_seconds: 300
  poll_interval_seconds: 10
"""
TICK_ERROR = ("Error occurred during the execution of evaluation_fn", "IntegrityError",
              "UniqueViolation")


@dataclass
class Figures:
    hours_landed: int = 0
    hours_committed: int = 0
    loads_per_hour: Counter[str] = field(default_factory=Counter)
    ticks: Counter[str] = field(default_factory=Counter)
    recovery_ticks: Counter[str] = field(default_factory=Counter)
    skipped_without_reason: int = 0
    failed_ticks: int = 0
    daemon_tick_errors: list[str] = field(default_factory=list)
    check_runs: int = 0
    killed_run: str | None = None
    killed_status: str | None = None  # the killed run's final status (FAILURE when it was killed)
    retries_of_killed: int = 0
    refusals: dict[str, str] = field(default_factory=dict)  # kind -> the run's error class
    ui_truth: str = "not checked"  # "equal" or the first difference
    failures: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        return not self.failures

    def report(self) -> str:
        bad = {h: n for h, n in self.loads_per_hour.items() if n != 1}
        return "\n".join([
            f"hours landed {self.hours_landed}, committed {self.hours_committed}; hours loaded by "
            f"other than exactly one successful run: {bad or 'none'}",
            f"landing-sensor ticks: {dict(self.ticks)}; skipped without a reason: "
            f"{self.skipped_without_reason}; failed: {self.failed_ticks}",
            f"recovery-sensor ticks: {dict(self.recovery_ticks)}",
            f"tick errors in the daemon log: {len(self.daemon_tick_errors)}",
            f"input-check runs: {self.check_runs}; killed run: {self.killed_run} "
            f"({self.killed_status}; retries: {self.retries_of_killed})",
            f"refusals and failures run: {self.refusals or 'none'}",
            f"UI partition status of every hour vs the commit records: {self.ui_truth}",
            "RESULT: " + ("PASS" if self.ok() else "FAIL: " + "; ".join(self.failures)),
        ])


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                out.append(int(d.name))
    return out


def kill_run(inst: dg.DagsterInstance, run_id: str) -> list[int]:
    """SIGKILL the run's worker (the pid its log names: "Started process for run (pid: N)") and
    everything below it (its Spark JVM): a node lost mid-load."""
    roots: set[int] = set()
    for rec in inst.all_logs(run_id):
        m = re.search(r"\(pid: (\d+)\)", rec.message or "")
        if m:
            roots.add(int(m.group(1)))
    killed, todo = [], sorted(roots)
    while todo:
        pid = todo.pop()
        todo += _children(pid)
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def soak(root: Path, minutes: float, every: float, log: Any = print,
         check_every: float = 30) -> Figures:
    n_hours = max(4, int(minutes * 60 // every) + 1)
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = now - (n_hours + 1) * HOUR  # every hour landed is a complete (past) hour
    w = Walk(root, start_hour=start, extra_config={"on_damaged_index": "rebuild"},
             check_every=check_every)
    (w.home / "dagster.yaml").write_text(DEMO_INSTANCE_YAML + RETRIES)
    with dg.DagsterInstance.from_config(str(w.home)):
        pass  # create the storages before the daemon's processes race to
    hours = [start + i * HOUR for i in range(n_hours)]
    fig = Figures()
    events = {n_hours // 4: "late", n_hours // 2: "index", (3 * n_hours) // 4: "kill"}
    w.start_daemon()
    t0 = time.monotonic()
    try:
        with w.instance() as inst:
            for i, h in enumerate(hours):
                due = t0 + i * every
                while time.monotonic() < due:
                    time.sleep(1)
                w.land(h, [f"e{i}-{j}" for j in range(20)] + [f"e{max(0, i - 1)}-0"])
                fig.hours_landed += 1
                log(f"{time.monotonic() - t0:6.0f}s landed {format_hour(h)}")
                what = events.get(i)
                if what == "late":
                    loaded = w.wait("a loaded hour", lambda: sorted(w.committed()), timeout=600)
                    late = datetime.strptime(loaded[-1], "%Y-%m-%d-%H").replace(tzinfo=UTC)
                    w.land(late, [f"late-{i}"], name="part-late.jsonl")
                    log(f"  late file in {format_hour(late)}")
                elif what == "index":
                    w.delete_index()
                    log("  index deleted")
                elif what == "kill":
                    missed: set[str] = set()  # runs that ended before the kill reached them

                    def started(missed: set[str] = missed) -> dg.DagsterRun | None:
                        for r in reversed(w.load_runs(inst)):  # the newest load first
                            if r.run_id in missed or r.status != dg.DagsterRunStatus.STARTED:
                                continue
                            logs = inst.all_logs(r.run_id)
                            if any("(pid: " in (e.message or "") for e in logs) and not any(
                                    e.dagster_event_type == dg.DagsterEventType.STEP_SUCCESS
                                    for e in logs):
                                return r
                        return None

                    while not fig.killed_run:
                        run = w.wait("a load to start", started, timeout=600)
                        time.sleep(3)  # into its start-up (Spark takes 20-30 s here)
                        pids = kill_run(inst, run.run_id)
                        if pids:
                            fig.killed_run = run.run_id
                            log(f"  killed run {run.run_id} ({len(pids)} processes)")
                        else:
                            missed.add(run.run_id)
                            log(f"  run {run.run_id} ended before the kill; the next one")
            last = to_tag(hours[-1])
            w.wait("the last hour to load", lambda: last in w.committed(),
                   timeout=max(900, every * 4))
            # a few more ticks after the end: quiet ones must skip with a reason
            time.sleep(max(15.0, 1.5 * check_every))
            fig.hours_committed = len(w.committed())
            runs = [r for r in w.load_runs(inst, by_sensor=False)
                    if r.status == dg.DagsterRunStatus.SUCCESS]
            for r in runs:
                first, end = r.tags.get(RANGE_START), r.tags.get(RANGE_END)
                if not (first and end):  # a one-hour tick's run: a single partition, no range
                    first = end = r.tags.get(PARTITION)
                if first and end:
                    for h in hour_range(first, end):
                        fig.loads_per_hour[format_hour(h)] += 1
            for h in hours:
                fig.loads_per_hour.setdefault(format_hour(h), 0)
            ticks = w.ticks(inst)
            fig.ticks = Counter(t.status.value for t in ticks)
            fig.skipped_without_reason = sum(1 for t in ticks if t.status == TickStatus.SKIPPED
                                             and not t.skip_reason)
            fig.failed_ticks = sum(1 for t in ticks if t.status == TickStatus.FAILURE)
            fig.recovery_ticks = Counter(t.status.value for t in w.ticks(
                inst, recovery_sensor_name(DATASET), InstigatorType.SENSOR))
            fig.check_runs = len(w.check_runs(inst))
            if fig.killed_run:
                killed = inst.get_run_by_id(fig.killed_run)
                fig.killed_status = killed.status.value if killed else None
                fig.retries_of_killed = sum(
                    1 for r in inst.get_runs() if r.tags.get("dagster/parent_run_id") == fig.killed_run)
            refusals_and_failures(w, inst, fig, log)
    finally:
        w.stop()
    text = w.log.read_text(errors="replace") if w.log.exists() else ""
    fig.daemon_tick_errors = [ln for ln in text.splitlines() if any(e in ln for e in TICK_ERROR)]
    if fig.hours_committed != n_hours:
        fig.failures.append(f"{fig.hours_committed} of {n_hours} hours committed")
    if any(n != 1 for n in fig.loads_per_hour.values()):
        fig.failures.append("an hour was not loaded by exactly one successful run")
    if fig.failed_ticks or fig.recovery_ticks.get("FAILURE"):
        fig.failures.append("failed sensor ticks")
    if fig.skipped_without_reason:
        fig.failures.append("skipped ticks without a reason")
    if fig.daemon_tick_errors:
        fig.failures.append(f"{len(fig.daemon_tick_errors)} tick errors in the daemon log")
    if fig.ui_truth != "equal":
        fig.failures.append(f"the UI's partition status differs from the commit records: {fig.ui_truth}")
    return fig


def refusals_and_failures(w: Walk, inst: dg.DagsterInstance, fig: Figures, log: Any) -> None:
    """Each refusal and failure on the soaked instance (in this process, as the CLI runs), then
    the UI's partition status of every hour compared with the commit records."""
    import contextlib

    import yaml

    from dedup_pipeline.config import load_config
    from dedup_pipeline.engine.core import hooks
    from dedup_pipeline.engine.core.lock import Lock
    from dedup_pipeline.engine.core.storage import Storage
    from dedup_pipeline.orchestration.definitions import build_definitions
    from dedup_pipeline.orchestration.names import load_job_name
    from dedup_pipeline.orchestration.runner import run_range
    from dedup_pipeline_tests.test_ui_status import UI

    cfg = load_config(str(w.config))
    ds = cfg.datasets[0]
    loaded = sorted(w.committed())
    first, last = format_tag(loaded[0]), format_tag(loaded[-1])

    def record(kind: str, res: Any) -> None:
        fig.refusals[kind] = "succeeded?!" if res.success else (res.error or "").split(":")[0]
        log(f"  {kind}: {fig.refusals[kind]}")

    record("later hours loaded", run_range(cfg, ds.name, first, first, inst))
    with Lock(Storage(ds.output), owner="soak: another writer"):
        record("lock", run_range(cfg, ds.name, last, last, inst))
    raw = yaml.safe_load(w.config.read_text())
    raw["datasets"][0]["key"] = ["event_id", "event_time"]
    broken = w.root / "broken.yaml"
    broken.write_text(yaml.safe_dump(raw, sort_keys=False))
    record("contract", run_range(load_config(str(broken)), ds.name, last, last, inst))
    job = build_definitions(cfg).resolve_job_def(load_job_name(ds.name))
    res = job.execute_in_process(instance=inst, raise_on_error=False)
    fig.refusals["no partition"] = "failed" if not res.success else "succeeded?!"
    class FailInSpark(hooks.Hooks):
        """A Spark job that fails while the load writes its outputs."""

        def frame(self, df: Any, what: str, stale: Any = None) -> Any:
            df.sparkSession.sql("select raise_error('soak: injected failure of a Spark job')").collect()
            return df

    previous = hooks.install(FailInSpark())
    try:
        record("Spark failure of a rerun", run_range(cfg, ds.name, last, last, inst))
    finally:
        hooks.install(previous)
    # the failed rerun withdrew the hour's record (it is Failed, truly); the fix reloads it
    if not run_range(cfg, ds.name, last, last, inst).success:
        fig.failures.append(f"the reload of {last} after the Spark failure failed")
    # a run of the code location (as the UI or the sensor launches one), cancelled before its
    # step: the daemon's run-canceled sensor sees it (an in-process run has no code location)
    launched = next(r for r in w.load_runs(inst) if r.remote_job_origin is not None)
    run = inst.create_run_for_job(job, tags={PARTITION: last},
                                  remote_job_origin=launched.remote_job_origin,
                                  job_code_origin=launched.job_code_origin)
    inst.report_run_canceled(run)
    fig.refusals["cancelled"] = "cancelled"
    ui = UI(inst, w.root, cfg)

    def truth() -> str:
        try:
            ui.assert_truth("soak")
            return "equal"
        except AssertionError as e:
            return str(e).splitlines()[0][:500]

    deadline = time.monotonic() + 120  # the daemon's cancel sensor restates the cancelled run
    fig.ui_truth = truth()
    while fig.ui_truth != "equal" and time.monotonic() < deadline:
        time.sleep(5)
        fig.ui_truth = truth()
    with contextlib.suppress(Exception):
        log(f"  UI partition status vs commit records: {fig.ui_truth}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--every", type=float, default=120, help="seconds between new hours")
    ap.add_argument("--check-every", type=float, default=30,
                    help="the landing sensor's interval, seconds (landing.check_every)")
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir, kept)")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="dedup-soak-"))
    print(f"soak in {root}: {args.minutes:g} min, a new hour every {args.every:g} s")
    fig = soak(root, args.minutes, args.every, check_every=args.check_every)
    print(fig.report())
    return 0 if fig.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
