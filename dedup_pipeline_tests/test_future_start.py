"""A dataset whose `start` is still ahead (C2): a config prepared for tomorrow loads today.

The definitions load, the landing sensor and the hourly schedule wait with a reason, and the CLI
refuses an hour before the start as it always did. No Spark: nothing here gets as far as a load.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from click.testing import CliRunner

from dedup_pipeline.cli import main
from dedup_pipeline.config import PipelineConfig, load_config
from dedup_pipeline.hours import HOUR, format_hour
from dedup_pipeline.orchestration.definitions import build_definitions

REPO = Path(__file__).resolve().parents[1]
NOW = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
START = format_hour(NOW + 24 * HOUR)


def _write(tmp: Path) -> Path:
    raw: dict[str, Any] = {"datasets": [{
        "name": "clicks",
        "start": START,
        "source": {"path": "landing", "format": "jsonl",
                   "schema": {"event_id": "string", "event_time": "timestamp"}},
        "key": ["event_id"],
        "expiry": {"column": "event_time", "period": "24h"},
        "output": "warehouse",
    }]}
    path = tmp / "dedup.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def cfg(tmp_path: Path) -> PipelineConfig:
    return load_config(_write(tmp_path))


def test_config_with_a_future_start_loads(cfg: PipelineConfig) -> None:
    assert cfg.datasets[0].start == START


def test_definitions_load_in_a_fresh_process(tmp_path: Path) -> None:
    env = {**os.environ, "DEDUP_CONFIG": str(_write(tmp_path))}
    code = ("import dedup_pipeline.definitions as d, dagster as dg\n"
            "dg.Definitions.validate_loadable(d.defs)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_sensor_and_schedule_wait_for_the_start(cfg: PipelineConfig) -> None:
    defs = build_definitions(cfg)
    with dg.instance_for_test() as inst:
        sensor = defs.resolve_sensor_def("clicks_landing_sensor")
        with dg.build_sensor_context(instance=inst, definitions=defs) as ctx:
            res = sensor(ctx)
        assert isinstance(res, dg.SensorResult) and not res.run_requests
        assert res.skip_reason is not None
        assert f"hour {START} has not ended yet" in (res.skip_reason.skip_message or "")

        schedule = defs.resolve_schedule_def("clicks_hourly_schedule")
        with dg.build_schedule_context(instance=inst, scheduled_execution_time=NOW) as ctx:
            tick = schedule.evaluate_tick(ctx)
        assert not tick.run_requests and tick.skip_message  # "... has no partitions"

        reconcile = defs.resolve_schedule_def("clicks_reconcile_schedule")
        with dg.build_schedule_context(instance=inst, scheduled_execution_time=NOW) as ctx:
            tick = reconcile.evaluate_tick(ctx)
        assert not tick.run_requests and "no loaded hour" in (tick.skip_message or "")


def test_cli_run_before_the_start_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    path = _write(tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    before = format_hour(NOW)
    r = CliRunner().invoke(main, ["run", "--config", str(path), "--from", before, "--to", before])
    assert r.exit_code != 0
    assert "before the dataset's start" in r.output, r.output
    assert "Dagster run" not in r.output  # refused before a run is launched
