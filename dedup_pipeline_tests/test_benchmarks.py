"""The benchmark's `--quick` size, so it never rots (issue "Performance"). It asserts that every
system ran and the report was written, not how fast anything was (performance is measured, never
asserted in tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.run import SYSTEMS, main

pytestmark = pytest.mark.slow


def test_quick_benchmark_runs_every_system_and_reports(spark, tmp_path: Path, capsys) -> None:
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
    assert {t["target"] for t in report["targets"]} == {"T1", "T2", "T3", "T4", "T5", "T6", "T7a", "T7b"}
    assert all(t["value"] is not None for t in report["targets"])
    assert report["backfill"]["separate_run_per_hour"] > 0
    png = next(results.glob("*.png"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
