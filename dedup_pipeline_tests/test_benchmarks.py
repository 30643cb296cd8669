"""The benchmark's `--quick` size (every part once, one hour per history point, tiny data), so
it never rots. It asserts that every system ran, printed its figures and the report was written,
not how fast anything was (performance is measured by running benchmarks/, never asserted in
tests)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks.run import (
    FULL,
    LONG,
    QUICK,
    SYSTEMS,
    Plan,
    complete_long_run,
    complete_run,
    hand_section,
    long_section,
    main,
    targets_text,
    with_hand_section,
    with_long_section,
)

pytestmark = pytest.mark.bench


def test_only_a_run_of_every_target_replaces_results_md() -> None:
    """An exploratory run (`--points 24`, `--skip big`) must not overwrite the committed results."""
    from dataclasses import replace

    assert complete_run(FULL, set())
    assert complete_run(replace(FULL, points=(24, 72, 720)), set())  # the long run (T2 at 720 h)
    assert not complete_run(QUICK, set())
    assert not complete_run(FULL, {"big"})
    assert not complete_run(replace(FULL, points=(24,)), set())
    assert not complete_run(Plan(**{**FULL.__dict__, "points": (24, 72, 96)}), set())
    # the long run (T2 at 720 h, `--long`) owns only its section of RESULTS.md
    assert not complete_run(LONG, set())
    assert complete_long_run(LONG)
    assert not complete_long_run(replace(LONG, points=(24, 168)))
    assert not complete_long_run(replace(QUICK, long=True))
    assert not complete_long_run(FULL)


def test_full_and_long_runs_each_keep_the_others_part_of_results_md() -> None:
    from benchmarks.run import LONG_BEGIN, LONG_END

    full_v1 = "# Benchmark results\n\nfull run 1\n"
    long_v1 = f"{LONG_BEGIN}\n## Long run\nlong run 1\n{LONG_END}"
    assert long_section(full_v1) is None
    md = with_long_section(full_v1, long_v1)  # first long run: appended after the full run
    assert md.startswith(full_v1.rstrip("\n")) and long_section(md) == long_v1
    md = with_long_section("# Benchmark results\n\nfull run 2\n", long_section(md))  # full run
    assert "full run 2" in md and "full run 1" not in md and long_section(md) == long_v1
    long_v2 = long_v1.replace("long run 1", "long run 2")
    md = with_long_section(md, long_v2)  # second long run: replaces its section only
    assert "full run 2" in md and long_section(md) == long_v2 and "long run 1" not in md
    assert md.count(LONG_BEGIN) == 1
    assert with_long_section(md, None) == md


def test_a_full_run_keeps_the_hand_written_part_of_results_md() -> None:
    from benchmarks.run import HAND_BEGIN, HAND_END, LONG_BEGIN, LONG_END

    hand = f"{HAND_BEGIN}\n## Targets\nanalysis\n{HAND_END}"
    long_v1 = f"{LONG_BEGIN}\nlong run 1\n{LONG_END}"
    previous = f"# Benchmark results\n\nfull run 1\n\n{long_v1}\n\n{hand}\n"
    md = with_hand_section(with_long_section("# Benchmark results\n\nfull run 2\n",
                                             long_section(previous)), hand_section(previous))
    assert "full run 2" in md and "full run 1" not in md
    assert long_section(md) == long_v1 and hand_section(md) == hand
    assert md.index(LONG_BEGIN) < md.index(HAND_BEGIN) and md.count(HAND_BEGIN) == 1
    md = with_long_section(md, long_v1.replace("run 1", "run 2"))  # a long run keeps it too
    assert hand_section(md) == hand
    # the real file has the part, so the next full run keeps it
    assert hand_section((Path(__file__).parents[1] / "benchmarks" / "RESULTS.md").read_text())


def test_skip_names_parts_and_peers_and_refuses_anything_else(tmp_path: Path, capsys) -> None:
    for bad in ("pipeline", "bigg", "backfill,stream"):
        with pytest.raises(SystemExit) as e:
            main(["--quick", "--work", str(tmp_path), "--skip", bad])
        assert e.value.code == 2
        assert "not a part or peer" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before generating anything


def test_run_process_reports_the_peak_of_a_process_tree(tmp_path: Path) -> None:
    """The fresh-driver figure (T6f) counts the process and its largest child (the JVM)."""
    import sys

    from benchmarks.probe import run_process

    child = "b = bytearray(400 * 2**20); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(1)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}], check=True)"
    rc, seconds, peak = run_process([sys.executable, "-c", parent], log=str(tmp_path / "log"))
    assert rc == 0 and seconds >= 1
    assert 400 * 2**20 < peak < 600 * 2**20
    rc, _, _ = run_process([sys.executable, "-c", "raise SystemExit(3)"])
    assert rc == 3


@pytest.mark.slow
def test_quick_benchmark_runs_every_system_and_reports(spark, tmp_path: Path, capsys) -> None:
    """Every part once; the UI part (`benchmarks.ui.measure_ui` at its smallest, with real parts:
    its own Spark Connect server and `dagster dev`) commits the hour the design.md oracle expects."""
    from dedup_pipeline.config import load_config
    from dedup_pipeline.engine.core import commits
    from dedup_pipeline.engine.core.storage import Storage
    from dedup_pipeline.hours import parse_hour, to_tag
    from dedup_pipeline_tests.reference import Reference

    results = tmp_path / "results"
    assert main(["--quick", "--work", str(tmp_path / "work"), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    for label in SYSTEMS.values():
        assert label in out
    [report_file] = results.glob("*.json")
    report = json.loads(report_file.read_text())
    seen = {s["system"] for s in report["samples"]}
    assert seen == {*SYSTEMS, "big_pipeline", "big_floor"}
    assert report["failures"] == []  # (a) == (b) unique rows and conservation at every measured hour
    assert {t["target"] for t in report["targets"]} == {"T1", "T2", "T3", "T4", "T5", "T6", "T6f",
                                                         "T7a", "T7b", "T8", "T8d", "T8ui"}
    assert all(t["value"] is not None for t in report["targets"])
    for line in targets_text(report["targets"]).splitlines():
        assert line in out  # every ratio printed, as the report has it
    # (g): a fresh run process per hour against the warm server, hours 0 .. first point + 2; its
    # unique rows equal (a)'s from the first point on (else a failure above); the UI part ran
    deployed = [s for s in report["samples"] if s["system"] == "deployed"]
    assert [s["history"] for s in deployed] == list(range(QUICK.deployed_hours))
    assert all(s["extra"]["engine_seconds"] > 0 for s in deployed)
    # beside (g)'s T8d hours, a run process with no load work: its steps in order, then its run
    floors = [s for s in deployed if "run_floor_seconds" in s["extra"]]
    assert [s["history"] for s in floors] == list(range(min(QUICK.points), QUICK.deployed_hours))
    for f in (s["extra"] for s in floors):
        assert list(f["run_floor_marks"]) == ["import_dagster", "import_connect", "instance",
                                              "session_and_query", "run"]
        assert 0 < f["run_floor_marks"]["run"] < f["run_floor_seconds"]
    assert "run floor" in report["deployed_text"]
    assert [h["measured"] for h in report["ui"]["per_hour"]] == [True] * QUICK.ui_measured
    (row,) = report["ui"]["per_hour"]
    assert row["wall"] > 0 and row["engine_total"] > 0
    assert report["ui"]["wall"]["median"] == row["wall"]
    (ds,) = load_config(str(tmp_path / "work" / "ui" / "dedup.yaml")).datasets
    hour = parse_hour(row["hour"])
    expected = Reference(ds).run(hour, 1)[f"{hour:%Y-%m-%d-%H}"]
    rec = commits.read_commit(Storage(ds.output), to_tag(hour))
    assert rec is not None
    assert (rec.rows_in, rec.unique) == (expected.rows_in, sum(expected.rows["unique"].values()))
    assert report["backfill"]["separate_run_per_hour"] > 0
    # T6f: the first hour of each point rerun by a process of its own, which measured a driver
    # JVM (hundreds of MiB, not just the Python process) and left the same unique rows (failures)
    assert [f["history"] for f in report["fresh_driver"]] == list(QUICK.points)
    assert all(f["peak_rss_bytes"] > 300 * 2**20 for f in report["fresh_driver"])
    png = next(results.glob("*.png"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_quick_long_run_loads_a_every_hour_and_samples_only_b_and_e(spark, tmp_path: Path,
                                                                     capsys) -> None:
    results = tmp_path / "results"
    work = tmp_path / "work"
    # the fresh-driver reruns are the quick run's code (test above)
    assert main(["--quick", "--long", "--skip", "fresh", "--work", str(work), "--results",
                 str(results)]) == 0
    out = capsys.readouterr().out
    [report_file] = results.glob("*.json")
    report = json.loads(report_file.read_text())
    seen = {s["system"] for s in report["samples"]}
    assert seen == {"pipeline", "naive", "floor"}
    hours = report["plan"]["points"][-1] + report["plan"]["span"]
    assert len([s for s in report["samples"] if s["system"] == "pipeline"]) == hours
    assert report["failures"] == [] and report["backfill"] is None
    values = {t["target"]: t["value"] for t in report["targets"]}
    assert all(values[t] is not None for t in ("T1", "T2", "T6"))
    assert values["T3"] is None and values["T4"] is None  # no streaming, no 1e6-row part
    assert SYSTEMS["streaming"] not in out and SYSTEMS["naive"] in out
    assert (work / "long" / "landing" / "dedup.yaml").exists()  # the full run's data is kept


@pytest.mark.slow
def test_worker_process_loads_like_the_runner_and_reports_its_own_cost(spark, tmp_path: Path
                                                                        ) -> None:
    """The full run's (a) lives in a worker process (benchmarks/worker.py): its loads must equal
    in-process loads of the same hours, it must report what each step cost, and a failure inside
    it must reach the runner with the worker's traceback."""
    import yaml

    from benchmarks.worker import Worker, dataset_from_spec
    from dedup_pipeline.engine.load import load_hours
    from dedup_pipeline.hours import HOUR, format_hour, parse_hour
    from dedup_pipeline.sample.generate import generate_landing
    from dedup_pipeline_tests.conftest import read_output

    generate_landing(tmp_path, hours=2, rows_per_hour=400, seed=3)
    config = tmp_path / "dedup.yaml"
    section = yaml.safe_load(config.read_text())["datasets"][0]
    ds_here = dataset_from_spec({"config": str(config), "dataset": {**section, "output": "here"}})
    keys = [format_hour(parse_hour(ds_here.start) + i * HOUR) for i in range(2)]
    load_hours(spark, ds_here, keys)

    spec = {"config": str(config), "dataset": {**section, "output": "there"},
            "conf": {"spark.ui.enabled": "false", "spark.driver.memory": "1g"}, "root": ""}
    worker = Worker("pipeline", spec, tmp_path / "pipeline.log")
    try:
        results = [worker.step(k) for k in keys]
        with pytest.raises(RuntimeError, match="LoadOrderError"):
            worker.step(format_hour(parse_hour(keys[-1]) + 2 * HOUR))  # skips an hour: refused
    finally:
        worker.close()
    assert worker.proc.returncode == 0
    ds_there = dataset_from_spec(spec)
    for (cost, extra), key in zip(results, keys, strict=True):
        rec = extra["result"]
        assert rec["rows_in"] == 400 == sum(rec[o] for o in ("unique", "duplicates", "expired",
                                                              "rejected"))
        assert cost.seconds > 0 and cost.cpu_seconds > 0 and cost.peak_is_per_step
        assert cost.peak_rss_bytes > 0
        for name in ("unique", "duplicates", "expired", "rejected"):
            def rows(ds, name=name, key=key):
                return sorted(repr(sorted(r.items())) for r in read_output(spark, ds, name, key))
            assert rows(ds_there) == rows(ds_here), (name, key)


