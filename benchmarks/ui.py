"""The UI target T8ui: one 2,000-row hour materialized from the `dagster dev` UI in <= 10 s.

    .venv/bin/python -m benchmarks.ui [--rows 2000] [--warmup 2] [--measured 3] [--remote sc://…]

The topology of the README's UI section: a warm Spark Connect server (`dedup-pipeline
spark-server`, started here unless `--remote` names a running one) and `dagster dev -w
workspace.yaml` with SPARK_REMOTE, on a DAGSTER_HOME with the demo's instance config (what
`dedup-pipeline demo` writes: queued runs, a pool limit of one run per dataset). Generates
`warmup + measured` hours ending at the last complete hour (the UI offers partitions up to now; no
`_SUCCESS` markers, so the landing sensor launches nothing), then, hour by hour in order, sends
what the UI's "Materialize" button sends for one partition (`launchRun` of `__ASSET_JOB`, the
dataset's outputs and checks, tag `dagster/partition`) and polls the run every 0.2 s until it ends.

Per hour: the wall time from sending `launchRun` to seeing SUCCESS (what the user waits for); from
the run's own record, the queue wait (startTime - creationTime) and the run's duration (endTime -
startTime); from the run's events, the queue wait's parts (RUN_ENQUEUED -> RUN_STARTING: the
daemon's dequeue; RUN_STARTING -> RUN_START: the run process starting and loading the code); the
engine's total from the hour's commit record. The first `--warmup` hours (the server's JIT, the
code location) are not measured. The target is met when the median measured wall is <= 10 s.
Writes benchmarks/results/ui-<stamp>.json. The full benchmark (`./scripts/bench.sh`) runs the
same as its UI part (T8ui) through `measure_ui`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.probe import save_report
from benchmarks.warm import start_server, stop_server
from dedup_pipeline.cli.runs import DEMO_INSTANCE_YAML
from dedup_pipeline.config import load_config
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.session import check_server
from dedup_pipeline.hours import HOUR, format_hour, parse_hour, to_tag
from dedup_pipeline.orchestration.checks import CHECKS
from dedup_pipeline.orchestration.names import WRITTEN
from dedup_pipeline.sample.generate import default_start, generate_landing
from dedup_pipeline_tests.spark_services import (
    LOOPBACK,
    REPO,
    VENV_BIN,
    Service,
    clean_env,
    free_port,
    graphql,
    launch_partition_run,
    loaded_location,
    start,
    stop_all,
    wait_until,
)

HERE = Path(__file__).resolve().parent
TARGET_S = 10.0
LOCATION = "dedup_pipeline"
DS = "clicks"  # generate_landing's dataset
DONE = ("SUCCESS", "FAILURE", "CANCELED")
POLL_S = 0.2

RUN = """
query Run($id: ID!) { runOrError(runId: $id) { __typename
  ... on Run { runId status creationTime startTime endTime } } }
"""

RUN_EVENTS = """
query Events($id: ID!) { runOrError(runId: $id) { __typename ... on Run {
  eventConnection(limit: 5000) { events { __typename
    ... on MessageEvent { message timestamp stepKey level }
    ... on ErrorEvent { error { message } } } } } } }
"""


class UiRunFailed(RuntimeError):
    """A UI run that ended other than SUCCESS."""


def _launch_one_hour(url: str, hour: str) -> str:
    """What the UI sends for "Materialize" of one partition of the dataset's outputs."""
    checks = {name: asset for name, (asset, _blocking, _desc) in CHECKS.items()}
    res = launch_partition_run(url, DS, WRITTEN, checks, hour, LOCATION)
    if res["__typename"] != "LaunchRunSuccess":
        raise UiRunFailed(f"launchRun of {hour} was refused: {res}")
    return str(res["run"]["runId"])


def _run(url: str, run_id: str) -> dict[str, Any]:
    run = graphql(url, RUN, {"id": run_id})["runOrError"]
    if run["__typename"] != "Run":
        raise UiRunFailed(f"run {run_id} not found: {run}")
    return dict(run)


def _events(url: str, run_id: str) -> list[dict[str, Any]]:
    run = graphql(url, RUN_EVENTS, {"id": run_id})["runOrError"]
    return list(run["eventConnection"]["events"]) if run["__typename"] == "Run" else []


def _first(events: list[dict[str, Any]], typename: str) -> float | None:
    """Epoch seconds of the first event of `typename` (GraphQL gives epoch milliseconds)."""
    for e in events:
        if e["__typename"] == typename and e.get("timestamp"):
            return float(e["timestamp"]) / 1000
    return None


