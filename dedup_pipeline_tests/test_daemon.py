"""The landing sensor under a real `dagster-daemon run` (design.md D2): a new hour's marker lands, the
daemon's tick launches a run of the load job, and the run loads the hour on local Spark."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

# tick history has no public API in Dagster 1.13 (the UI reads it through GraphQL)
from dagster._core.scheduler.instigation import TickStatus

from dedup_pipeline.hours import HOUR, format_hour, to_tag
from dedup_pipeline.orchestration.names import (
    PARTITION,
    RANGE_END,
    RANGE_START,
    landing_sensor_name,
    load_job_name,
)
from dedup_pipeline_tests.conftest import dataset_raw, source_raw, write_config
from dedup_pipeline_tests.daemon_walk import instigator_ticks

REPO = Path(__file__).resolve().parents[1]
SENSOR = landing_sensor_name("clicks")
JOB = load_job_name("clicks")


def _wait(what: str, fn: Callable[[], Any], timeout: float, proc: subprocess.Popen, log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"dagster-daemon exited ({proc.returncode}) while waiting for {what}:\n"
                        f"{log.read_text()[-4000:]}")
        time.sleep(2)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; daemon log:\n{log.read_text()[-4000:]}")


def _run_errors(inst: dg.DagsterInstance, run_id: str) -> str:
    lines = []
    for rec in inst.all_logs(run_id):
        ev = rec.dagster_event
        if ev is not None and (ev.is_step_failure or ev.is_run_failure
                               or ev.event_type_value == "ENGINE_EVENT"):
            lines.append(f"{ev.event_type_value}: {ev.message}")
            data = ev.step_failure_data or getattr(ev, "job_failure_data", None)
            if data is not None and data.error is not None:
                lines.append(data.error.to_string())
    return "\n".join(lines)[-6000:]


@pytest.mark.slow
def test_daemon_landing_sensor_launches_and_completes_a_run(tmp_path: Path, monkeypatch) -> None:
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - HOUR  # the last complete hour
    key, tag = format_hour(hour), to_tag(hour)
    write_config(tmp_path, dataset_raw(start=key, source=source_raw(
        schema={"event_id": "string", "event_time": "timestamp"}), landing={"check_every": "5s"}))
    hour_dir = tmp_path / "landing" / f"date={hour:%Y-%m-%d}" / f"hour={hour:%H}"
    hour_dir.mkdir(parents=True)
    rows = [{"event_id": f"e{i % 3}", "event_time": f"{hour:%Y-%m-%dT%H}:0{i}:00Z"} for i in range(5)]
    (hour_dir / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")

    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DEDUP_CONFIG": str(tmp_path / "dedup.yaml"),
        "SPARK_MASTER_URL": "local[1]",
        "DEDUP_SPARK_CONF_spark__sql__shuffle__partitions": "2",
        "DEDUP_SPARK_CONF_spark__ui__enabled": "false",
        "PYSPARK_PYTHON": sys.executable,
    }
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get():
        pass  # the storages first, before the daemon and its code server race to create them
    log = tmp_path / "daemon.log"
    daemon = str(Path(sys.executable).parent / "dagster-daemon")
    with open(log, "w") as out:
        proc = subprocess.Popen([daemon, "run", "-w", "workspace.yaml"], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with dg.DagsterInstance.get() as inst:
            # first the sensor waits: data is there, the marker is not
            def skipped_for_marker() -> bool:
                return any(t.status == TickStatus.SKIPPED and "waiting for _SUCCESS" in (t.skip_reason or "")
                           and key in (t.skip_reason or "") for t in instigator_ticks(inst, SENSOR, limit=20))

            _wait("a skipped landing-sensor tick", skipped_for_marker, 180, proc, log)
            assert not inst.get_run_records(dg.RunsFilter(job_name=JOB))
            (hour_dir / "_SUCCESS").write_text("")

            def finished_run() -> dg.DagsterRun | None:
                for rec in inst.get_run_records(dg.RunsFilter(job_name=JOB)):
                    if rec.dagster_run.is_finished:
                        return rec.dagster_run
                return None

            run = _wait("a landing-sensor run to finish", finished_run, 300, proc, log)
            assert run.status == dg.DagsterRunStatus.SUCCESS, _run_errors(inst, run.run_id)
            assert run.tags.get("dagster/sensor_name") == SENSOR
            # one complete hour: a single-partition run, as the UI's Materialize of it
            assert run.tags[PARTITION] == key and RANGE_START not in run.tags and RANGE_END not in run.tags
            assert len(inst.get_run_records(dg.RunsFilter(job_name=JOB))) == 1
            assert inst.get_materialized_partitions(dg.AssetKey(["clicks", "unique"])) == {key}
        record = json.loads((tmp_path / "warehouse" / "_commits" / f"load_hour={tag}.json").read_text())
        assert record["rows_in"] == 5 and record["unique"] == 3
        assert list((tmp_path / "warehouse" / "unique" / f"load_hour={tag}").glob("*.parquet"))
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass
