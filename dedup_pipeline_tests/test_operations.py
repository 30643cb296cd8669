"""Operating it from Dagster: asset checks (D4), index recovery (R12, K3), the failure summary, and
one run at a time per dataset (R10). Real materializations on local Spark."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from click.testing import CliRunner
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from dedup_pipeline.cli import main
from dedup_pipeline.config import PipelineConfig
from dedup_pipeline.engine.core.index.health import IndexDamagedError, check_index
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.explain import explain_key
from dedup_pipeline.orchestration import runs
from dedup_pipeline.orchestration.definitions import build_definitions
from dedup_pipeline.orchestration.names import (
    PARTITION,
    RANGE_END,
    RANGE_START,
    SPARK_RESOURCE,
    load_job_name,
    rebuild_job_name,
    rebuild_op_name,
)
from dedup_pipeline.orchestration.recovery import build_recovery_sensor, build_run_end_sensor
from dedup_pipeline.orchestration.runner import run_range
from dedup_pipeline_tests.conftest import (
    SensorTicks,
    dataset_raw,
    pipeline_config,
    read_output,
    write_hour,
)
from dedup_pipeline_tests.faults import Faults, injected

REPO = Path(__file__).resolve().parents[1]
HOURS = [f"2026-11-01-{h:02d}:00" for h in range(5)]
OUTPUTS = ("unique", "duplicates", "expired", "rejected")


def _raw(**extra: object) -> dict:
    return dataset_raw(fingerprint=["url"], expiry={"column": "event_time", "period": "3h"}, **extra)


def _cfg(root: Path, **extra: object) -> PipelineConfig:
    return pipeline_config(root, _raw(**extra))


def _landing(cfg) -> None:
    """Five hours: replays of earlier hours, an in-batch conflict, a late (expired) record."""
    ds = cfg.datasets[0]
    for h in range(5):
        rows = [{"event_id": f"e{h}-{i}", "user_id": "u", "event_time": f"2026-11-01T{h:02d}:0{i}:00Z",
                 "url": "/a"} for i in range(4)]
        if h:
            rows.append({"event_id": f"e{h - 1}-0", "user_id": "u",
                         "event_time": f"2026-11-01T{h - 1:02d}:00:00Z", "url": "/a"})
            rows.append({"event_id": f"e{h - 1}-1", "user_id": "u",
                         "event_time": f"2026-11-01T{h - 1:02d}:01:00Z", "url": "/other"})
        if h == 4:
            rows.append({"event_id": "old", "user_id": "u", "event_time": "2026-10-31T20:00:00Z",
                         "url": "/a"})
        write_hour(ds, HOURS[h], rows)


def _snapshot(spark, ds) -> dict:
    snap = {}
    for name in OUTPUTS:
        for h in HOURS:
            rows = read_output(spark, ds, name, h[:13])
            for r in rows:  # the two sites differ in directory only
                r["_source_file"] = r["_source_file"].rsplit("/", 2)[-2:]
            snap[(name, h)] = sorted(tuple(sorted((k, str(v)) for k, v in r.items())) for r in rows)
    return snap


@pytest.fixture
def site(tmp_path: Path):
    cfg = _cfg(tmp_path / "a")
    _landing(cfg)
    return cfg


def _downstream(ds_name: str, pdef: dg.PartitionsDefinition) -> dg.AssetsDefinition:
    @dg.asset(key=["report"], deps=[dg.AssetKey([ds_name, "unique"])], partitions_def=pdef)
    def report() -> dg.MaterializeResult:
        return dg.MaterializeResult()

    return report


def _check_events(res: dg.ExecuteInProcessResult) -> dict[tuple[str, str | None], object]:
    out = {}
    for e in res.all_events:
        if e.event_type_value == "ASSET_CHECK_EVALUATION":
            ev = e.event_specific_data
            out[(ev.check_name, ev.partition)] = ev
    return out


def test_checks_pass_on_a_clean_hour(spark, site) -> None:
    job = build_definitions(site).resolve_job_def(load_job_name("clicks"))
    with dg.instance_for_test() as inst:
        res = job.execute_in_process(partition_key=HOURS[0], instance=inst)
        assert res.success
        evs = _check_events(res)
        names = {"conservation", "unique_keys", "index_agrees", "index_size", "duplicate_rate",
                 "conflict_rate", "rejected_rate"}
        assert {n for n, _ in evs} == names
        assert all(ev.passed for ev in evs.values())
        assert all(p == HOURS[0] for _, p in evs)


@pytest.mark.parametrize(("fault", "check"), [
    ("lose_row:unique", "conservation"),
    ("dup_row:unique", "unique_keys"),
    ("stale_row:unique", "unique_keys"),
    ("lose_row:index", "index_agrees"),
])
def test_blocking_check_failure_commits_nothing_and_stops_downstream(
        spark, site, fault: str, check: str) -> None:
    ds = site.datasets[0]
    defs = build_definitions(site)
    load = next(a for a in defs.assets if isinstance(a, dg.AssetsDefinition))
    report = _downstream("clicks", load.partitions_def)
    with dg.instance_for_test() as inst:
        assert dg.materialize([load, report], partition_key=HOURS[0], instance=inst,
                              resources={SPARK_RESOURCE: defs.resources[SPARK_RESOURCE]}).success
        with injected(Faults(fault)):
            res = dg.materialize([load, report], partition_key=HOURS[1], instance=inst,
                                 resources={SPARK_RESOURCE: defs.resources[SPARK_RESOURCE]},
                                 raise_on_error=False)
        assert not res.success
        asset = "index" if check == "index_agrees" else "unique"
        key = dg.AssetCheckKey(dg.AssetKey(["clicks", asset]), check)
        failed = [h.event.dagster_event.event_specific_data
                  for h in inst.event_log_storage.get_asset_check_execution_history(key, limit=10)
                  if h.status == AssetCheckExecutionRecordStatus.FAILED]
        assert failed, "the failed blocking check was not recorded"
        ev = failed[0]
        assert not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
        assert ev.partition == HOURS[1]
        assert inst.get_materialized_partitions(dg.AssetKey(["report"])) == {HOURS[0]}
        st = Storage(ds.output)
        assert not st.exists(st.path("_commits", "load_hour=2026-11-01-01.json"))
        assert not (Path(ds.output) / "unique" / "load_hour=2026-11-01-01").exists()
        # the hour is clean to rerun
        assert dg.materialize([load, report], partition_key=HOURS[1], instance=inst,
                              resources={SPARK_RESOURCE: defs.resources[SPARK_RESOURCE]}).success
    if check == "conservation":  # counts: no key to name
        assert "sample_keys" not in ev.metadata
        return
    # the keys that break the rule, and the command that explains the first (design.md, "Explaining a key")
    sample = ev.metadata["sample_keys"].value
    assert ev.metadata["explain"].value == (
        f"dedup-pipeline explain --config {site.config_file} --dataset clicks "
        f"--key event_id={sample[0]['event_id']}")
    if fault == "stale_row:unique":  # a replay of hour 0 written as unique: a key hour 0 kept
        assert len(sample) == 1 and sample[0]["event_id"] in {"e0-0", "e0-1"}
        home = "2026-11-01-00"
    else:  # a key of hour 1 twice in unique, or missing from the index
        assert len(sample) == 1 and sample[0]["event_id"] in {f"e1-{i}" for i in range(4)}
        home = "2026-11-01-01"
    ex = explain_key(ds, sample[0])
    assert (home, "unique", "first_seen") in {(o.load_hour, o.output, o.rule)
                                              for o in ex.occurrences}


def test_warn_checks_flag_thresholds_without_failing(spark, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, checks={"max_duplicate_rate": 0.1, "max_conflict_rate": 0.0,
                                 "max_rejected_rate": 0.0, "max_index_keys": 5})
    _landing(cfg)
    write_hour(cfg.datasets[0], HOURS[1], ["{broken"], name="part-9.jsonl")
    job = build_definitions(cfg).resolve_job_def(load_job_name("clicks"))
    with dg.instance_for_test() as inst:
        res = job.execute_in_process(instance=inst,
                                     tags={RANGE_START: HOURS[0], RANGE_END: HOURS[2]})
        assert res.success
        evs = _check_events(res)
        # hour 0: 4 unique, nothing else; hour 1: 4 new + 2 replays (1 conflict) + 1 broken line
        assert evs[("duplicate_rate", HOURS[0])].passed
        assert not evs[("duplicate_rate", HOURS[1])].passed  # 2/6 > 0.1
        assert not evs[("conflict_rate", HOURS[1])].passed
        assert not evs[("rejected_rate", HOURS[1])].passed
        assert evs[("rejected_rate", HOURS[2])].passed
        assert evs[("index_size", HOURS[0])].passed  # 4 entries
        assert not evs[("index_size", HOURS[2])].passed  # 8 read + 4 written > 5
        assert evs[("duplicate_rate", HOURS[1])].severity == dg.AssetCheckSeverity.WARN
        assert all(evs[(c, h)].passed for c in ("conservation", "unique_keys", "index_agrees")
                   for h in HOURS[:3])


def _load_all(cfg, inst) -> None:
    run = run_range(cfg, "clicks", HOURS[0], HOURS[-1], inst)
    assert run.success, run.error


def test_deleted_index_is_detected_rebuilt_and_later_loads_match(spark, tmp_path: Path) -> None:
    damaged, clean = _cfg(tmp_path / "d"), _cfg(tmp_path / "c")
    _landing(damaged)
    _landing(clean)
    defs = build_definitions(damaged)
    with dg.instance_for_test() as inst:
        _load_all(clean, inst)
        assert run_range(damaged, "clicks", HOURS[0], HOURS[2], inst).success
        ds = damaged.datasets[0]
        shutil.rmtree(Path(ds.output) / "index")
        # a load refuses to run on it, naming the fix
        run = run_range(damaged, "clicks", HOURS[3], HOURS[3], inst)
        assert not run.success and "IndexDamagedError" in run.error and "rebuild-index" in run.error
        # the recovery sensor requests a rebuild of exactly the damaged hours
        sensor = build_recovery_sensor(ds, defs.resolve_job_def(rebuild_job_name(ds.name)))
        result = sensor(dg.build_sensor_context(instance=inst))
        (req,) = result.run_requests
        assert req.run_config["ops"][rebuild_op_name("clicks")]["config"]["hours"] == HOURS[:3]
        again = sensor(dg.build_sensor_context(instance=inst))
        assert again.run_requests[0].run_key == req.run_key  # same damage, same key: no new run
        rebuild = defs.resolve_job_def(rebuild_job_name(ds.name))
        assert rebuild.execute_in_process(run_config=req.run_config, instance=inst).success
        assert check_index(Storage(ds.output), ds).ok
        assert isinstance(sensor(dg.build_sensor_context(instance=inst)), dg.SkipReason)
        assert run_range(damaged, "clicks", HOURS[3], HOURS[4], inst).success
    assert _snapshot(spark, ds) == _snapshot(spark, clean.datasets[0])


def test_corrupted_index_file_is_detected_and_self_heals_when_configured(
        spark, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path / "x")
    _landing(cfg)
    clean = _cfg(tmp_path / "c")
    _landing(clean)
    ds = cfg.datasets[0]
    with dg.instance_for_test() as inst:
        _load_all(clean, inst)
        assert run_range(cfg, "clicks", HOURS[0], HOURS[2], inst).success
        victim = sorted((Path(ds.output) / "index").rglob("load_hour=2026-11-01-01/*.parquet"))[0]
        victim.write_bytes(victim.read_bytes()[:-20])  # truncated: a corrupt file
        damage = check_index(Storage(ds.output), ds)
        assert damage.damaged_loads == ["2026-11-01-01"]
        with pytest.raises(IndexDamagedError):
            from dedup_pipeline.engine.load import load_hours
            load_hours(spark, ds, [HOURS[3]])
        healing = _cfg(tmp_path / "x", on_damaged_index="rebuild")
        assert run_range(healing, "clicks", HOURS[3], HOURS[4], inst).success
        assert check_index(Storage(ds.output), ds).ok
    assert _snapshot(spark, ds) == _snapshot(spark, clean.datasets[0])


def test_cli_rebuild_index(spark, site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    cfg_file = str(Path(site.config_file).resolve())
    with dg.instance_for_test() as inst:
        assert run_range(site, "clicks", HOURS[0], HOURS[1], inst).success
    ds = site.datasets[0]
    for f in (Path(ds.output) / "index").rglob("*.parquet"):
        f.unlink()
    assert not check_index(Storage(ds.output), ds).ok
    r = CliRunner().invoke(main, ["rebuild-index", "--config", cfg_file])
    assert r.exit_code == 0, r.output
    assert "done: index healthy" in r.output


def test_run_failure_summary_lands_in_the_runs_log(spark, site) -> None:
    with dg.instance_for_test() as inst:
        ends = SensorTicks(build_run_end_sensor(site.dataset("clicks")), inst)
        ends.tick()  # the first tick: it sees the run ends after it
        run = run_range(site, "clicks", HOURS[2], HOURS[2], inst)
        assert not run.success
        ends.tick()
        texts = [e.message for e in inst.all_logs(run.run_id)]
        summary = [t for t in texts if t and t.startswith("dedup_pipeline run failure")]
        assert len(summary) == 1
        assert "dataset clicks, hour(s) 2026-11-01-02:00." in summary[0]
        assert "order check" in summary[0] and summary[0].count("LoadOrderError") == 1
        assert "load the missing earlier hours first" in summary[0]
        # the step's own failure has the cause and both ways to fix it in front (the UI shows a
        # Failure's description first), the LoadOrderError with its traceback below, as its cause
        [step] = [e.dagster_event for e in inst.all_logs(run.run_id) if e.dagster_event
                  and e.dagster_event.is_step_failure]
        data = step.step_failure_data
        assert data.error.cls_name == "Failure" and data.error.cause.cls_name == "LoadOrderError"
        text = data.user_failure_data.description
        assert text.startswith(f"Load of clicks hour(s) {HOURS[2]} failed in the order check")
        assert "LoadOrderError" in text and "\n" not in text
        assert (f"open asset clicks/unique, Partitions tab, select {HOURS[0]}..{HOURS[2]} and "
                "Launch backfill") in text  # from the first hour not loaded
        # the command names the run's own config file (no DEDUP_CONFIG in this process)
        assert (f"dedup-pipeline run --config {site.datasets[0].config_file} --dataset clicks "
                f"--from {HOURS[0]} "
                f"--to {HOURS[2]}") in text
        assert run.error is not None and run.error.startswith("LoadOrderError")  # what the CLI says


def test_a_failed_run_retried_before_its_restatement_is_not_restated(spark, site) -> None:
    """The failure sensor restates the committed hours a failed load did not load, unless a later
    run (its retry) has materialized the hour since: that run's events stay the hour's latest."""
    from dedup_pipeline.engine.core.commit_log import CommitLog
    from dedup_pipeline.hours import format_tag
    from dedup_pipeline.orchestration.hour_events import restate_finished_run

    ds = site.dataset("clicks")
    with dg.instance_for_test() as inst:
        if not CommitLog(Storage(ds.output)).committed():
            assert run_range(site, "clicks", HOURS[0], HOURS[0], inst).success
        pk = format_tag(max(CommitLog(Storage(ds.output)).committed()))
        job = build_definitions(site).resolve_job_def(load_job_name("clicks"))

        def failed_run() -> dg.DagsterRun:
            run = inst.create_run_for_job(job, tags={PARTITION: pk})
            inst.report_run_failed(run)
            return inst.get_run_by_id(run.run_id)

        killed = failed_run()
        assert run_range(site, "clicks", pk, pk, inst).success  # its retry loads the hour
        assert restate_finished_run(inst, ds, killed) == []
        assert not [e for e in inst.all_logs(killed.run_id) if e.dagster_event
                    and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"]
        later = failed_run()  # nothing loaded the hour since: its committed load is restated
        assert restate_finished_run(inst, ds, later) == [pk]


@pytest.mark.slow
def test_two_concurrent_runs_never_interleave(spark, site, tmp_path: Path) -> None:
    """Two real `dedup-pipeline run` processes on one dataset: the second fails on the lock."""
    cfg_file = str(Path(site.config_file).resolve())
    env = {**os.environ, "DEDUP_SPARK_CONF_spark__ui__enabled": "false",
           "DEDUP_SPARK_CONF_spark__sql__shuffle__partitions": "2", "SPARK_MASTER_URL": "local[1]"}
    env.pop("DAGSTER_HOME", None)
    exe = str(Path(sys.executable).parent / "dedup-pipeline")
    first = subprocess.Popen([exe, "run", "--config", cfg_file, "--from", HOURS[0], "--to", HOURS[-1]],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        assert first.stdout is not None
        for line in first.stdout:  # wait until the first run holds the lock and is loading
            seen.append(line)
            if "rows in, classified" in line:
                break
        second = subprocess.run([exe, "run", "--config", cfg_file, "--from", HOURS[0],
                                 "--to", HOURS[0]], env=env, capture_output=True, text=True,
                                timeout=300)
        rest = first.communicate(timeout=600)[0]
    finally:
        first.kill()
    assert first.returncode == 0, "".join(seen) + rest
    assert second.returncode == 1
    assert "DatasetLockedError" in second.stdout + second.stderr
    assert "is locked by dagster run" in second.stdout + second.stderr
    r = CliRunner().invoke(main, ["verify", "--config", cfg_file])
    assert r.exit_code == 0, r.output


@pytest.mark.fast
def test_failure_summary_of_a_run_that_loads_no_dataset_says_so_plainly() -> None:
    """A check's own run (the UI's Execute of input_unchanged_since_load) or another job: one
    plain line, no guessed dataset, hours or stage."""
    check_run = dg.DagsterRun(job_name="__ASSET_JOB", run_id="r-check", asset_check_selection=frozenset(
        {dg.AssetCheckKey(dg.AssetKey(["clicks", "raw_batch"]), "input_unchanged_since_load")}))
    other = dg.DagsterRun(job_name="nightly_report", run_id="r-other")
    for run in (check_run, other):
        assert runs.dataset_of_run(run) is None
        text = runs.failure_summary(run, runs.RootError("ValueError", "boom"), "")
        assert text == (f"dedup_pipeline: run {run.run_id} of {run.job_name} failed; it loads no "
                        "dataset hour, so no dataset's state changed. Error: ValueError: boom")


@pytest.mark.fast
def test_failure_summary_of_a_load_without_a_partition_asks_for_the_hours() -> None:
    """A load launched with no hour (the launchpad allows it after a warning) fails in Dagster's
    own step set-up with an error about partition keys: the summary says what happened and how
    to pick the hours, not an infrastructure failure of every committed hour."""
    run = dg.DagsterRun(job_name="__ASSET_JOB", run_id="r-load", asset_selection=frozenset(
        dg.AssetKey(["clicks", o]) for o in ("unique", "duplicates", "expired", "rejected", "index")))
    err = runs.RootError("DagsterInvariantViolationError",
                         "Cannot access partition_key for a non-partitioned run")
    text = runs.failure_summary(run, err, "", "/etc/dedup.yaml")
    assert text.startswith("dedup_pipeline run failure: A load of clicks needs the hours to load: "
                           "this run has no partition"), text
    assert "in the UI, open asset clicks/unique" in text
    assert "dedup-pipeline run --config /etc/dedup.yaml --dataset clicks --from FIRST --to LAST" in text
    assert "infrastructure" not in text and "every committed hour" not in text, text


@pytest.mark.fast
def test_every_column_and_check_is_described_in_plain_words(tmp_path: Path) -> None:
    """The UI's Columns tables: every column of every output and of the index has a description;
    source columns say where they come from and their declared type; descriptions of assets and
    checks start with words, not a rule id."""
    cfg = _cfg(tmp_path)
    ds = cfg.datasets[0]
    defs = build_definitions(cfg)
    graph = defs.resolve_asset_graph()
    seen = set()
    for name in ("unique", "duplicates", "expired", "rejected", "index"):
        node = graph.get(dg.AssetKey(["clicks", name]))
        assert node.description and not re.match(r"\(?R\d", node.description), node.description
        schema = node.metadata["dagster/column_schema"]
        for col in schema.columns:
            assert col.description, (name, col.name)
            if col.name in ds.source.schema:
                assert col.description.startswith(
                    f"From the landing files, declared type {ds.source.schema[col.name]}"), col
            seen.add(col.name)
    assert {"_source_file", "_duplicate_kind", "_first_load_hour", "_expiry_point",
            "_reject_reason", "_raw", "_h1", "_h2", "_load_hour"} <= seen
    for spec in graph.asset_check_keys:
        desc = graph.get_check_spec(spec).description or ""
        assert desc and not re.match(r"\(?R\d", desc), (spec, desc)
