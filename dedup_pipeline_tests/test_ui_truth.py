"""What the Dagster UI shows per hour, read the way the UI reads it.

Check status per partition: `event_log_storage.get_asset_check_state`, the call behind the check's
Partitions tab (dagster_graphql/schema/asset_checks.py -> AssetCheckState.gen). Per-hour figures:
each partition's latest materialization, which Plots -> Partitions plots.
Launch paths here: `dedup-pipeline run` over a range (runner), a single hour, the hourly schedule's
and the reconcile schedule's run requests, the index rebuild job, a lock collision and an order
failure. The UI launches and the sensor under a real daemon are in test_ui_server.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionResolvedStatus

from dedup_pipeline.config import PipelineConfig
from dedup_pipeline.engine.core.lock import Lock
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.orchestration import runs
from dedup_pipeline.orchestration.assets import build_dataset_defs
from dedup_pipeline.orchestration.checks import CHECKS
from dedup_pipeline.orchestration.definitions import build_definitions
from dedup_pipeline.orchestration.names import (
    PARTITION,
    RANGE_END,
    RANGE_START,
    WRITTEN,
    hourly_schedule_name,
    load_job_name,
    rebuild_job_name,
)
from dedup_pipeline.orchestration.partitions import hourly_partitions
from dedup_pipeline.orchestration.runner import run_range
from dedup_pipeline.orchestration.schedules import build_reconcile_schedule
from dedup_pipeline.orchestration.sensors import build_landing_sensor
from dedup_pipeline_tests.conftest import write_hour
from dedup_pipeline_tests.test_dagster import _cfg, _ev

OUTPUTS = WRITTEN
H = [f"2026-11-01-{h:02d}:00" for h in range(6)]
Status = AssetCheckExecutionResolvedStatus


def check_statuses(inst: dg.DagsterInstance, cfg: PipelineConfig) -> dict[str, dict[Status, set[str]]]:
    """check name -> status -> partitions, as the check's Partitions tab gets them."""
    ds = cfg.datasets[0]
    pdef = hourly_partitions(ds)
    keys = [dg.AssetCheckKey(dg.AssetKey([ds.name, asset]), name) for name, (asset, _, _) in CHECKS.items()]
    states = inst.event_log_storage.get_asset_check_state([(k, pdef) for k in keys])
    return {k.name: {s: set(sub.subset_value.get_partition_keys())
                     for s, sub in states[k].subsets.items() if not sub.is_empty}
            for k in keys}


def latest_metadata(inst: dg.DagsterInstance, asset: str, pk: str) -> dict[str, object]:
    recs = inst.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(["clicks", asset]), asset_partitions=[pk]),
        limit=1).records
    assert recs, f"no materialization of clicks/{asset} for {pk}"
    return {k: v.value for k, v in recs[0].asset_materialization.metadata.items()}


