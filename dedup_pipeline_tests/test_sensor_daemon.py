"""The landing sensor never gets stuck, under a real `dagster-daemon run` on SQLite and on
PostgreSQL (design.md D2, D4).

The walk: two hours land and load; a file lands late in the first one (the input check records a
failing WARN for it); the hours are reprocessed (the check turns green); another file lands late in
the same hour (failing again: the third evaluation of one check on one partition); then a new hour
lands. Every tick of the landing sensor must succeed or skip, the new hour must load, and the
check's history on that hour must read failed, passed, failed, each from its own run.

A runless evaluation (run_id '') per partition would be refused by Dagster's unique index on
(asset, check, run_id, partition) the second time, and fail every tick from then on.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import TickStatus

from dedup_pipeline.hours import HOUR, format_hour, to_tag
from dedup_pipeline.orchestration.names import PARTITION, RANGE_END, RANGE_START
from dedup_pipeline.orchestration.runs import hours_of_run
from dedup_pipeline_tests.daemon_walk import Walk
from dedup_pipeline_tests.spark_services import (
    REPO,
    VENV_BIN,
    ConnectServer,
    connect_client_env,
    start_connect_server,
)
from dedup_pipeline_tests.test_service import postgres  # noqa: F401 - the PostgreSQL fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """One warm Spark Connect server whose clients are every run of both walks (the recommended
    topology): no Spark start-up per run."""
    server = start_connect_server(tmp_path_factory.mktemp("spark_server"), master="local[1]")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def walk(request: pytest.FixtureRequest, tmp_path: Path, spark_server: ConnectServer
         ) -> Iterator[Walk]:
    pg = request.getfixturevalue("postgres") if request.param == "postgres" else None
    if pg is not None:  # a fresh database per walk: the module's server, a new DB
        import psycopg2

        db = f"walk_{tmp_path.name.lower().replace('-', '_')[-40:]}"
        conn = psycopg2.connect(host=pg["DAGSTER_PG_HOST"], port=pg["DAGSTER_PG_PORT"],
                                user=pg["DAGSTER_PG_USER"], password=pg["DAGSTER_PG_PASSWORD"],
                                dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {db}")
        conn.close()
        pg = {**pg, "DAGSTER_PG_DB": db}
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    w = Walk(tmp_path, start_hour=now - 3 * HOUR, pg=pg, check_every=5)  # a short walk
    w.env = connect_client_env(w.env, spark_server.url)
    try:
        yield w
    finally:
        w.stop()


def _reprocess(w: Walk, first: str, last: str) -> None:
    """What an operator does from the CLI: reload first..last in one run (recorded in the same
    instance, so the sensor waits for it)."""
    r = subprocess.run([str(VENV_BIN / "dedup-pipeline"), "run", "--config", str(w.config),
                        "--from", first, "--to", last], env=w.env, cwd=REPO, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_late_file_reported_reprocessed_and_reported_again_then_new_hours_load(walk: Walk) -> None:
    w = walk
    h0, h1, h2 = (w.start_hour + i * HOUR for i in range(3))
    k0, k1, k2 = (format_hour(h) for h in (h0, h1, h2))
    w.land(h0, ["a", "b", "a"])
    w.land(h1, ["c", "b"])
    w.start_daemon()
    with w.instance() as inst:
        def loads_done(n: int) -> list[dg.DagsterRun] | None:
            done = w.finished(w.load_runs(inst))
            return done if len(done) >= n else None

        [first] = w.wait("the first load", lambda: loads_done(1))
        assert first.status == dg.DagsterRunStatus.SUCCESS
        assert (first.tags[RANGE_START], first.tags[RANGE_END]) == (k0, k1)

        def checks_done(state: str, n: int) -> list[dg.DagsterRun] | None:
            done = w.finished(w.check_runs(inst, state))
            return done if len(done) >= n else None

        # 1. a late file in hour 0: reported (failing WARN), by a run of the check's job
        w.land(h0, ["d"], name="part-late-1.jsonl")
        [c1] = w.wait("the check run of the late file", lambda: checks_done("changed", 1))
        assert c1.status == dg.DagsterRunStatus.SUCCESS
        # 2. reprocessed from the CLI: the check turns green, by another run
        _reprocess(w, k0, k1)
        [c2] = w.wait("the check run after reprocessing", lambda: checks_done("reprocessed", 1))
        assert c2.status == dg.DagsterRunStatus.SUCCESS
        # 3. another late file in the same hour: reported again (the third evaluation of hour 0)
        w.land(h0, ["e"], name="part-late-2.jsonl")
        w.wait("the check run of the second late file", lambda: checks_done("changed", 2))
        # 4. a new hour lands: it loads
        w.land(h2, ["f", "a"])
        w.wait("the load of the new hour", lambda: to_tag(h2) in w.committed()
               and loads_done(2))
        runs = w.load_runs(inst)
        # hours 0..1 in one ranged run; hour 2 alone, a single-partition run
        assert [(hours_of_run(r), r.status) for r in runs] == [
            (f"{k0}..{k1}", dg.DagsterRunStatus.SUCCESS), (k2, dg.DagsterRunStatus.SUCCESS)]
        assert runs[1].tags[PARTITION] == k2 and RANGE_START not in runs[1].tags

        history = w.check_history(inst, k0)
        assert [s for _, s in history] == ["FAILED", "SUCCEEDED", "FAILED"], history
        assert len({r for r, _ in history}) == 3 and "" not in {r for r, _ in history}
        assert w.check_history(inst, k1) == []  # unchanged hours are not touched

        ticks = w.ticks(inst)  # newest first
        if ticks and ticks[0].status == TickStatus.STARTED:  # the tick running as we read
            ticks = ticks[1:]
        assert not w.failed_ticks(inst), [t.error for t in w.failed_ticks(inst)][:3]
        assert {t.status for t in ticks} <= {TickStatus.SKIPPED, TickStatus.SUCCESS}
        assert all(t.skip_reason for t in ticks if t.status == TickStatus.SKIPPED)
        assert not w.log_errors(), w.log_errors()[:10]
        print(f"{len(ticks)} landing-sensor ticks, none failed; check history of {k0}: {history}")