def test_profiler_reports_every_load_and_the_reruns(spark, tmp_path: Path) -> None:
    """`python -m benchmarks.profile` on tiny data: a record per load, reruns included, with the
    JVM counters read (performance is reported, never asserted)."""
    import io

    from benchmarks.profile import profile

    out = io.StringIO()
    records = profile(tmp_path, rows=200, hours=2, rerun_last=1, conf={}, out=out)
    assert [(r["hour"], r["kind"]) for r in records] == [(0, "new"), (1, "new"), (1, "rerun")]
    assert all(r["rows_in"] == 200 and r["seconds"] > 0 and r["jit_ms"] >= 0 for r in records)
    assert records[1]["index_rows_read"] > 0  # the second hour probed the first hour's index
    assert "reruns: median" in out.getvalue()
    # each load's Spark jobs, from the status store, with the Python line that ran each
    assert all(r["spark_jobs"] > 0 and r["spark_stages_run"] > 0 for r in records)
    assert all(j["site"] for r in records for j in r["jobs"])


def test_quick_peers_merge_every_hour_and_match_the_pipeline(tmp_path: Path, capsys) -> None:
    """`python -m benchmarks.peers --quick`: (i) DuckDB + delta-rs MERGE (and (h) Spark + Delta
    MERGE when its venv is already built: building it takes minutes) load every hour beside (a),
    and their rows equal (a)'s unique rows at the measured hours (exit 0, "==(a): yes")."""
    from benchmarks.peers import main as peers_main
    from benchmarks.peers import merge_env

    only = "merge_duckdb" + (",merge_spark" if merge_env(build=False) else "")
    assert peers_main(["--quick", "--only", only, "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "(i)==(a): yes" in out and "NO" not in out
    assert "(i)/(a)" in out and "(i) DuckDB + delta-rs MERGE:" in out


@pytest.mark.slow  # a Dagster run in a subprocess
def test_the_run_floor_has_the_loads_shape_and_runs_in_an_instance(tmp_path: Path) -> None:
    """`benchmarks.run_floor` stands for a load's run process minus the load: the same assets and
    checks as a dataset's load (so the same events), run for real in an instance on disk."""
    import subprocess
    import sys

    import dagster as dg

    from benchmarks import run_floor
    from dedup_pipeline.config import load_config
    from dedup_pipeline.orchestration.checks import CHECKS
    from dedup_pipeline.orchestration.definitions import build_definitions
    from dedup_pipeline.orchestration.names import load_op_name
    from dedup_pipeline.sample.generate import generate_landing

    assert {c: a for c, (a, _, _) in CHECKS.items()} == run_floor.CHECKS
    assert {c for c, (_, blocking, _) in CHECKS.items() if blocking} == run_floor.BLOCKING
    generate_landing(tmp_path / "gen", hours=1, rows_per_hour=10, start="2026-11-01-00:00")
    cfg = load_config(tmp_path / "gen" / "dedup.yaml")
    op = load_op_name(cfg.datasets[0].name)
    [load] = [a for a in build_definitions(cfg).resolve_asset_graph().assets_defs
              if a.is_executable and a.node_def.name == op]
    assert sorted(k.path[-1] for k in load.keys) == sorted(run_floor.OUTPUTS)
    assert {c.name: c.asset_key.path[-1] for c in load.check_keys} == run_floor.CHECKS

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    out = subprocess.run([sys.executable, "-m", "benchmarks.run_floor", "2026-11-01-05:00"],
                         env={**env, "DAGSTER_HOME": str(home)}, capture_output=True, text=True,
                         timeout=300, cwd=Path(run_floor.__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert list(report["marks"]) == ["import_dagster", "instance", "run"]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.tags["dagster/partition"] == "2026-11-01-05:00"
        assert len(instance.all_logs(run.run_id)) == report["events"]


def test_s3_requests_are_classified_by_kind() -> None:
    """The S3 point's request kinds (benchmarks/s3.py), from the method, query and headers of
    path-style requests as S3A, s3fs and delta-rs send them."""
    from benchmarks.s3 import classify, client_of

    no: dict[str, str] = {}
    assert classify("GET", "/b/lake/_commits/2026-01-01-00.json", no) == "GET"
    assert classify("GET", "/b?list-type=2&prefix=lake%2F_commits%2F&delimiter=%2F", no) == "LIST"
    assert classify("GET", "/b/?prefix=lake/&max-keys=1", no) == "LIST"  # v1 listing
    assert classify("GET", "/b", no) == "LIST"
    assert classify("GET", "/b?uploads&prefix=x", no) == "LIST"
    assert classify("HEAD", "/b/lake/_lock", no) == "HEAD"
    assert classify("PUT", "/b/lake/_lock", {"If-None-Match": "*"}) == "PUT"
    assert classify("PUT", "/b/lake/new", {"X-Amz-Copy-Source": "/b/lake/old"}) == "COPY"
    assert classify("PUT", "/b/k?partNumber=1&uploadId=u", no) == "PUT"
    assert classify("DELETE", "/b/lake/_lock", {"If-Match": '"e"'}) == "DELETE"
    assert classify("POST", "/b?delete", no) == "DELETE"  # a bulk delete
    assert classify("POST", "/b/k?uploads", no) == "POST"
    assert classify("POST", "/b/k?uploadId=u", no) == "POST"
    assert client_of("Hadoop 3.4.1, aws-sdk-java/2.35.4 Linux/6") == "spark"
    assert client_of("aiobotocore/2.15 md/Botocore#1.35") == "s3fs"
    assert client_of("object_store/0.12.3") == "delta-rs"


def test_counting_proxy_forwards_as_is_and_counts(tmp_path: Path) -> None:
    """The counting proxy in front of a plain HTTP server: bodies, status and the Host header
    reach the server as the client sent them (so an S3 signature over Host stays valid), and
    only the requests inside `counting()` are counted."""
    import http.client
    import http.server
    import threading

    from benchmarks.s3 import CountingProxy

    seen: list[tuple[str, str, str, bytes]] = []

    class Upstream(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            seen.append((self.command, self.path, self.headers["Host"], body))
            out = b"" if self.command == "HEAD" else b"ok:" + body
            self.send_response(404 if self.path.endswith("/absent") else 200)
            self.send_header("Content-Length", str(len(out) if self.command != "HEAD" else 7))
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    up = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    proxy = CountingProxy(f"http://127.0.0.1:{up.server_address[1]}")
    try:
        port = int(proxy.endpoint.rsplit(":", 1)[1])
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/b/not-counted")
        c.getresponse().read()
        with proxy.counting() as counted:
            for method, path, body, headers in (
                    ("PUT", "/b/k", b"data", {}), ("GET", "/b/k", None, {}),
                    ("HEAD", "/b/k", None, {}), ("GET", "/b/absent", None, {}),
                    ("GET", "/b?list-type=2&prefix=k", None, {}),
                    ("PUT", "/b/k2", b"", {"x-amz-copy-source": "/b/k"}),
                    ("DELETE", "/b/k", None, {})):
                c.request(method, path, body=body, headers=headers)
                r = c.getresponse()
                data = r.read()
                if method == "PUT" and body:
                    assert data == b"ok:data"
                if path.endswith("/absent"):
                    assert r.status == 404
        assert counted["kinds"] == {"PUT": 1, "GET": 2, "HEAD": 1, "LIST": 1, "COPY": 1,
                                    "DELETE": 1}
        assert all(host == f"127.0.0.1:{port}" for _, _, host, _ in seen)
        assert ("PUT", "/b/k", f"127.0.0.1:{port}", b"data") in seen
    finally:
        proxy.close()
        up.shutdown()
        up.server_close()
