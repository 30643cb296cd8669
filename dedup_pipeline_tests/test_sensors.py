"""Landing sensor, schedules and the late-input check (design.md D2, R10, R11) against a real Dagster test
instance, with the requested runs executed for real on local Spark between ticks."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from dedup_pipeline.config import PipelineConfig
from dedup_pipeline.engine.core import landing
from dedup_pipeline.engine.core.commits import CommitRecord
from dedup_pipeline.hours import parse_hour, to_tag
from dedup_pipeline.orchestration.assets import build_dataset_defs
from dedup_pipeline.orchestration.definitions import build_definitions
from dedup_pipeline.orchestration.landing_checks import CHECK_NAME, build_input_check
from dedup_pipeline.orchestration.names import (
    RANGE_END,
    RANGE_START,
    TRIGGER_TAG,
    hourly_schedule_name,
    input_check_job_name,
    landing_sensor_name,
    load_job_name,
    rebuild_job_name,
    reconcile_schedule_name,
)
from dedup_pipeline.orchestration.sensors import build_landing_sensor
from dedup_pipeline_tests.conftest import (
    NOTHING,
    dataset_raw,
    pipeline_config,
    read_output,
    write_hour,
)

H = [f"2026-11-01-{h:02d}:00" for h in range(6)]
SENSOR, HOURLY, RECONCILE = (landing_sensor_name("clicks"), hourly_schedule_name("clicks"),
                             reconcile_schedule_name("clicks"))
JOB = load_job_name("clicks")
OUTPUTS = ("unique", "duplicates", "expired", "rejected")


def _cfg(tmp: Path, **landing_cfg: Any) -> PipelineConfig:
    extra: dict[str, Any] = {"landing": landing_cfg} if landing_cfg else {}
    return pipeline_config(tmp, dataset_raw(start=H[0], fingerprint=["url"],
                                            expiry={"column": "event_time", "period": "24h"},
                                            **extra))


def _ev(i: int, hour: int, url: str = "/a") -> dict[str, str]:
    return {"event_id": f"e{i}", "user_id": "u", "event_time": f"2026-11-01T{hour:02d}:10:00Z",
            "url": url}


def _marker(cfg: PipelineConfig, hour: str) -> None:
    ds = cfg.datasets[0]
    d = Path(ds.source.path) / f"date={hour[:10]}" / f"hour={hour[11:13]}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "_SUCCESS").write_text("")


def _tick(defs: dg.Definitions, inst: dg.DagsterInstance, cursor: str | None,
          sensor: dg.SensorDefinition | None = None) -> dg.SensorResult:
    sensor = sensor or defs.resolve_sensor_def(SENSOR)
    # contexts are closed explicitly: one closed late (by GC) would re-install the Dagster state
    # storage of an instance that is gone, and a later test that loads definitions fails
    with dg.build_sensor_context(instance=inst, cursor=cursor, definitions=defs) as ctx:
        result = sensor(ctx)
    assert isinstance(result, dg.SensorResult)
    return result


def _schedule_tick(inst: dg.DagsterInstance, schedule: dg.ScheduleDefinition,
                   when: datetime) -> Any:
    """One evaluation (Dagster's ScheduleExecutionData: run_requests, skip_message)."""
    with dg.build_schedule_context(instance=inst, scheduled_execution_time=when) as ctx:
        return schedule.evaluate_tick(ctx)


def _run(defs: dg.Definitions, inst: dg.DagsterInstance, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
    """Execute a requested run as the daemon would: the load job with the request's tags and
    its run key as Dagster's run-key tag."""
    job = defs.resolve_job_def(request.job_name or JOB)
    tags = {**request.tags, **({"dagster/run_key": request.run_key} if request.run_key else {})}
    return job.execute_in_process(instance=inst, tags=tags, raise_on_error=False,
                                  partition_key=request.partition_key)


def _check_runs(res: dg.SensorResult) -> list[dg.RunRequest]:
    """The tick's runs of the input check (and nothing else)."""
    assert res.run_requests and all(r.job_name == input_check_job_name("clicks")
                                    for r in res.run_requests), res
    return list(res.run_requests)


def _only_request(res: dg.SensorResult) -> dg.RunRequest:
    assert res.skip_reason is None and len(res.run_requests) == 1, res
    return res.run_requests[0]


def _requested_hours(req: dg.RunRequest) -> tuple[str, str]:
    """First and last hour of a load request: one hour is a single-partition run (no range tags),
    several a ranged run (no partition key)."""
    if req.partition_key is not None:
        assert RANGE_START not in req.tags and RANGE_END not in req.tags, req.tags
        return req.partition_key, req.partition_key
    return req.tags[RANGE_START], req.tags[RANGE_END]


def _skip(res: dg.SensorResult) -> str:
    assert not res.run_requests, res.run_requests
    assert res.skip_reason is not None
    return res.skip_reason.skip_message or ""


def test_landing_sensor_requests_each_complete_hour_once_in_order(spark, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    ds = cfg.datasets[0]
    write_hour(ds, H[0], [_ev(1, 0), _ev(2, 0)])
    write_hour(ds, H[1], [_ev(3, 1), _ev(1, 1)])
    write_hour(ds, H[2], [_ev(4, 2)])
    _marker(cfg, H[0])
    _marker(cfg, H[1])
    defs = build_definitions(cfg)
    with dg.instance_for_test() as inst:
        res = _tick(defs, inst, None)
        req = _only_request(res)
        assert req.run_key == f"clicks:{H[0]}..{H[1]}"
        assert req.job_name == JOB
        assert (req.tags[RANGE_START], req.tags[RANGE_END]) == (H[0], H[1])
        cursor = res.cursor
        # as the daemon would, create the run: while it is not finished the sensor waits for it
        job = defs.resolve_job_def(req.job_name)
        queued = inst.create_run_for_job(job, status=dg.DagsterRunStatus.NOT_STARTED,
                                         tags={**job.tags, **req.tags,
                                               "dagster/run_key": req.run_key or ""})
        assert f"run {queued.run_id} (hours {H[0]}..{H[1]}), NOT_STARTED" in _skip(_tick(defs, inst, cursor))
        # the same tick again while the run exists: nothing is requested twice
        assert "waiting for" in _skip(_tick(defs, inst, cursor))
        inst.delete_run(queued.run_id)
        # the run deleted before it ran (from the UI): its hours are requested again
        res = _tick(defs, inst, cursor)
        req = _only_request(res)
        assert req.run_key.startswith(f"clicks:{H[0]}..{H[1]}:again:")
        assert _requested_hours(req) == (H[0], H[1])
        assert _only_request(_tick(defs, inst, cursor)).run_key == req.run_key  # a repeated tick
        cursor = res.cursor
        assert _run(defs, inst, req).success

        # hour 2 has data but no marker: wait for it, naming the hour; a restarted daemon
        # (no cursor) knows hours 0..1 are loaded from the commit records, not from the cursor
        for cur in (cursor, None):
            res = _tick(defs, inst, cur)
            msg = _skip(res)
            assert "waiting for _SUCCESS" in msg and f"hour {H[2]}" in msg
        _marker(cfg, H[2])
        res = _tick(defs, inst, cursor)
        req = _only_request(res)
        assert req.run_key == f"clicks:{H[2]}..{H[2]}"
        # one hour: a single-partition run (no range tags), as the UI's Materialize of the hour
        assert req.partition_key == H[2] and _requested_hours(req) == (H[2], H[2])
        assert req.tags[TRIGGER_TAG] == SENSOR
        cursor = res.cursor
        # the requested run fails (another host holds the dataset lock): surfaced, not retried
        lock = Path(ds.output) / "_lock"
        lock.write_text(json.dumps({"host": "elsewhere", "pid": 1, "owner": "other", "since": "x"}))
        failed = _run(defs, inst, req)
        assert not failed.success
        msg = _skip(_tick(defs, inst, cursor))
        assert f"hour(s) {H[2]} were requested but are not loaded" in msg
        assert failed.run_id in msg and "DatasetLockedError" in msg
        lock.unlink()
        assert _run(defs, inst, req).success  # re-executing the run unblocks the sensor

        # hour 3: no files, no marker -> waited for, never skipped over
        assert f"hour {H[3]}" in _skip(_tick(defs, inst, cursor))

        # a file lands in hour 1 after it was loaded: one run of the input check records the
        # WARN on 01:00 (a run, not a runless event: see orchestration/sensors.py); later ticks name it
        write_hour(ds, H[1], [_ev(5, 1)], name="part-1.jsonl")
        res = _tick(defs, inst, cursor)
        [check] = _check_runs(res)
        [ev] = _run(defs, inst, check).get_asset_check_evaluations()
        assert (ev.check_name, ev.partition, ev.passed, ev.severity) == (
            CHECK_NAME, H[1], False, dg.AssetCheckSeverity.WARN)
        assert ev.metadata["files_added"].value == 1
        msg = _skip(again := _tick(defs, inst, res.cursor))
        assert f"late input for already-loaded hour(s) {H[1]}" in msg
        assert f"To take it in: reload {H[1]}" in msg
        assert "latest loaded hour, " in msg and f"--from {H[1]} --to " in msg
        assert H[1] in msg and not again.run_requests


def test_hours_whose_load_failed_on_index_damage_are_requested_again_after_a_rebuild(
        spark, tmp_path: Path) -> None:
    """A load that failed is not retried blindly, but once an index rebuild of the dataset has
    succeeded after it (the fix an index-damage failure names; the recovery sensor launches it),
    the hours are requested again: once per rebuild, under a new run key."""
    cfg = _cfg(tmp_path)
    ds = cfg.datasets[0]
    for h in range(3):
        write_hour(ds, H[h], [_ev(10 * h + 1, h), _ev(1, h)])
        _marker(cfg, H[h])
    defs = build_definitions(cfg)
    with dg.instance_for_test() as inst:
        res = _tick(defs, inst, None)
        assert _run(defs, inst, _only_request(res)).success  # hours 0..2
        write_hour(ds, H[3], [_ev(31, 3), _ev(1, 3)])
        _marker(cfg, H[3])
        res = _tick(defs, inst, res.cursor)
        req = _only_request(res)
        shutil.rmtree(Path(ds.output) / "index")  # the index deleted before the load reads it
        failed = _run(defs, inst, req)
        assert not failed.success
        msg = _skip(_tick(defs, inst, res.cursor))
        assert f"hour(s) {H[3]} were requested but are not loaded" in msg
        assert f"latest load of the dataset is {JOB} run {failed.run_id}" in msg
        assert "IndexDamagedError" in msg
        rebuild = defs.resolve_job_def(rebuild_job_name("clicks")).execute_in_process(
            instance=inst, raise_on_error=False)
        assert rebuild.success
        res = _tick(defs, inst, res.cursor)
        again = _only_request(res)
        assert again.run_key == f"clicks:{H[3]}..{H[3]}:after:{rebuild.run_id}"
        assert _requested_hours(again) == (H[3], H[3])
        assert _run(defs, inst, again).success
        got = {r["event_id"] for r in read_output(spark, ds, "unique", H[3])}
        assert got == {"e31"}
        assert {r["event_id"] for r in read_output(spark, ds, "duplicates", H[3])} == {"e1"}
        # a second failure with no rebuild after it stays surfaced, not retried
        write_hour(ds, H[4], [_ev(41, 4)])
        _marker(cfg, H[4])
        res = _tick(defs, inst, res.cursor)
        req = _only_request(res)
        lock = Path(ds.output) / "_lock"
        lock.write_text(json.dumps({"host": "elsewhere", "pid": 1, "owner": "other", "since": "x"}))
        assert not _run(defs, inst, req).success
        assert "DatasetLockedError" in _skip(_tick(defs, inst, res.cursor))
        assert "DatasetLockedError" in _skip(_tick(defs, inst, res.cursor))


def test_reconcile_reprocessing_equals_a_load_that_had_all_files(spark, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path / "late")
    ds = cfg.datasets[0]
    write_hour(ds, H[0], [_ev(1, 0), _ev(2, 0), "{oops"])
    write_hour(ds, H[1], [_ev(3, 1), _ev(1, 1, "/b")])
    write_hour(ds, H[2], [_ev(6, 2), _ev(7, 2), _ev(3, 2)])
    for h in H[:3]:
        _marker(cfg, h)
    defs = build_definitions(cfg)
    with dg.instance_for_test() as inst:
        res = _tick(defs, inst, None)
        assert _run(defs, inst, _only_request(res)).success
        cursor = res.cursor
        sched = defs.resolve_schedule_def(RECONCILE)
        tick_at = datetime(2026, 11, 22, 0, 30, tzinfo=UTC)
        assert not _schedule_tick(inst, sched, tick_at).run_requests  # nothing changed yet

        # late file for hour 1: a replay of e2 (hour 0), e6 (first seen in hour 2 so far), new e8
        write_hour(ds, H[1], [_ev(6, 1), _ev(2, 0, "/c"), _ev(8, 1)], name="part-late.jsonl")
        assert [c.key for c in landing.changed_hours(ds)] == [H[1]]
        res = _tick(defs, inst, cursor)
        [check] = _check_runs(res)
        assert [(e.partition, e.passed) for e in _run(defs, inst, check).get_asset_check_evaluations()
                ] == [(H[1], False)]
        cursor = res.cursor
        # the check also runs on its own, per partition, from the files alone
        check_job = dg.Definitions.merge(defs, dg.Definitions(jobs=[dg.define_asset_job(
            "input_check", selection=dg.AssetSelection.checks(build_input_check(ds)))]))
        for hour, passed in ((H[0], True), (H[1], False)):
            run = check_job.resolve_job_def("input_check").execute_in_process(
                instance=inst, tags={"dagster/partition": hour})
            [ev] = run.get_asset_check_evaluations()
            assert (ev.partition, ev.passed, ev.severity) == (hour, passed, dg.AssetCheckSeverity.WARN)

        [req] = _schedule_tick(inst, sched, tick_at).run_requests
        assert (req.tags[RANGE_START], req.tags[RANGE_END]) == (H[1], H[2])
        assert req.job_name == JOB and req.run_key.startswith(f"clicks:reconcile:{H[1]}..")
        assert _run(defs, inst, req).success
        assert not _schedule_tick(inst, sched, tick_at).run_requests
        res = _tick(defs, inst, cursor)  # the WARN turns green; nothing left to report
        [check] = _check_runs(res)
        assert [(e.partition, e.passed) for e in _run(defs, inst, check).get_asset_check_evaluations()
                ] == [(H[1], True)]
        assert "late input" not in _skip(_tick(defs, inst, res.cursor))

    # the same files, all there from the start, loaded once in another place
    clean_cfg = _cfg(tmp_path / "clean")
    clean = clean_cfg.datasets[0]
    shutil.copytree(ds.source.path, clean.source.path)
    with dg.instance_for_test() as inst:
        assert _run(build_definitions(clean_cfg), inst, dg.RunRequest(
            job_name=JOB, tags={RANGE_START: H[0], RANGE_END: H[2]})).success

    def rows(d: Any, output: str, hour: str) -> Counter:
        out = Counter()
        for r in read_output(spark, d, output, hour):
            r["_source_file"] = os.path.relpath(r["_source_file"].removeprefix("file:"), d.source.path)
            out[tuple(sorted(r.items()))] += 1
        return out

    for hour in H[:3]:
        for output in OUTPUTS:
            assert rows(ds, output, hour) == rows(clean, output, hour), (hour, output)
    index = [Counter(tuple(sorted(r.asDict().items())) for r in spark.read.parquet(f"{d.output}/index")
                     .collect()) for d in (ds, clean)]
    assert index[0] == index[1]
    # and the late file mattered beyond its own hour: e6 is now a duplicate in hour 2
    dups2 = {(r["event_id"], r["_first_load_hour"]) for r in read_output(spark, ds, "duplicates", H[2])}
    assert ("e6", "2026-11-01-01") in dups2


def test_completeness_rules_with_a_fixed_clock(tmp_path: Path) -> None:
    """marker configured: marker + hour ended; `marker: null`: hour end + grace. No Spark."""
    cfg = _cfg(tmp_path)
    ds = cfg.datasets[0]
    write_hour(ds, H[0], [_ev(1, 0)])
    _marker(cfg, H[0])
    h0 = parse_hour(H[0])
    assert not landing.is_complete(ds, h0, datetime(2026, 11, 1, 0, 59, tzinfo=UTC))  # not ended
    assert landing.is_complete(ds, h0, datetime(2026, 11, 1, 1, 0, tzinfo=UTC))
    assert not landing.is_complete(ds, parse_hour(H[1]), datetime(2026, 11, 9, tzinfo=UTC))  # no marker

    null_cfg = _cfg(tmp_path / "null", marker=None, grace="20m")
    nds = null_cfg.datasets[0]
    write_hour(nds, H[0], [_ev(1, 0)])
    write_hour(nds, H[1], [_ev(2, 1)])
    assert not landing.is_complete(nds, h0, datetime(2026, 11, 1, 1, 19, 59, tzinfo=UTC))
    assert landing.is_complete(nds, h0, datetime(2026, 11, 1, 1, 20, tzinfo=UTC))
    ready = landing.ready_hours(nds, h0, datetime(2026, 11, 1, 2, 19, tzinfo=UTC))
    assert ready.hours == [h0] and ready.blocked_at == parse_hour(H[1])
    assert "2026-11-01 02:20:00Z" in ready.blocked_why

    # the same rule through the sensor, with its clock pinned
    defs = build_definitions(null_cfg)
    with dg.instance_for_test() as inst:
        for now, expected in ((datetime(2026, 11, 1, 1, 19, tzinfo=UTC), None),
                              (datetime(2026, 11, 1, 2, 19, tzinfo=UTC), (H[0], H[0])),
                              (datetime(2026, 11, 1, 4, 20, tzinfo=UTC), (H[0], H[3]))):
            sensor = build_landing_sensor(nds, build_dataset_defs(nds).job, clock=lambda now=now: now)
            res = _tick(defs, inst, None, sensor)
            if expected is None:
                assert "complete at 2026-11-01 01:20:00Z" in _skip(res)
            else:
                req = _only_request(res)
                assert _requested_hours(req) == expected


def test_defaults_and_hourly_schedule(tmp_path: Path) -> None:
    defs = build_definitions(_cfg(tmp_path, grace="10m"))
    assert defs.resolve_sensor_def(SENSOR).default_status == dg.DefaultSensorStatus.RUNNING
    assert defs.resolve_sensor_def(SENSOR).minimum_interval_seconds == 30
    often = build_definitions(_cfg(tmp_path / "often", check_every="10s"))
    assert often.resolve_sensor_def(SENSOR).minimum_interval_seconds == 10
    hourly = defs.resolve_schedule_def(HOURLY)
    reconcile = defs.resolve_schedule_def(RECONCILE)
    assert hourly.default_status == reconcile.default_status == dg.DefaultScheduleStatus.STOPPED
    assert hourly.cron_schedule == "10 * * * *" and reconcile.cron_schedule == "30 0 * * *"
    with dg.instance_for_test() as inst:
        [req] = _schedule_tick(inst, hourly, datetime(2026, 11, 1, 5, 10, tzinfo=UTC)).run_requests
    assert req.job_name == JOB and req.partition_key == H[4]


def test_reconcile_range_also_closes_a_gap(tmp_path: Path) -> None:
    """A reload that failed half-way leaves a gap before the latest loaded hour: start there."""
    ds = _cfg(tmp_path).datasets[0]
    plan = landing.reprocess_range(ds, {"2026-11-01-00", "2026-11-01-02", "2026-11-01-03"})
    assert plan is not None and (plan.first, plan.last) == (parse_hour(H[1]), parse_hour(H[3]))
    assert landing.reprocess_range(ds, {"2026-11-01-00", "2026-11-01-01"}) is None
    assert landing.reprocess_range(ds, set()) is None


@pytest.mark.parametrize("change", ["added", "removed", "modified"])
def test_input_change_kinds(tmp_path: Path, change: str) -> None:
    """Compares current landing files with a commit record's `inputs` (no Spark needed)."""
    cfg = _cfg(tmp_path)
    ds = cfg.datasets[0]
    f0 = write_hour(ds, H[0], [_ev(1, 0)])
    f1 = write_hour(ds, H[0], [_ev(2, 0)], name="part-1.jsonl")
    h0 = parse_hour(H[0])
    record = CommitRecord(**{**NOTHING, "inputs": tuple(landing.list_input_files(ds, h0))},
                          dataset=ds.name, partition_key=H[0], load_hour=to_tag(h0), rows_in=0,
                          unique=0, duplicates=0, expired=0, rejected=0)
    assert landing.input_change(ds, h0, record) is None
    if change == "added":
        write_hour(ds, H[0], [_ev(3, 0)], name="part-2.jsonl")
    elif change == "removed":
        f1.unlink()
    else:
        f0.write_text(f0.read_text() + json.dumps(_ev(4, 0)) + "\n")
    diff = landing.input_change(ds, h0, record)
    assert diff is not None and len(getattr(diff, change)) == 1


@pytest.mark.fast
def test_a_failing_late_input_comparison_does_not_stop_the_loads(tmp_path: Path, monkeypatch,
                                                               capfd: pytest.CaptureFixture) -> None:
    """Anything but the loads may fail in a tick: the complete hours are still requested, and the
    error is logged once per cause, not on every tick. No Spark."""
    cfg = _cfg(tmp_path)
    ds = cfg.datasets[0]
    for i, h in enumerate(H[:2]):
        write_hour(ds, h, [_ev(i, i)])
        _marker(cfg, h)

    def broken(*_a: Any, **_k: Any) -> Any:
        raise OSError("landing listing refused: permission denied")

    monkeypatch.setattr(landing, "changed_hours", broken)
    defs = build_definitions(cfg)
    with dg.instance_for_test() as inst:
        capfd.readouterr()
        res = _tick(defs, inst, None)
        req = _only_request(res)
        assert (req.tags[RANGE_START], req.tags[RANGE_END]) == (H[0], H[1])
        cause = "comparing loaded hours' landing files with their commit records failed: OSError: " \
                "landing listing refused: permission denied"
        assert json.loads(res.cursor)["errors"] == [cause]
        assert capfd.readouterr().err.count(cause) == 1  # the tick's log (stderr here)
        again = _tick(defs, inst, res.cursor)  # same cause: not logged again
        assert json.loads(again.cursor)["errors"] == [cause]
        assert cause not in capfd.readouterr().err
        monkeypatch.undo()  # the cause is gone: forgotten, so a recurrence is logged again
        assert json.loads(_tick(defs, inst, again.cursor).cursor)["errors"] == []


def test_a_locked_dataset_is_not_requested_and_the_skip_names_the_holder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer the instance does not see (a CLI run recording elsewhere) holds the lock: the tick
    requests nothing (the run would only fail on the lock) and names the holder; once it is
    released the hours are requested."""
    from dedup_pipeline.engine.core.lock import Lock
    from dedup_pipeline.engine.core.storage import Storage

    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path)
    ds = cfg.datasets[0]
    write_hour(ds, H[0], [_ev(1, 0)])
    _marker(cfg, H[0])
    defs = build_definitions(cfg)
    with dg.instance_for_test() as inst:
        with Lock(Storage(ds.output), owner="dagster run cli-run-1"):
            res = _tick(defs, inst, None)
        assert not res.run_requests, res
        assert f"not loading {H[0]} yet: the dataset is locked by dagster run cli-run-1 (pid " \
            in (res.skip_reason.skip_message or ""), res.skip_reason
        assert _requested_hours(_only_request(_tick(defs, inst, res.cursor))) == (H[0], H[0])
