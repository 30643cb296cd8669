"""Bookkeeping does not grow with history: the records' summary, the request
counter, the benchmark at a small size, and verify's Spark jobs at two history sizes."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.fs_requests import count_requests
from dedup_pipeline.engine.core.commit_log import SUMMARY
from dedup_pipeline.engine.core.commits import commit_path
from dedup_pipeline.engine.core.index.health import check_index
from dedup_pipeline.engine.core.storage import Storage
from dedup_pipeline.engine.load import load_hours
from dedup_pipeline.engine.verify import verify_dataset
from dedup_pipeline_tests.conftest import dataset_config, write_hour

H = [f"2026-11-01-{h:02d}:00" for h in range(12)]


def _ev(key: str, hour: int, minute: int) -> dict:
    return {"event_id": key, "user_id": "u", "url": "/x",
            "event_time": f"2026-11-01T{hour:02d}:{minute:02d}:00Z"}


def test_benchmark_smoke_requests_do_not_grow_with_history(tmp_path: Path) -> None:
    from benchmarks.bookkeeping import report, run

    results = run([24, 200], repeat=1, workdir=tmp_path)
    for n in (24, 200):
        assert results[n]["live_files"] == 24
        assert "healthy" in results[n]["sensor_says"]
    for k in ("load", "sensor"):  # requests through Storage: equal at 200 h and at 24 h
        assert sum(results[200][k][1].values()) == sum(results[24][k][1].values()), k
    # reading every record (what every check did before the summary) grows with history
    assert sum(results[200]["full_check"][1].values()) > sum(results[24]["full_check"][1].values())
    assert "ratio 200/24" in report(results)


def test_check_reads_only_the_records_the_summary_does_not_cover(spark, tmp_path: Path) -> None:
    ds = dataset_config(tmp_path)
    for i in range(4):
        write_hour(ds, H[i], [_ev(f"k{i}-{j}", i, j) for j in range(3)])
    load_hours(spark, ds, H[:3])
    st = Storage(ds.output)
    summary = Path(st.path(SUMMARY))
    older = summary.read_bytes()  # as a crash right before hour 03's summary save would leave it
    load_hours(spark, ds, [H[3]])
    full = check_index(st, ds, full=True)
    with count_requests() as reqs:
        fast = check_index(st, ds)
    assert fast.ok and fast.files == full.files
    assert fast.state is not None and "2026-11-01-03" in fast.state.committed
    # no record read: the summary, the retention state, the damaged marker (none)
    assert reqs["open"] <= 3, reqs
    # a summary older than the records (a crash between record and summary) does not lie
    current = summary.read_bytes()
    summary.write_bytes(older)
    stale = check_index(st, ds)
    assert stale.ok and stale.files == full.files
    assert stale.state is not None and "2026-11-01-03" in stale.state.committed
    summary.write_bytes(current)
    # a record edited in place (same name) is seen by its size and mtime, not trusted
    rec = Path(commit_path(st, "2026-11-01-03"))
    rec.write_text(json.dumps({**json.loads(rec.read_text()), "rows_in": "x"}))
    assert list(check_index(st, ds).bad_records) == ["2026-11-01-03"]
    # a damaged or missing summary is rebuilt from the records: same answer
    Path(st.path(SUMMARY)).write_text("{garbage")
    assert list(check_index(st, ds).bad_records) == ["2026-11-01-03"]
    Path(st.path(SUMMARY)).unlink()
    assert list(check_index(st, ds).bad_records) == ["2026-11-01-03"]


def _verify_jobs(spark, ds, group: str) -> tuple[bool, int]:
    sc = spark.sparkContext
    sc.setJobGroup(group, "verify")
    try:
        rep = verify_dataset(spark, ds)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return rep.ok, len(sc.statusTracker().getJobIdsForGroup(group))


def test_verify_runs_a_bounded_number_of_spark_jobs(spark, tmp_path: Path) -> None:
    """Verify counts landing files in one Spark job per 168 hours, not one or two jobs per hour."""
    small = dataset_config(tmp_path / "small")
    large = dataset_config(tmp_path / "large")
    for ds, n in ((small, 2), (large, 8)):
        for i in range(n):
            write_hour(ds, H[i], [_ev(f"k{i}-{j}", i, j) for j in range(3)] + [_ev("k0-0", i, 59)])
        load_hours(spark, ds, H[:n])
    ok_small, jobs_small = _verify_jobs(spark, small, "verify-small")
    ok_large, jobs_large = _verify_jobs(spark, large, "verify-large")
    assert ok_small and ok_large
    assert jobs_large == jobs_small, (jobs_small, jobs_large)
