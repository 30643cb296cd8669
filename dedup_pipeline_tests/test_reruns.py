"""Reruns never leave later hours stale, from every path (design.md R10, R11, D6, K2).

A load of hour H while later hours are loaded is refused unless the same run reloads them: the
engine decides (`commits.check_later_hours`), so the UI's Materialize of one partition, a UI
backfill of a sub-range, a schedule or sensor run and the CLI all get the same refusal, before
anything is written. A run over H..latest reloads in order and gives what a first load would.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from dedup_pipeline.cli import main
from dedup_pipeline.config import PipelineConfig, load_config
from dedup_pipeline.orchestration import runs
from dedup_pipeline.orchestration.definitions import build_definitions
from dedup_pipeline.orchestration.names import RANGE_END, RANGE_START, SPARK_RESOURCE, load_job_name
from dedup_pipeline.orchestration.runner import run_range
from dedup_pipeline_tests.conftest import dataset_raw, table_files, write_config, write_hour

H = [f"2026-11-01-0{i}:00" for i in range(4)]


def _ev(eid: str) -> dict:
    return {"event_id": eid, "user_id": "u", "event_time": "2026-11-01T00:10:00Z", "url": "/a"}


def _site(tmp: Path) -> Path:
    cfg_path = write_config(tmp, dataset_raw())
    ds = load_config(cfg_path).datasets[0]
    write_hour(ds, H[0], [_ev("k1"), _ev("k2")])
    write_hour(ds, H[1], [_ev("k1"), _ev("k6")])
    write_hour(ds, H[2], [_ev("k6"), _ev("k7")])
    return cfg_path


def _snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and "_trash" not in p.parts and p.name != "_lock"}


def _ids(out: Path, name: str, hour: str) -> set[str]:
    """Keys of one hour of one output, as a reader of the table sees them."""
    part = out / name / f"load_hour={hour[:13]}"
    if (out / name / "_delta_log").is_dir():
        files = table_files(out / name, hour[:13])
    else:
        files = [str(f) for f in part.glob("*.parquet")]
    return {r["event_id"] for f in files for r in pq.read_table(f).to_pylist()}


def _refused(res: dg.ExecuteInProcessResult, first: str, last: str) -> str:
    assert not res.success
    err = runs.first_step_error(res.all_events)
    assert err is not None and err.cls == "LaterHoursLoadedError", err
    assert f"--from {first} --to {last}" in err.message and f"{first}...{last}" in err.message
    return str(err)


def test_dagster_materialize_and_sub_range_backfill_are_refused(spark, tmp_path: Path) -> None:
    cfg: PipelineConfig = load_config(_site(tmp_path))
    ds = cfg.datasets[0]
    out = Path(ds.output)
    defs = build_definitions(cfg)
    load = next(a for a in defs.assets if isinstance(a, dg.AssetsDefinition))
    job = defs.resolve_job_def(load_job_name(ds.name))
    with dg.instance_for_test() as inst:
        assert run_range(cfg, ds.name, H[0], H[2], inst).success
        write_hour(ds, H[0], [_ev("k6")], name="part-late.jsonl")  # k6 was first loaded in 01
        before = _snapshot(out)
        # the UI's Materialize of one partition
        res = dg.materialize([load], partition_key=H[0], instance=inst,
                             resources={SPARK_RESOURCE: defs.resources[SPARK_RESOURCE]}, raise_on_error=False)
        _refused(res, H[0], H[2])
        assert _snapshot(out) == before
        # a UI backfill of a sub-range (single-run policy: one run with the range tags)
        res = job.execute_in_process(instance=inst, raise_on_error=False,
                                     tags={RANGE_START: H[0], RANGE_END: H[1]})
        text = _refused(res, H[0], H[2])
        assert "(2026-11-01-02:00)" in text  # the hour left out, not the ones in the run
        assert _snapshot(out) == before
        summary = runs.failure_summary(inst.get_run_by_id(res.run_id), runs.run_error(
            inst, res.run_id), "")
        assert "Failed in the rerun rule" in summary and "nothing was written" in summary
        # the whole range runs (the latest loaded hour alone does too: test_rules.py)
        assert job.execute_in_process(instance=inst,
                                      tags={RANGE_START: H[0], RANGE_END: H[2]}).success
    assert _ids(out, "unique", H[0]) == {"k1", "k2", "k6"}
    assert _ids(out, "unique", H[1]) == set() and _ids(out, "duplicates", H[1]) == {"k1", "k6"}
    assert _ids(out, "unique", H[2]) == {"k7"} and _ids(out, "duplicates", H[2]) == {"k6"}


def test_cli_rerun_is_refused_naming_the_command_and_cascade_reloads(
        spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg_path = _site(tmp_path)
    ds = load_config(cfg_path).datasets[0]
    out = Path(ds.output)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    runner = CliRunner()
    r = runner.invoke(main, ["run", "--config", str(cfg_path), "--from", H[0], "--to", H[2]])
    assert r.exit_code == 0, r.output
    write_hour(ds, H[0], [_ev("k6")], name="part-late.jsonl")
    before = _snapshot(out)
    r = runner.invoke(main, ["run", "--config", str(cfg_path), "--from", H[0], "--to", H[0]])
    assert r.exit_code == 1
    (err,) = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert "LaterHoursLoadedError" in err and "(2026-11-01-01:00..2026-11-01-02:00)" in err
    assert (f"dedup-pipeline run --config {cfg_path} --dataset clicks --from {H[0]} --to {H[2]}"
            in err)
    assert _snapshot(out) == before
    r = runner.invoke(main, ["run", "--config", str(cfg_path), "--from", H[0], "--to", H[0],
                             "--cascade"])
    assert r.exit_code == 0, r.output
    assert f"reloading {H[0]} .. {H[2]}" in r.output
    assert _ids(out, "unique", H[0]) == {"k1", "k2", "k6"}
    assert _ids(out, "duplicates", H[1]) == {"k1", "k6"} and _ids(out, "unique", H[1]) == set()
    assert _ids(out, "duplicates", H[2]) == {"k6"} and _ids(out, "unique", H[2]) == {"k7"}


def _verify(cfg_path: Path) -> tuple[int, list[str]]:
    r = CliRunner().invoke(main, ["verify", "--config", str(cfg_path)])
    return r.exit_code, [line for line in r.output.splitlines() if line.startswith("VIOLATION")]


def test_verify_and_run_report_changed_landing_files_and_verify_a_doubled_key(
        spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`verify` compares each loaded hour's landing files with what its load read (path, size,
    content hash), not only row counts; `run` names late or changed files of loaded hours in one
    line each; a key unique in two hours is a violation."""
    from dedup_pipeline.engine.load import load_hours

    cfg_path = write_config(tmp_path, dataset_raw())
    ds = load_config(cfg_path).datasets[0]
    write_hour(ds, H[0], [_ev("k1"), _ev("k2")])
    gone = write_hour(ds, H[0], [_ev("k3")], name="part-1.jsonl")
    rewritten = write_hour(ds, H[1], [_ev("k1"), _ev("k6")])
    load_hours(spark, ds, H[:2])
    assert _verify(cfg_path) == (0, [])

    # the counts stay equal: one file lands late in 00 (k6, first loaded in 01), one is removed;
    # a file of 01 is rewritten with the same size and mtime; another is only touched
    write_hour(ds, H[0], [_ev("k6")], name="part-late.jsonl")
    gone.unlink()
    st = rewritten.stat()
    rewritten.write_text(rewritten.read_text().replace('"k1"', '"k9"'))
    os.utime(rewritten, ns=(st.st_atime_ns, st.st_mtime_ns))
    touched = write_hour(ds, H[1], [_ev("k7")], name="part-2.jsonl")
    code, violations = _verify(cfg_path)
    assert code == 1
    fix = f"dedup-pipeline run --config {cfg_path} --dataset clicks --from"
    assert violations == [
        f"VIOLATION: clicks: {H[0]}: landing files changed since the hour was loaded (new "
        f"part-late.jsonl; removed part-1.jsonl); reload {H[0]}..{H[1]} (through the latest "
        f"loaded hour, {H[1]}) in one run: {fix} {H[0]} --to {H[1]}, or in the UI asset "
        f"clicks/unique, Partitions tab, select {H[0]}..{H[1]}, Launch backfill",
        f"VIOLATION: clicks: {H[1]}: landing files changed since the hour was loaded (new "
        f"part-2.jsonl; changed part-0.jsonl); reload {H[1]} (through the latest loaded hour, "
        f"{H[1]}) in one run: {fix} {H[1]} --to {H[1]}, or in the UI asset clicks/unique, "
        f"Partitions tab, select {H[1]}, Materialize"]

    # `run` of the latest hour (allowed) takes in 01's files and reports 00's late input
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    os.utime(touched)  # mtime only, same content: not a change
    r = CliRunner().invoke(main, ["run", "--config", str(cfg_path), "--from", H[1], "--to", H[1]])
    assert r.exit_code == 0, r.output
    late = [line for line in r.output.splitlines() if line.startswith("late input:")]
    assert late == [f"late input: clicks {H[0]}: landing files changed since the hour was loaded "
                    f"(new part-late.jsonl; removed part-1.jsonl); reload {H[0]}..{H[1]} (through "
                    f"the latest loaded hour, {H[1]}) in one run: {fix} {H[0]} --to {H[1]}, or in "
                    f"the UI asset clicks/unique, Partitions tab, select {H[0]}..{H[1]}, Launch "
                    "backfill"]

    # a key unique in two hours (what reloading 00 alone used to leave): hour 01's record set
    # aside so the engine reloads 00 alone, then put back
    rec01 = Path(ds.output, "_commits", "load_hour=2026-11-01-01.json")
    aside = tmp_path / "rec01.json"
    rec01.rename(aside)
    load_hours(spark, ds, [H[0]])
    aside.rename(rec01)
    assert _ids(Path(ds.output), "unique", H[0]) & _ids(Path(ds.output), "unique", H[1]) == {"k6"}
    code, violations = _verify(cfg_path)
    assert code == 1
    assert (f"VIOLATION: clicks: {H[1]}: a key in unique is also unique in an earlier hour within "
            "the expiry window") in violations, violations


@pytest.mark.fast
def test_later_loaded_hours_are_found_across_gaps_and_damaged_records_do_not_count() -> None:
    from dedup_pipeline.engine.core.commits import later_loaded
    from dedup_pipeline.hours import HourSet, parse_hour

    committed = HourSet.of(["2026-11-01-00", "2026-11-01-01", "2026-11-01-02", "2026-11-01-05",
                            "2026-11-01-06"])
    hour = parse_hour("2026-11-01-01")
    assert [f"{h:%H}" for h in later_loaded(committed, hour, {"2026-11-01-01"})] == [
        "02", "05", "06"]
    assert [f"{h:%H}" for h in later_loaded(committed, hour, {"2026-11-01-01", "2026-11-01-02"},
                                            damaged={"2026-11-01-06"})] == ["05"]
    assert later_loaded(committed, parse_hour("2026-11-01-06"), set()) == []
    assert later_loaded(committed, parse_hour("2026-11-01-07"), set()) == []
    assert [f"{h:%H}" for h in later_loaded(committed, parse_hour("2026-10-31-23"), set())] == [
        "00", "01", "02", "05", "06"]