def _failure(url: str, run_id: str, status: str, log: Path) -> str:
    """The run's error messages, for a run that did not succeed."""
    lines = []
    for e in _events(url, run_id):
        err = (e.get("error") or {}).get("message")
        if err or e["__typename"] in ("RunFailureEvent", "ExecutionStepFailureEvent"):
            lines.append(f"  {e['__typename']} {e.get('stepKey') or ''}: "
                         f"{(err or e.get('message') or '').strip()[:1500]}")
    detail = "\n".join(lines) or "  (no error events)"
    return f"UI run {run_id} ended {status}:\n{detail}\n(dagster dev's log: {log})"


def _engine_seconds(output: str, hour: str) -> float:
    rec = commits.read_commit(Storage(output), to_tag(parse_hour(hour)))
    if rec is None:
        raise UiRunFailed(f"hour {hour} succeeded in Dagster but has no commit record in {output}")
    return float(rec.seconds["total"])


def _summary(xs: list[float]) -> dict[str, float]:
    return {"min": round(min(xs), 2), "median": round(statistics.median(xs), 2),
            "max": round(max(xs), 2)}


def _one_hour(url: str, hour: str, output: str, log: Path, web: Service) -> dict[str, Any]:
    """Materialize `hour` as the UI does and time it; raises `UiRunFailed` unless it succeeds."""
    sent_wall = time.time()
    t0 = time.perf_counter()
    run_id = _launch_one_hour(url, hour)
    deadline = t0 + 600
    while True:
        run = _run(url, run_id)
        if run["status"] in DONE:
            break
        if not web.alive():
            raise UiRunFailed(f"dagster dev exited while run {run_id} was {run['status']}; "
                              f"see {log}")
        if time.perf_counter() > deadline:
            raise UiRunFailed(f"run {run_id} of {hour} still {run['status']} after 600 s; see {log}")
        time.sleep(POLL_S)
    wall = time.perf_counter() - t0
    if run["status"] != "SUCCESS":
        raise UiRunFailed(_failure(url, run_id, run["status"], log))
    created, started, ended = (float(run[k]) for k in ("creationTime", "startTime", "endTime"))
    events = _events(url, run_id)
    # Dagster 1.13's daemon logs RUN_STARTING as it hands the run to the launcher (no RUN_DEQUEUED)
    enqueued = _first(events, "RunEnqueuedEvent")
    dequeued = _first(events, "RunDequeuedEvent") or _first(events, "RunStartingEvent")
    step = _first(events, "ExecutionStepStartEvent")

    def gap(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(b - a, 2)

    return {
        "hour": hour, "run_id": run_id, "wall": round(wall, 2),
        "launch": round(created - sent_wall, 2),  # the launchRun request until the run exists
        "queue_wait": round(started - created, 2),
        "daemon_dequeue": gap(enqueued, dequeued),
        "process_start": gap(dequeued, started),  # STARTING: the run process and its code load
        "run_duration": round(ended - started, 2),
        "to_first_step": gap(started, step),
        "engine_total": round(_engine_seconds(output, hour), 2),
        "seen_after_end": round(sent_wall + wall - ended, 2),  # the 0.2 s poll's lag
    }


def measure_ui(work: Path, remote: str | None = None, rows: int = 2000, warmup: int = 2,
               measured: int = 3, say: Callable[[str], Any] = print) -> dict[str, Any]:
    """Materialize `warmup + measured` hours of `rows` rows from the `dagster dev` UI (GraphQL)
    against the warm Spark Connect server `remote` (one is started and stopped here if None);
    returns the per-hour timings and the median/min/max wall of the measured hours."""
    if measured < 1 or warmup < 0:
        raise ValueError("measured must be >= 1 and warmup >= 0")
    work = work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    total = warmup + measured
    first = default_start(total)  # the last hour is the last complete one: the UI offers it
    hours = [format_hour(parse_hour(first) + i * HOUR) for i in range(total)]
    generate_landing(work, hours=total, rows_per_hour=rows, seed=7, start=first)
    for marker in (work / "landing").rglob("_SUCCESS"):
        marker.unlink()  # the landing sensor (on in dagster dev) must not load them first
    config = work / "dedup.yaml"
    output = load_config(str(config)).datasets[0].output
    home = work / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DEMO_INSTANCE_YAML)  # what `dedup-pipeline demo` writes
    # create the SQLite storages once: the webserver, its code server and the daemon creating them
    # at the same moment can stamp the schema twice ("more than one head"; test_ui_server.py)
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)):
        pass

    logs = work / "logs"
    logs.mkdir()
    services: list[Service] = []
    server = None
    per_hour: list[dict[str, Any]] = []
    timings: dict[str, float] = {}
    try:
        if remote is not None:
            check_server(remote)  # else every run would sit in the Connect client's retries
        else:
            t0 = time.perf_counter()
            server_port = free_port()
            server = start_server(server_port, logs / "spark-server.log")
            remote = f"sc://{LOOPBACK}:{server_port}"
            timings["spark_server_start"] = round(time.perf_counter() - t0, 1)
            say(f"Spark Connect server {remote} up in {timings['spark_server_start']:.1f} s")
        port = free_port()
        url = f"http://{LOOPBACK}:{port}"
        env = clean_env(DAGSTER_HOME=str(home), DEDUP_CONFIG=str(config), SPARK_REMOTE=remote)
        t0 = time.perf_counter()
        dev_log = logs / "dagster-dev.log"
        web = start("dagster-dev", [str(VENV_BIN / "dagster"), "dev", "-h", LOOPBACK, "-p",
                                    str(port), "-w", "workspace.yaml"], dev_log, env=env, cwd=REPO)
        services.append(web)
        entry = wait_until("dagster dev to load the code location",
                           lambda: loaded_location(url, LOCATION, reload_unreachable=True), 300,
                           [web], interval=1)
        if entry["locationOrLoadError"]["__typename"] != "RepositoryLocation":
            raise UiRunFailed(f"the code location failed to load: {entry}; see {dev_log}")
        timings["dagster_dev_start"] = round(time.perf_counter() - t0, 1)
        say(f"dagster dev on {url}, code location loaded in {timings['dagster_dev_start']:.1f} s")
        for i, hour in enumerate(hours):
            row = {**_one_hour(url, hour, output, dev_log, web), "measured": i >= warmup}
            per_hour.append(row)
            say(f"{hour} {'measured' if row['measured'] else 'warm-up '}  wall {row['wall']:5.2f} s"
                f"  queue {row['queue_wait']:5.2f} s (daemon {row['daemon_dequeue']} s, process "
                f"{row['process_start']} s)  run {row['run_duration']:5.2f} s"
                f"  engine {row['engine_total']:5.2f} s")
    finally:
        stop_all(services)
        if server is not None:
            stop_server(server)
    meas = [r for r in per_hour if r["measured"]]
    walls = _summary([r["wall"] for r in meas])
    load_avg = os.getloadavg()
    return {
        "rows": rows, "warmup": warmup, "measured": measured, "remote_given": "spark_server_start"
        not in timings, "target_s": TARGET_S, "per_hour": per_hour, "wall": walls,
        **{k: _summary([r[k] for r in meas]) for k in ("queue_wait", "run_duration",
                                                       "engine_total")},
        "startup": timings, "load_avg": [round(x, 2) for x in load_avg], "cpus": os.cpu_count(),
        "target_met": walls["median"] <= TARGET_S,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2000, help="rows per hour")
    ap.add_argument("--warmup", type=int, default=2, help="hours materialized first, not measured")
    ap.add_argument("--measured", type=int, default=3, help="measured hours")
    ap.add_argument("--work", type=Path, default=HERE / "work" / "ui")
    ap.add_argument("--remote", default=None,
                    help="a running Spark Connect server (sc://127.0.0.1:PORT); default: start one")
    args = ap.parse_args(argv)
    # SIGTERM (timeout, kill): unwind through measure_ui's finally, which stops dagster dev and
    # the server it started, instead of dying and leaving their process groups behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        report = measure_ui(args.work, args.remote, args.rows, args.warmup, args.measured)
    except UiRunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a service that did not come up (ServiceFailed) or failed
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    w, q, r, g = (report[k] for k in ("wall", "queue_wait", "run_duration", "engine_total"))
    print(f"\n{args.rows} rows per hour, {args.measured} measured hours (load average "
          f"{report['load_avg'][0]:.1f} on {report['cpus']} cores): UI materialization wall "
          f"min/median/max {w['min']:.1f} / {w['median']:.1f} / {w['max']:.1f} s; median queue wait "
          f"{q['median']:.1f} s, run {r['median']:.1f} s, engine {g['median']:.1f} s. Target "
          f"<= {TARGET_S:.0f} s: {'met' if report['target_met'] else 'MISSED'}")
    print(f"written to {save_report('ui', report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
