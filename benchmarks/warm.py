"""T8 and T8d (design.md N5): what one hour costs as Dagster runs it, a fresh run process per hour.

    .venv/bin/python -m benchmarks.warm [--rows 100000] [--hours 3] [--warmup 2]
                                        [--skip-local] [--skip-streaming]

Generates a landing zone, starts `dedup-pipeline spark-server` (the warm Spark Connect server,
local[*]) and runs the same hours these ways, interleaved hour by hour so a busy machine slows all
alike:

- warm server, (g): a fresh `dedup-pipeline run --from H --to H` process with SPARK_REMOTE;
- local mode: the same process without it (its own JVM per run, the alternative);
- in-process, (a): `run_load` in this process's local Spark session, warm from the earlier hours
  (what the main benchmark measures);
- streaming, (d): the streaming peer's always-on query (`benchmarks.systems.StreamingPeer`) in a
  worker process of its own, as the full benchmark runs it;
- run floor: a `benchmarks.run_floor` process, a run process with no load work (Dagster, its
  instance, the Connect client and a session): the least a fresh run process can cost.

The first `--warmup` hours warm each up (the server's JIT, the JVMs) and are not measured. Prints
wall time per run and engine time (the commit record's `total`), min / median / max per way;
T8 = median(warm-server run wall / in-process load wall of the same hour), target <= 2.0 (stretch
1.5); T8d = median(streaming wall / warm-server run wall), target >= 1.0; and how long (g)'s
engine may take to be ahead of streaming (streaming - run floor). The run processes record their
Dagster runs in one instance on disk (the demo's `dagster.yaml`), as a deployment's runs do.
Writes benchmarks/results/warm-<stamp>.json. The full benchmark measures the same as its part
(g); this script is the few-minute version (at 1e5 rows per hour).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.probe import save_report
from benchmarks.worker import WORKER_CONF, Worker
from dedup_pipeline.engine.core import commits
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import run_load
from dedup_pipeline.engine.session import SparkSettings, get_session
from dedup_pipeline.hours import HOUR, format_hour, parse_hour, to_tag
from dedup_pipeline.sample.generate import generate_landing

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
START = "2026-11-01-00:00"
WAYS = ("warm_server", "local_mode", "in_process", "streaming", "run_floor")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    """A child process's environment: none of this one's Spark or Dagster targets, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_REMOTE", "SPARK_MASTER_URL", "DAGSTER_HOME", "DEDUP_CONFIG")}
    env.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", **extra)
    return env


def _config(root: Path, way: str) -> Path:
    raw = yaml.safe_load((root / "dedup.yaml").read_text())
    ds = raw["datasets"][0]
    ds["source"]["path"] = str(root / "landing" / "clicks")
    ds["output"] = str(root / "warehouse" / way)
    path = root / f"{way}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _engine_seconds(output: str, hour: str) -> float:
    rec = commits.read_commit(Storage(output), to_tag(parse_hour(hour)))
    assert rec is not None, f"hour {hour} was not committed in {output}"
    return float(rec.seconds["total"])


def stop_server(server: subprocess.Popen[bytes]) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def fresh_run(config: Path, hour: str, env: dict[str, str], log: Path) -> float:
    """Wall time of a `dedup-pipeline run` process for one hour (as a Dagster run process)."""
    t0 = time.perf_counter()
    with open(log, "ab") as out:
        rc = subprocess.run([str(BIN / "dedup-pipeline"), "run", "--config", str(config),
                             "--from", hour, "--to", hour], env=env, stdout=out,
                            stderr=subprocess.STDOUT, timeout=1200).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"dedup-pipeline run of {hour} failed ({rc}); see {log}")
    return wall