def assert_ui_truth(inst: dg.DagsterInstance, cfg: PipelineConfig, expected: dict[str, dict[str, int]],
                    not_loaded: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """Every hour of `expected` (hour -> {rows_in, unique, ...}) shows Passed for every check and
    its own figures on every output's latest materialization; `not_loaded` hours show neither."""
    loaded = set(expected)
    for name, by_status in check_statuses(inst, cfg).items():
        assert by_status.get(Status.SUCCEEDED, set()) == loaded, (name, by_status)
        for s in (Status.SKIPPED, Status.IN_PROGRESS, Status.FAILED):
            assert not by_status.get(s), (name, s, by_status)
        assert not (by_status.get(Status.EXECUTION_FAILED, set()) & loaded), (name, by_status)
    for pk, figures in expected.items():
        for asset in OUTPUTS:
            md = latest_metadata(inst, asset, pk)
            for k, v in figures.items():
                assert md[k] == v, (asset, pk, k, md)
            assert "range_hours" not in md
            assert md["dagster/row_count"] == (figures["unique"] if asset == "index" else figures[asset])
            assert isinstance(md["latest_point"], float)  # a timestamp (seconds), not micros
            assert md["latest_point"] < 2e10
    for pk in not_loaded:
        for by_status in check_statuses(inst, cfg).values():
            assert pk not in by_status.get(Status.SUCCEEDED, set())


@pytest.mark.slow
def test_every_in_process_launch_path_shows_each_hour(tmp_path: Path, monkeypatch, spark) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path)
    ds = cfg.datasets[0]
    # hour h: 3 new events (one sent twice) -> rows_in 4, unique 3, duplicates 1
    for h in range(5):
        write_hour(ds, H[h], [_ev(10 * h + 1, h), _ev(10 * h + 2, h), _ev(10 * h + 2, h),
                              _ev(10 * h + 3, h)])
    fig = {"rows_in": 4, "unique": 3, "duplicates": 1, "expired": 0, "rejected": 0}
    defs = build_definitions(cfg)
    with dg.instance_for_test() as inst:
        # `dedup-pipeline run` over a range: one run, three hours
        assert run_range(cfg, "clicks", H[0], H[2], inst).success
        assert_ui_truth(inst, cfg, {h: fig for h in H[:3]})

        # the hourly schedule's request for H3 (one partition), run as the daemon would
        job = defs.resolve_job_def(load_job_name("clicks"))
        hourly = defs.resolve_schedule_def(hourly_schedule_name(ds.name))
        tick = hourly.evaluate_tick(dg.build_schedule_context(
            instance=inst, scheduled_execution_time=datetime(2026, 11, 1, 4, 5, tzinfo=UTC)))
        (req,) = tick.run_requests or []
        assert req.partition_key == H[3]
        assert job.execute_in_process(instance=inst, partition_key=req.partition_key,
                                      tags=req.tags).success
        assert_ui_truth(inst, cfg, {h: fig for h in H[:4]})

        # a lock collision (another run holds the dataset) on loaded hours: the run fails and
        # records nothing that changes those hours' status
        with Lock(Storage(ds.output), owner="test"):
            res = run_range(cfg, "clicks", H[2], H[3], inst)
        assert not res.success and "DatasetLockedError" in (res.error or "")
        assert_ui_truth(inst, cfg, {h: fig for h in H[:4]})

        # an order failure (H5 before H4): H5 is not shown Passed; H0..H3 unchanged
        res = run_range(cfg, "clicks", H[5], H[5], inst)
        assert not res.success and "LoadOrderError" in (res.error or "")
        assert_ui_truth(inst, cfg, {h: fig for h in H[:4]}, not_loaded={H[5]})

        # the reconcile schedule: H1 gets a late file -> one ranged run reloads H1..H3
        write_hour(ds, H[1], [_ev(900, 1)], name="part-late.jsonl")
        rec_sched = build_reconcile_schedule(ds, load_job_name("clicks"))
        req = rec_sched.evaluate_tick(dg.build_schedule_context(
            instance=inst, scheduled_execution_time=datetime(2026, 11, 2, 0, 30, tzinfo=UTC))).run_requests
        assert req and (req[0].tags[RANGE_START],
                        req[0].tags[RANGE_END]) == (H[1], H[3])
        assert job.execute_in_process(instance=inst, tags=req[0].tags).success
        assert_ui_truth(inst, cfg, {**{h: fig for h in H[:4]},
                                    H[1]: {**fig, "rows_in": 5, "unique": 4}})

        # H4 through the range runner again (the CLI path), then the rebuild job: the rebuild
        # leaves every hour's status and figures as they were
        assert run_range(cfg, "clicks", H[4], H[4], inst).success
        expected = {**{h: fig for h in H[:5]}, H[1]: {**fig, "rows_in": 5, "unique": 4}}
        assert_ui_truth(inst, cfg, expected)
        rebuild = defs.resolve_job_def(rebuild_job_name(ds.name))
        assert rebuild.execute_in_process(instance=inst).success
        assert_ui_truth(inst, cfg, expected)


def test_a_ui_run_without_our_tags_is_the_datasets_run(tmp_path: Path, monkeypatch) -> None:
    """A UI launch (`__ASSET_JOB`, no dedup_pipeline tags) in flight: the landing sensor and the
    reconcile schedule launch nothing; the failure summary still names dataset, hour, cause, fix."""
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path)
    ds = cfg.datasets[0]
    write_hour(ds, H[0], [_ev(1, 0)])
    ui_run = dg.DagsterRun(
        job_name="__ASSET_JOB", run_id="ui-run-1", status=dg.DagsterRunStatus.STARTED,
        asset_selection=frozenset(dg.AssetKey(["clicks", o]) for o in OUTPUTS),
        tags={PARTITION: H[0]})
    assert runs.dataset_of_run(ui_run) == "clicks"
    with dg.instance_for_test() as inst:
        inst.add_run(ui_run)
        sensor = build_landing_sensor(ds, build_dataset_defs(ds).job,
                                      clock=lambda: datetime(2026, 11, 1, 3, 0, tzinfo=UTC))
        res = sensor.evaluate_tick(dg.build_sensor_context(instance=inst))
        assert not res.run_requests
        assert "waiting for __ASSET_JOB run ui-run-1 (hours 2026-11-01-00:00)" in (res.skip_message or "")
        sched = build_reconcile_schedule(ds, load_job_name("clicks"))
        tick = sched.evaluate_tick(dg.build_schedule_context(
            instance=inst, scheduled_execution_time=datetime(2026, 11, 2, 0, 30, tzinfo=UTC)))
        assert not tick.run_requests and "ui-run-1" in (tick.skip_message or "")

    err = runs.RootError("DatasetLockedError", "dataset at warehouse is locked by dagster run x")
    text = runs.failure_summary(ui_run, err, "")
    assert "dataset clicks, hour(s) 2026-11-01-00:00" in text
    assert text.count("DatasetLockedError") == 1 and "wait for the other run" in text
    assert "another run of clicks held it" in text and "{" not in text  # every name filled in
    order = runs.failure_summary(ui_run, runs.RootError("LoadOrderError", "cannot load"), "")
    assert "load the missing earlier hours first" in order and "rerunning it is safe" not in order