def run_floor(hour: str, env: dict[str, str]) -> dict[str, Any]:
    """Wall time of a `benchmarks.run_floor` process for `hour` (Dagster's and the Connect
    client's cost of a run process, no load work) and its step marks."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "benchmarks.run_floor", hour], env=env,
                         capture_output=True, text=True, timeout=600, cwd=HERE.parent)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"benchmarks.run_floor {hour} failed ({out.returncode}):\n{out.stderr}")
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return {"wall": round(wall, 2), **report}


def start_server(port: int, log: Path, conf: dict[str, str] | None = None
                 ) -> subprocess.Popen[bytes]:
    """`dedup-pipeline spark-server` on `port` (its own process group), once it accepts clients."""
    cmd = [str(BIN / "dedup-pipeline"), "spark-server", "--port", str(port)]
    for k, v in {"spark.ui.enabled": "false", **(conf or {})}.items():
        cmd += ["--conf", f"{k}={v}"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=child_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 300
    while "export SPARK_REMOTE=" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the Spark Connect server did not start; see {log}")
        time.sleep(0.5)
    return proc


def _summary(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000, help="rows per hour")
    ap.add_argument("--hours", type=int, default=3, help="measured hours")
    ap.add_argument("--warmup", type=int, default=2, help="hours loaded first, not measured")
    ap.add_argument("--work", type=Path, default=HERE / "work" / "warm")
    ap.add_argument("--skip-local", action="store_true", help="no fresh local-mode runs")
    ap.add_argument("--skip-streaming", action="store_true",
                    help="no streaming peer (and no run floor), so no T8d")
    args = ap.parse_args(argv)

    root: Path = args.work
    shutil.rmtree(root, ignore_errors=True)
    total = args.warmup + args.hours
    generate_landing(root, hours=total, rows_per_hour=args.rows, seed=7, start=START)
    hours = [format_hour(parse_hour(START) + i * HOUR) for i in range(total)]
    skip = {"local_mode"} if args.skip_local else set()
    if args.skip_streaming:
        skip |= {"streaming", "run_floor"}
    ways = [w for w in WAYS if w not in skip]
    loads = [w for w in ways if w in ("warm_server", "local_mode", "in_process")]
    configs = {w: _config(root, w) for w in loads}
    outputs = {w: yaml.safe_load(configs[w].read_text())["datasets"][0]["output"] for w in loads}
    from dedup_pipeline.cli.runs import DEMO_INSTANCE_YAML

    home = root / "dagster_home"  # the runs are recorded in an instance on disk, as deployed
    home.mkdir()
    (home / "dagster.yaml").write_text(DEMO_INSTANCE_YAML)
    port = free_port()
    server = start_server(port, root / "server.log")
    remote = f"sc://127.0.0.1:{port}"
    from dedup_pipeline.config import load_config

    ds = load_config(configs["in_process"]).datasets[0]
    spark = get_session(SparkSettings(master="local[*]",
                                      conf={"spark.ui.enabled": "false"}))
    spark.sparkContext.setLogLevel("ERROR")
    stream = None
    if "streaming" in ways:  # (d) in its own process and JVM, as the full benchmark runs it
        spec = {"config": str(configs["in_process"]),
                "dataset": yaml.safe_load(configs["in_process"].read_text())["datasets"][0],
                "conf": WORKER_CONF, "root": str(root / "streaming")}
        stream = Worker("streaming", spec, root / "streaming.log")
    rows: list[dict[str, Any]] = []
    try:
        for i, hour in enumerate(hours):
            row: dict[str, Any] = {"hour": hour, "measured": i >= args.warmup}
            for way in ways:
                if way == "streaming":
                    assert stream is not None
                    row[way] = {"wall": round(stream.step(hour)[0].seconds, 2)}
                    continue
                if way == "run_floor":
                    row[way] = run_floor(hour, child_env(DAGSTER_HOME=str(home),
                                                         SPARK_REMOTE=remote))
                    continue
                if way == "in_process":
                    t0 = time.perf_counter()
                    run_load(spark, ds, hour)
                    wall = time.perf_counter() - t0
                else:
                    env = child_env(DAGSTER_HOME=str(home), **(
                        {"SPARK_REMOTE": remote} if way == "warm_server" else {}))
                    wall = fresh_run(configs[way], hour, env, root / f"{way}.log")
                row[way] = {"wall": round(wall, 2),
                            "engine": round(_engine_seconds(outputs[way], hour), 2)}
            if "warm_server" in row and "in_process" in row:
                row["t8"] = round(row["warm_server"]["wall"] / row["in_process"]["wall"], 2)
            if "warm_server" in row and "streaming" in row:
                row["t8d"] = round(row["streaming"]["wall"] / row["warm_server"]["wall"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if stream is not None:
            stream.close()
        stop_server(server)
    measured = [r for r in rows if r["measured"]]
    report: dict[str, Any] = {"rows_per_hour": args.rows, "hours": [r["hour"] for r in measured],
                              "load_avg_1m": os.getloadavg()[0], "per_hour": rows}
    print(f"\n{args.rows} rows per hour, {len(measured)} measured hours "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores):")
    for way in ways:
        walls = _summary([r[way]["wall"] for r in measured])
        report[way] = {"wall": walls}
        line = (f"  {way:<12} wall min/median/max {walls['min']:.1f} / {walls['median']:.1f} / "
                f"{walls['max']:.1f} s")
        if way in loads:
            engine = _summary([r[way]["engine"] for r in measured])
            report[way]["engine"] = engine
            line += (f"   engine {engine['min']:.1f} / {engine['median']:.1f} / "
                     f"{engine['max']:.1f} s")
        print(line)
    t8 = statistics.median(r["t8"] for r in measured)
    report["t8"] = t8
    print(f"  T8 = fresh run process against the warm server / warm in-process load of the same "
          f"hour: {t8:.2f}x (target <= 2.0, stretch 1.5)")
    if "streaming" in ways:  # and with it the run floor (--skip-streaming drops both)
        t8d = statistics.median(r["t8d"] for r in measured)
        report["t8d"] = t8d
        print(f"  T8d = streaming's always-on query / fresh run process against the warm server, "
              f"same hour: {t8d:.2f}x (target >= 1.0)")
        floor = statistics.median(r["run_floor"]["wall"] for r in measured)
        budget = statistics.median(r["streaming"]["wall"] - r["run_floor"]["wall"]
                                   for r in measured)
        engine_g = statistics.median(r["warm_server"]["engine"] for r in measured)
        report["run_floor"]["budget"] = budget
        print(f"  a run process's floor (Dagster and the Connect client, no load work): "
              f"{floor:.1f} s, so (g) is ahead of streaming only if its engine takes under "
              f"streaming - run floor = {budget:.1f} s (median per hour); it took {engine_g:.1f} s")
    print(f"  written to {save_report('warm', report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
